"""`edge-infer bench transformers media MODEL`: the media arm on transformers' Qwen2.5-Omni thinker, same workload.

`Qwen2_5OmniThinkerForConditionalGeneration` in eager PyTorch (no torch.compile) with transformers' default
attention implementation unless `--attn-implementation` names one (the result says which ran), in `--dtype`,
on `--threads` threads. The requests, warm-up and arithmetic are `harness/media_bench.py`'s, so it prints the keys
`edge-infer bench media` prints. Per request, from the same PNG and WAV bytes:

- prepare: the image decoded by Pillow and featurized by `Qwen2VLImageProcessorPil`, the WAV read by soundfile and
  featurized by `WhisperFeatureExtractor` as `Qwen2_5OmniProcessor` calls it (padded to the extractor's 300 s, with
  the mask of the real frames); the prompt rendered by the checkpoint's chat template and each placeholder
  repeated once per embedding row, as the processor does (its video processor needs torchvision, so the processor
  itself is not used);
- then `generate` (greedy, exactly `tg` tokens) with a streamer that stamps each token: TTFT is the first
  generated token after submission; `encode_ms` is the time inside the vision and audio towers' forward passes.

Memory is this process's RssAnon (transformers runs in-process), sampled; there is no plan. Loading a checkpoint
whose weights in `--dtype` exceed the memory available is refused before anything is loaded (a failed pass with
the reason, not the kernel's OOM killer on a shared host).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.harness import media_bench
from edge_infer.bench.harness.arm_output import run_arm
from edge_infer.bench.harness.clock import process_age_s
from edge_infer.bench.harness.provenance import now_utc

ARCHITECTURE = "Qwen2_5OmniThinkerForConditionalGeneration"
DTYPES = ("float32", "bfloat16")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="transformers_action", metavar="ACTION", required=True)
    p = sub.add_parser("media", help="encode time, TTFT and decode rate after an image, audio, both (one JSON line, a grid arm)")
    p.add_argument("model", type=Path, help=f"{ARCHITECTURE} checkpoint directory (edge-infer synth --family qwen2_5_omni)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="weights and activations (default float32)")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: the cores this process may use)")
    p.add_argument("--attn-implementation", default=None, help="eager, sdpa, ... (default: transformers' own choice)")
    media_bench.add_media_args(p)
    p.add_argument("--tag", default=None, help="label stored with the result")
    p.add_argument("--out", type=Path, metavar="FILE", help="also write the result JSON here")


def weights_fit(model_dir: Path, dtype_bytes: int) -> None:
    """Refuse a model whose weights alone, in the chosen dtype, exceed the memory this process may still claim."""
    import math

    from edge_infer.hardware.memory import available_memory_bytes
    from edge_infer.models.checkpoint import read_tensor_index

    need = sum(math.prod(t.shape) for t in read_tensor_index(model_dir).values()) * dtype_bytes
    available = available_memory_bytes()
    if need > available:
        raise RuntimeError(f"the weights need {need / (1 << 20):,.0f} MiB in this dtype and only "
                           f"{available / (1 << 20):,.0f} MiB are available; refused before loading")


class _TokenClock:
    """A generate() streamer that stamps each generated token (its first put() is the prompt)."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.stamps: list[float] = []

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.stamps.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass


class _TowerClock:
    """Seconds spent inside the towers' forward passes (forward hooks on each tower)."""

    def __init__(self, towers: list[Any]) -> None:
        self.seconds = 0.0
        self._began = 0.0
        for tower in towers:
            tower.register_forward_pre_hook(self._enter)
            tower.register_forward_hook(self._leave)

    def _enter(self, *_: Any) -> None:
        self._began = time.perf_counter()

    def _leave(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._began


class OmniThinker:
    """transformers' thinker with its processors, one media request at a time."""

    def __init__(self, model_dir: Path, dtype: str, attn_implementation: str | None):
        import torch
        import transformers
        from transformers import AutoTokenizer, WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.torch = torch
        options = {"attn_implementation": attn_implementation} if attn_implementation else {}
        self.model = transformers.Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
            model_dir, dtype=getattr(torch, dtype), **options).eval()
        self.images = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
        self.audio = WhisperFeatureExtractor.from_pretrained(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        cfg = self.model.config
        self.placeholders = {kind: self.tokenizer.convert_ids_to_tokens(token_id) for kind, token_id in
                             (("image", cfg.image_token_index), ("audio", cfg.audio_token_index))}
        self.towers = _TowerClock([self.model.model.visual, self.model.model.audio_tower])

    def chat(self, req: media_bench.MediaRequest) -> media_bench.Sample:
        torch = self.torch
        submitted = time.perf_counter()
        inputs, rows = {}, {}
        if req.image is not None:
            from PIL import Image

            image = Image.open(io.BytesIO(req.image)).convert("RGB")
            pixels = self.images(images=image, return_tensors="pt")
            inputs.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
            rows["image"] = int(pixels["image_grid_thw"][0].prod()) // self.images.merge_size**2
        if req.audio is not None:
            import soundfile
            from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

            samples, rate = soundfile.read(io.BytesIO(req.audio), dtype="float32")
            mel = self.audio(samples, sampling_rate=rate, padding="max_length", return_attention_mask=True,
                             return_tensors="pt")
            inputs.update(input_features=mel["input_features"], feature_attention_mask=mel["attention_mask"])
            rows["audio"] = int(_get_feat_extract_output_lengths(mel["attention_mask"].sum(-1))[0])
        text = self.tokenizer.apply_chat_template(req.template_messages(), tokenize=False, add_generation_prompt=True)
        for kind, n in rows.items():
            text = text.replace(self.placeholders[kind], self.placeholders[kind] * n, 1)
        ids = self.tokenizer(text, return_tensors="pt")
        prepared = time.perf_counter()
        clock, self.towers.seconds = _TokenClock(), 0.0
        with torch.inference_mode():
            out = self.model.generate(**ids, **inputs, max_new_tokens=req.tg, min_new_tokens=req.tg, do_sample=False,
                                      streamer=clock, pad_token_id=self.tokenizer.pad_token_id)
        prompt = ids["input_ids"][0].tolist()
        return media_bench.Sample(
            prepare_s=prepared - submitted, encode_s=self.towers.seconds, ttft_s=clock.stamps[0] - submitted,
            last_token_s=clock.stamps[-1] - submitted, tokens=int(out.shape[1]) - len(prompt), prompt_token_ids=prompt)


def measure(args: argparse.Namespace, s: media_bench.MediaBenchSettings) -> dict[str, Any]:
    import json

    from edge_infer.memory.measure import PeakSampler, tree_rss_file_bytes

    architecture = json.loads((args.model / "config.json").read_text()).get("architectures", [None])[0]
    if architecture != ARCHITECTURE:
        raise ValueError(f"{args.model} is a {architecture}; bench transformers media runs {ARCHITECTURE} checkpoints")
    threads = args.threads or len(os.sched_getaffinity(0))
    weights_fit(args.model, {"float32": 4, "bfloat16": 2}[args.dtype])
    sampler = PeakSampler(interval_s=s.sample_interval).start()
    try:
        import torch

        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        thinker = OmniThinker(args.model, args.dtype, args.attn_implementation)
        init_s, ready_s = time.perf_counter() - t0, process_age_s()
        sampler.mark("after_load")
        metrics, requests = media_bench.measure(thinker.chat, s)
        file_backed = tree_rss_file_bytes()
    finally:
        sampler.stop()
    model = thinker.model
    return {
        **media_bench.run_figures(metrics, requests, sampler, init_s, ready_s, file_backed),
        "engine": "transformers",
        "model": str(args.model),
        "requests": requests,
        "loaded": {
            "architecture": type(model).__name__,
            "dtype": str(model.dtype).removeprefix("torch."),
            "attn_implementation": model.config._attn_implementation,
            "execution": "eager (no torch.compile)",
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "num_threads": torch.get_num_threads(),
            "image_processor": type(thinker.images).__name__,
            "feature_extractor": type(thinker.audio).__name__,
        },
        "settings": {"dtype": args.dtype, "threads": threads, "attn_implementation": args.attn_implementation,
                     "media": media_bench.describe(s)},
        "notes": [
            f"peaks are sampled every {s.sample_interval:g} s and are lower bounds; memory is RssAnon of this process "
            "(transformers runs in it); *_mb figures are MiB",
            "ttft_ms runs from the request's bytes: decode, featurize and build the prompt (prepare_ms), then generate "
            "to its first token; encode_ms is the time inside the towers' forward passes",
        ],
    }


def run(args: argparse.Namespace) -> int:
    started_at = now_utc()
    try:
        s = media_bench.settings_from(args)
    except ValueError as exc:
        print(f"edge-infer bench transformers media: {exc}", file=sys.stderr)
        return 2
    return run_arm("transformers media", lambda: measure(args, s), args.tag, started_at, args.out)
