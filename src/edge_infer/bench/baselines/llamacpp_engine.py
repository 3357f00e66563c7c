"""llama.cpp through `llama-cpp-python`: quantize a GGUF, load it, greedy-generate from token ids.

Generation is driven token by token on the low-level context (decode, then
the argmax of the last position's logits), not through `Llama.generate`,
which reuses a matching prefix of the previous call: every call here starts
from an empty context, as edge-infer's do (no prefix cache on either side).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_infer.bench.harness.llama_bench import Timed

# llama.cpp's quantization file types (llama_ftype) by their usual names.
QUANT_TYPES = {"Q8_0": 7, "Q4_K_M": 15, "Q4_0": 2}  # llama_ftype values
BASELINE_HINT = (
    "install the baseline extra (pip install -e '.[baseline]'; it compiles llama.cpp: "
    "the CMAKE_ARGS .ci/run uses build it for this CPU without its AMX kernels)"
)


def llama_cpp_module() -> Any:
    import faulthandler

    # A llama.cpp compiled for another CPU (GGML_NATIVE, then a wheel cached or copied) dies of SIGILL in its
    # kernels: the fault handler names the signal and the Python frame it came from on stderr.
    faulthandler.enable()
    try:
        import llama_cpp
    except ImportError as exc:
        raise ImportError(f"llama-cpp-python is not importable ({exc}); {BASELINE_HINT}") from exc
    return llama_cpp


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> Path:
    """Quantize a GGUF with llama.cpp's own quantizer (what `llama-quantize` runs)."""
    lc = llama_cpp_module()
    if qtype not in QUANT_TYPES:
        raise ValueError(f"quantization type {qtype!r} is not offered; choose one of {', '.join(QUANT_TYPES)}")
    params = lc.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[qtype]
    params.nthread = threads
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    code = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if code != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not quantize {src} to {qtype} (llama_model_quantize returned {code})")
    tmp.replace(dst)
    return dst


def decode_read_bytes(gguf_path: Path) -> int:
    """Weight bytes one decode step reads from this GGUF: every tensor, except
    that a token-embedding table the output head does not share gives one row."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(gguf_path).tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    embed = tensors.get("token_embd.weight")
    if embed is not None and "output.weight" in tensors:
        rows = int(embed.shape[-1])  # GGUF lists dimensions innermost first
        total -= int(embed.n_bytes) - int(embed.n_bytes) // rows
    return total


@dataclass(frozen=True)
class LlamaCppSettings:
    n_ctx: int
    n_batch: int
    n_threads: int
    flash_attn: bool = False
    use_mmap: bool = True  # llama-bench's default: weights stay in the page cache (RssFile)
    # llama.cpp's default KV cache is f16; an f32 one makes an f32 GGUF compute in f32 throughout.
    kv_type: str = "f16"


class LlamaCppModel:
    def __init__(self, path: Path, s: LlamaCppSettings):
        lc = llama_cpp_module()
        self._lc = lc
        self.path = path
        self.settings = s
        kv = {"f16": lc.GGML_TYPE_F16, "f32": lc.GGML_TYPE_F32}[s.kv_type]
        self.llm = lc.Llama(
            model_path=str(path), n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_batch,
            n_threads=s.n_threads, n_threads_batch=s.n_threads, flash_attn=s.flash_attn,
            use_mmap=s.use_mmap, type_k=kv, type_v=kv, logits_all=False, n_gpu_layers=0, verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()

    def greedy(self, ids: list[int], n: int, token_times: list[float] | None = None) -> list[int]:
        """Process `ids` from an empty context, then produce `n` tokens greedily (appending each one's
        perf_counter time to ``token_times`` when given)."""
        import numpy as np

        self.llm.reset()
        out: list[int] = []
        feed = list(ids)
        while True:
            self.llm.eval(feed)
            logits = np.ctypeslib.as_array(self._lc.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
            out.append(int(logits.argmax()))
            if token_times is not None:
                token_times.append(time.perf_counter())
            if len(out) == n:
                return out
            feed = out[-1:]

    def first_token(self, ids: list[int], reuse_prefix: bool) -> tuple[int, int]:
        """The greedy token after ``ids`` and how many of them the context already held: with ``reuse_prefix``
        the longest common prefix with the last call stays (what llama.cpp's server does with cache_prompt),
        else the context starts empty."""
        import numpy as np

        keep = 0
        if reuse_prefix:
            held = self.llm.input_ids[: self.llm.n_tokens]
            limit = min(len(held), len(ids) - 1)  # the last prompt token is always evaluated: its logits are needed
            while keep < limit and held[keep] == ids[keep]:
                keep += 1
        self.llm.n_tokens = keep  # eval drops the KV past n_tokens
        self.llm.eval(ids[keep:])
        logits = np.ctypeslib.as_array(self._lc.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(logits.argmax()), keep

    def timed_generate(self, ids: list[int], n: int) -> Timed:
        start = time.perf_counter()
        times: list[float] = []
        self.greedy(ids, n, times)
        return Timed(times[-1] - start, times[-1] - times[0])

    def loaded(self) -> dict[str, Any]:
        """What llama.cpp reports it loaded, to confirm the arm ran the file type it claims."""
        lc, model = self._lc, self.llm.model
        buf = bytes(256)
        lc.llama_model_desc(model, buf, len(buf))
        file_type = self.llm.metadata.get("general.file_type")
        name = lc.llama_ftype_name(int(file_type)) if file_type is not None else None
        return {
            "description": buf.split(b"\0", 1)[0].decode(errors="replace"),
            "file_type": None if name is None else name.decode(),
            "model_bytes": int(lc.llama_model_size(model)),
            "n_params": int(lc.llama_model_n_params(model)),
            "n_threads": int(lc.llama_n_threads(self.llm.ctx)),
            "n_threads_batch": int(lc.llama_n_threads_batch(self.llm.ctx)),
            "n_ctx": int(self.llm.n_ctx()),
            "n_batch": self.settings.n_batch,
            "flash_attn": self.settings.flash_attn,
            "use_mmap": self.settings.use_mmap,
            "kv_cache_type": self.settings.kv_type,
            "system_info": lc.llama_print_system_info().decode(errors="replace").strip(),
        }

    def close(self) -> None:
        self.llm.close()
