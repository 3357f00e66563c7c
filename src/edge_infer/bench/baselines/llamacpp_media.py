"""`edge-infer bench llamacpp media TEXT.gguf --mmproj MMPROJ.gguf --tokenizer MODEL`: the media arm on llama.cpp.

llama.cpp's multimodal path (libmtmd, through llama-cpp-python's `mtmd_cpp` bindings) with the thinker's text
model as one GGUF and its towers as an "mmproj" GGUF (both written by llama.cpp's own converter, see
benchmarks/README.md), on `--threads` threads. The requests, warm-up and arithmetic are `harness/media_bench.py`'s,
so it prints the keys `edge-infer bench media` prints. Per request, from the same PNG and WAV bytes:

- prepare: the media decoded by libmtmd's helper (stb_image, miniaudio) and the prompt rendered by the
  checkpoint's chat template, each media item's start marker, placeholder and end marker replaced by libmtmd's
  media marker (libmtmd adds its own markers and the embedding rows), then tokenized by libmtmd;
- then the chunks in order: text decoded by llama.cpp, each image or audio clip encoded by libmtmd
  (`encode_ms`) and its embeddings decoded; then `tg` tokens, each the argmax of the last position's logits.

libmtmd preprocesses media its own way (an audio clip padded to whole 30 s windows), so the prompt it runs need not
have edge-infer's length: the result records each prompt's tokens. Memory is this process's RssAnon (llama.cpp
runs in it), sampled; weights are memory-mapped (RssFile). Needs a llama-cpp-python built with libmtmd
(`-DLLAVA_BUILD=ON`), which the `baseline` extra as `.ci/run` builds it is not.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.harness import media_bench
from edge_infer.bench.harness.clock import process_age_s

# A media item in the chat template's output (edge-infer synth's Qwen2.5-Omni template): start, placeholder, end.
MEDIA_SPANS = ("<|vision_bos|><|IMAGE|><|vision_eos|>", "<|audio_bos|><|AUDIO|><|audio_eos|>")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("gguf", type=Path, help="the thinker's text model as GGUF (llama.cpp's converter, then quantized)")
    p.add_argument("--mmproj", type=Path, required=True, help="the towers as llama.cpp's mmproj GGUF")
    p.add_argument("--tokenizer", type=Path, required=True, help="the checkpoint directory (its chat template)")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: the cores this process may use)")
    media_bench.add_media_args(p)
    p.add_argument("--tag", default=None, help="label stored with the result")
    p.add_argument("--out", type=Path, metavar="FILE", help="also write the result JSON here")


def with_media_markers(text: str, marker: str) -> str:
    """The rendered prompt with each media item (start marker, placeholder, end marker) as libmtmd's one marker."""
    for span in MEDIA_SPANS:
        text = text.replace(span, marker)
    return text


class MtmdThinker:
    """llama.cpp's text model with libmtmd's towers, one media request at a time, each from an empty context."""

    def __init__(self, gguf: Path, mmproj: Path, tokenizer_dir: Path, threads: int):
        from transformers import AutoTokenizer

        from edge_infer.bench.baselines.llamacpp_engine import LlamaCppModel, LlamaCppSettings, llama_cpp_module

        self.lc = llama_cpp_module()
        try:
            import llama_cpp.mtmd_cpp as mtmd
        except (ImportError, OSError) as exc:
            raise ImportError(f"llama-cpp-python was built without libmtmd ({exc}): build it with -DLLAVA_BUILD=ON") from exc
        self.mtmd = mtmd
        self.model = LlamaCppModel(gguf, LlamaCppSettings(n_ctx=4096, n_batch=512, n_threads=threads))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings = False, threads, False
        self.ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), self.model.llm.model, params)
        if not self.ctx:
            raise RuntimeError(f"libmtmd could not load {mmproj} for {gguf}")
        self.marker = mtmd.mtmd_default_marker().decode()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def _chunks(self, req: media_bench.MediaRequest) -> Any:
        mtmd = self.mtmd
        bitmaps = []
        try:
            for data in (req.image, req.audio):
                if data is not None:
                    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
                    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
                    if not bitmap:
                        raise RuntimeError("libmtmd could not decode the request's media")
                    bitmaps.append(bitmap)
            text = self.tokenizer.apply_chat_template(req.template_messages(), tokenize=False, add_generation_prompt=True)
            encoded = with_media_markers(text, self.marker).encode()
            prompt = mtmd.mtmd_input_text()
            prompt.text, prompt.text_len, prompt.add_special, prompt.parse_special = encoded, len(encoded), False, True
            chunks = mtmd.mtmd_input_chunks_init()
            code = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(prompt),
                                      (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps), len(bitmaps))
            if code != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                raise RuntimeError(f"libmtmd could not tokenize the prompt (mtmd_tokenize returned {code})")
            return chunks
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _run_prompt(self, chunks: Any) -> tuple[float, list[int]]:
        """Decode the prompt's chunks in order: (seconds in the towers, the prompt's ids with each media row as the
        id ``n_vocab``, which no token has)."""
        mtmd, llm = self.mtmd, self.model.llm
        llm.reset()
        llm._ctx.kv_cache_clear()  # a prompt may open with media, which does not go through Llama.eval's clearing
        encode_s, ids = 0.0, []
        no_callback = ctypes.cast(None, mtmd.mtmd_helper_post_decode_callback)
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                text_ids = [tokens[j] for j in range(n.value)]
                llm.eval(text_ids)
                ids += text_ids
                continue
            began = time.perf_counter()
            if mtmd.mtmd_encode_chunk(self.ctx, chunk) != 0:
                raise RuntimeError("libmtmd could not encode a media chunk")
            encode_s += time.perf_counter() - began
            n_past = self.lc.llama_pos(0)
            if mtmd.mtmd_helper_decode_image_chunk(self.ctx, llm.ctx, chunk, mtmd.mtmd_get_output_embd(self.ctx),
                                                   llm.n_tokens, 0, llm.n_batch, ctypes.byref(n_past), no_callback,
                                                   None) != 0:
                raise RuntimeError("llama.cpp could not decode a media chunk's embeddings")
            llm.n_tokens = n_past.value  # positions (M-RoPE: fewer than the rows)
            ids += [self.model.n_vocab] * mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        return encode_s, ids

    def chat(self, req: media_bench.MediaRequest) -> media_bench.Sample:
        import numpy as np

        submitted = time.perf_counter()
        chunks = self._chunks(req)
        prepared = time.perf_counter()
        try:
            encode_s, ids = self._run_prompt(chunks)
        finally:
            self.mtmd.mtmd_input_chunks_free(chunks)
        llm, stamps, out = self.model.llm, [], []
        while True:
            logits = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(llm.ctx, -1), shape=(self.model.n_vocab,))
            out.append(int(logits.argmax()))
            stamps.append(time.perf_counter())
            if len(out) == req.tg:
                break
            llm.eval(out[-1:])
        return media_bench.Sample(prepare_s=prepared - submitted, encode_s=encode_s, ttft_s=stamps[0] - submitted,
                                  last_token_s=stamps[-1] - submitted, tokens=len(out), prompt_token_ids=ids)

    def close(self) -> None:
        self.mtmd.mtmd_free(self.ctx)
        self.model.close()


def measure(args: argparse.Namespace, s: media_bench.MediaBenchSettings) -> dict[str, Any]:
    from edge_infer.memory.measure import PeakSampler, tree_rss_file_bytes

    threads = args.threads or len(os.sched_getaffinity(0))
    sampler = PeakSampler(interval_s=s.sample_interval).start()
    try:
        t0 = time.perf_counter()
        thinker = MtmdThinker(args.gguf, args.mmproj, args.tokenizer, threads)
        init_s, ready_s = time.perf_counter() - t0, process_age_s()
        sampler.mark("after_load")
        try:
            metrics, requests = media_bench.measure(thinker.chat, s)
            file_backed = tree_rss_file_bytes()
            loaded = thinker.model.loaded()
        finally:
            thinker.close()
    finally:
        sampler.stop()
    return {
        **media_bench.run_figures(metrics, requests, sampler, init_s, ready_s, file_backed),
        "engine": "llama.cpp (libmtmd)",
        "model": str(args.gguf),
        "requests": requests,
        "loaded": {**loaded, "mmproj": str(args.mmproj), "mmproj_bytes": args.mmproj.stat().st_size},
        "settings": {"threads": threads, "media": media_bench.describe(s)},
        "notes": [
            f"peaks are sampled every {s.sample_interval:g} s and are lower bounds; memory is RssAnon of this process "
            "(llama.cpp runs in it; weights are memory-mapped, RssFile); *_mb figures are MiB",
            "ttft_ms runs from the request's bytes: decode the media and tokenize (prepare_ms), then the prompt's chunks "
            "to the first token; encode_ms is the time in libmtmd's towers; the prompt digests count each media row as the id n_vocab",
        ],
    }
