"""Export a Llama / Qwen2 / Qwen3 / Mistral checkpoint to GGUF with the `gguf` library.

The same weights edge-infer loads, renamed to llama.cpp's tensor names, with
the hyperparameters and the tokenizer as metadata, so that a comparison
with llama.cpp runs one checkpoint on two engines.

Two layout differences matter:
- Llama and Mistral map to llama.cpp's `llama` architecture, whose RoPE
  rotates adjacent pairs of each head, while Hugging Face checkpoints
  rotate the two halves. The q and k projection rows are reordered per head
  (row i of the first half and row i of the second half become rows 2i and
  2i+1). Qwen2/Qwen3 use the half-split form in llama.cpp too; no change.
- Llama-3 RoPE scaling becomes llama.cpp's `rope_freqs` tensor: per
  frequency, the factor the position angle is divided by.

Tensors are streamed one at a time (headers first, then data), so the
export never holds more than one tensor in memory. Matrices are written in
the requested type (bf16 by default); norms and biases stay f32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.bench.baselines.gguf_vocab import read_vocab, write_vocab
from edge_infer.errors import CheckpointError
from edge_infer.models.config import ModelConfig

if TYPE_CHECKING:
    import numpy as np
    import torch

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
# Families whose q/k rows are reordered from half-split to adjacent-pair RoPE.
PAIRWISE_ROPE = {"llama", "mistral"}
OUTTYPES = ("bf16", "f16", "f32")

# Hugging Face layer suffix -> gguf.MODEL_TENSOR member name.
_LAYER_TENSORS = {
    "input_layernorm": "ATTN_NORM",
    "self_attn.q_proj": "ATTN_Q",
    "self_attn.k_proj": "ATTN_K",
    "self_attn.v_proj": "ATTN_V",
    "self_attn.o_proj": "ATTN_OUT",
    "self_attn.q_norm": "ATTN_Q_NORM",
    "self_attn.k_norm": "ATTN_K_NORM",
    "post_attention_layernorm": "FFN_NORM",
    "mlp.gate_proj": "FFN_GATE",
    "mlp.up_proj": "FFN_UP",
    "mlp.down_proj": "FFN_DOWN",
}
_GLOBAL_TENSORS = {"model.embed_tokens": "TOKEN_EMBD", "model.norm": "OUTPUT_NORM", "lm_head": "OUTPUT"}


@dataclass(frozen=True)
class TensorJob:
    source: str  # checkpoint tensor name
    target: str  # GGUF tensor name
    shape: tuple[int, ...]
    pair_heads: int | None  # heads to reorder for pairwise RoPE (q: heads, k: kv heads), else None


@dataclass(frozen=True)
class ExportResult:
    path: Path
    arch: str
    outtype: str
    n_tensors: int
    bytes_written: int


def gguf_name(source: str, n_layers: int) -> str | None:
    """llama.cpp's name for a checkpoint tensor; None for tensors llama.cpp does not take."""
    import gguf

    stem, _, kind = source.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if stem in _GLOBAL_TENSORS:
        return f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[_GLOBAL_TENSORS[stem]]]}.{kind}"
    parts = stem.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) < n_layers:
        member = _LAYER_TENSORS.get(parts[3])
        if member is not None:
            return f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[member]].format(bid=int(parts[2]))}.{kind}"
    return None


def plan_tensors(cfg: ModelConfig, index: dict[str, Any]) -> list[TensorJob]:
    """Every checkpoint tensor llama.cpp needs, renamed; unknown tensors are an error (never dropped silently)."""
    jobs = []
    unknown = []
    for source in sorted(index):
        if source == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: llama.cpp reuses token_embd when output is absent
        if source.endswith("rotary_emb.inv_freq"):
            continue  # a cached RoPE table some checkpoints carry; llama.cpp computes its own
        target = gguf_name(source, cfg.num_hidden_layers)
        if target is None:
            unknown.append(source)
            continue
        pair_heads = None
        if cfg.family in PAIRWISE_ROPE:
            if ".self_attn.q_proj." in source:
                pair_heads = cfg.num_attention_heads
            elif ".self_attn.k_proj." in source:
                pair_heads = cfg.num_key_value_heads
        jobs.append(TensorJob(source, target, tuple(index[source].shape), pair_heads))
    if unknown:
        raise CheckpointError(f"GGUF export does not know where to put {', '.join(unknown[:5])}; nothing was written")
    return jobs


def pairwise_rope_rows(t: "torch.Tensor", heads: int) -> "torch.Tensor":
    """Reorder each head's rows from half-split to adjacent pairs: new[2i + k] = old[k * d/2 + i]."""
    rows = t.shape[0]
    d = rows // heads
    return t.reshape(heads, 2, d // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape).contiguous()


def llama3_rope_factors(cfg: ModelConfig) -> "np.ndarray":
    """Per-frequency divisors of the RoPE angle equivalent to Llama-3 scaling (llama.cpp's rope_freqs)."""
    import numpy as np

    s = cfg.rope_scaling
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    factors = []
    for i in range(0, cfg.head_dim, 2):
        wavelen = 2 * math.pi * cfg.rope_theta ** (i / cfg.head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
            factors.append(1.0 / ((1 - smooth) / s.factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _storage(ndim: int, outtype: str) -> str:
    """How a tensor is stored: matrices in the requested type, 1-D tensors (norms, biases) in f32."""
    return "f32" if ndim == 1 else outtype


def _as_numpy(t: "torch.Tensor", storage: str) -> "np.ndarray":
    import numpy as np
    import torch

    if storage == "f32":
        return t.to(torch.float32).numpy()
    if storage == "f16":
        return t.to(torch.float16).numpy()
    # numpy has no bfloat16: the raw 16-bit patterns, tagged BF16 in the tensor header.
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def write_hparams(writer: Any, cfg: ModelConfig, name: str, outtype: str) -> None:
    import gguf

    file_type = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16, "f32": gguf.LlamaFileType.ALL_F32}
    writer.add_name(name)
    writer.add_file_type(file_type[outtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def export_gguf(model_dir: str | Path, out: str | Path, outtype: str = "bf16") -> ExportResult:
    """Write `out` (a .gguf file) from the checkpoint in `model_dir`."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    from edge_infer.models.checkpoint import check_checkpoint
    from edge_infer.models.weights import weight_specs

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not supported; use one of {', '.join(OUTTYPES)}")
    model_dir, out = Path(model_dir), Path(out)
    cfg = ModelConfig.from_dir(model_dir)
    if cfg.sliding_window is not None and cfg.sliding_window < cfg.max_position_embeddings:
        raise CheckpointError(
            f"{model_dir}: sliding_window={cfg.sliding_window} cannot be exported: llama.cpp's {GGUF_ARCH[cfg.family]} "
            "architecture attends to the full context, so the GGUF would compute something else beyond the window"
        )
    if cfg.quantization_config is not None:
        raise CheckpointError(f"{model_dir} holds quantized weights; export the unquantized checkpoint and quantize the GGUF")
    index = check_checkpoint(cfg, model_dir, weight_specs(cfg))  # every tensor edge-infer loads is there
    jobs = plan_tensors(cfg, index)
    vocab = read_vocab(model_dir, cfg)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(str(tmp), GGUF_ARCH[cfg.family])
    try:
        write_hparams(writer, cfg, model_dir.name, outtype)
        write_vocab(writer, vocab)
        extra: list[tuple[str, Any]] = []
        if cfg.rope_scaling is not None:
            extra.append((f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS]}.weight", llama3_rope_factors(cfg)))
        # Pass 1: tensor headers (shape and type) from the safetensors headers alone.
        numpy_dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
        for job in jobs:
            storage = _storage(len(job.shape), outtype)
            dtype = np.dtype(numpy_dtype[storage])
            raw = gguf.GGMLQuantizationType.BF16 if storage == "bf16" else None
            writer.add_tensor_info(job.target, job.shape, dtype, math.prod(job.shape) * dtype.itemsize, raw_dtype=raw)
        for name, array in extra:
            writer.add_tensor_info(name, array.shape, array.dtype, array.nbytes)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        # Pass 2: the data, one tensor at a time, in the same order.
        handles: dict[Path, Any] = {}
        written = 0
        for job in jobs:
            file = index[job.source].file
            if file not in handles:
                handles[file] = safe_open(str(file), framework="pt")
            t = handles[file].get_tensor(job.source)
            if job.pair_heads is not None:
                t = pairwise_rope_rows(t, job.pair_heads)
            array = _as_numpy(t, _storage(t.ndim, outtype))
            writer.write_tensor_data(array)
            written += array.nbytes
        for _, array in extra:
            writer.write_tensor_data(array)
            written += array.nbytes
        writer.close()
        tmp.replace(out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return ExportResult(out, GGUF_ARCH[cfg.family], outtype, len(jobs) + len(extra), written)
