"""One media encode's memory, measured in a fresh process: what the plan's encoder activation item bounds.

    python -m edge_infer.memory.encoder_probe (--checkpoint DIR | --config JSON) --dtype bfloat16 \
        (--image-grid T H W | --audio-frames F) [--threads N]

prints one JSON object: the tower's resident weight bytes and the RssAnon an encode
adds on top of its weights and input (``peak_bytes``), by two measures:

- ``sampled_peak_bytes``: RssAnon polled every millisecond (a lower bound);
- ``hwm_peak_bytes``: the kernel's resident high-water mark (VmHWM, reset through
  /proc/self/clear_refs just before the encode) minus the file and shared pages,
  read after it (they only grow during an encode: library code paged in), so also
  a lower bound on the anonymous peak, but one no short-lived tensor escapes.

``peak_bytes`` is the larger. The encode is the process's first (cold: oneDNN
primitives and thread scratch are created in it), as a worker's first image is.
The towers come from a checkpoint (``models.encoders.load_encoders``) or, for
shapes no checkpoint is at hand for, from a config.json with random weights
(``--config``: a whole model's config or ``{"vision_config": ..., "audio_config": ...}``).
scripts/measure_overhead.py calibrates memory/overhead.json with it; the tests
check the plan against it.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from edge_infer.memory.measure import PeakSampler, malloc_trim, pin_mmap_threshold, rss_anon_bytes

SAMPLE_INTERVAL_S = 0.001


def _status_bytes(*keys: str) -> int:
    total = 0
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in keys:
                total += int(value.split()[0]) * 1024
    return total


def reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def random_towers(config: dict[str, Any], dtype: "Any", backend: str) -> tuple[Any, Any]:
    """Both towers of ``config`` with random weights in memory (speed and memory do not depend on their values)."""
    import torch

    from edge_infer.models.audio_encoder import AudioEncoder
    from edge_infer.models.config import ModelConfig
    from edge_infer.models.encoder_config import AudioConfig, VisionConfig
    from edge_infer.models.layers.linear import make_kernel
    from edge_infer.models.vision import VisionEncoder

    if "architectures" in config:
        mm = ModelConfig.from_dict(config).multimodal
        vision_cfg, audio_cfg = (mm.vision, mm.audio) if mm is not None else (None, None)
    else:
        vision_cfg = VisionConfig.from_dict(config["vision_config"], split_qkv=True) if "vision_config" in config else None
        audio_cfg = AudioConfig.from_dict(config["audio_config"]) if "audio_config" in config else None
    gen = torch.Generator().manual_seed(0)

    def fill(encoder):
        for spec in encoder.weight_specs():
            owner, attr = encoder.resolve(spec.target)
            tensor = (torch.randn(spec.shape, generator=gen) * 0.02).to(dtype)
            if spec.is_linear:
                getattr(owner, attr).kernel = make_kernel(tensor, backend)
            else:
                setattr(owner, attr, tensor)
        return encoder.eval().requires_grad_(False)

    return (fill(VisionEncoder(vision_cfg)) if vision_cfg else None, fill(AudioEncoder(audio_cfg)) if audio_cfg else None)


def measure(encode: "Any") -> dict[str, int]:
    """RssAnon added by ``encode()`` over what this process holds before it (a trimmed heap)."""
    malloc_trim()
    base = rss_anon_bytes()
    hwm_ok = reset_peak_rss()
    sampler = PeakSampler(pid=os.getpid(), interval_s=SAMPLE_INTERVAL_S).start()
    start, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    encode()
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    sampler.stop()
    shared = _status_bytes("RssFile", "RssShmem")
    hwm = _status_bytes("VmHWM") - shared if hwm_ok else 0
    sampled = sampler.peak_bytes - base
    return {"base_rss_anon_bytes": base, "sampled_peak_bytes": sampled, "hwm_peak_bytes": max(0, hwm - base),
            "peak_bytes": max(sampled, hwm - base), "encode_s": round(seconds, 3),
            "encode_user_s": round(after.ru_utime - cpu.ru_utime, 3), "encode_sys_s": round(after.ru_stime - cpu.ru_stime, 3),
            "page_faults": after.ru_minflt - cpu.ru_minflt}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="a Qwen2.5-VL / Qwen2.5-Omni checkpoint directory")
    source.add_argument("--config", type=Path, help="a config.json: random weights of its shapes")
    item = parser.add_mutually_exclusive_group(required=True)
    item.add_argument("--image-grid", type=int, nargs=3, metavar=("T", "H", "W"), help="an image/video grid in patches")
    item.add_argument("--audio-frames", type=int, help="a clip of this many mel frames")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--glibc-default", action="store_true",
                        help="keep glibc's dynamic mmap threshold (a text engine's worker), for comparison")
    parser.add_argument("--mmap-threshold", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # before anything large exists, as a thinker's engine worker does (engine/worker.py)
    pinned = not args.glibc_default and (pin_mmap_threshold(args.mmap_threshold) if args.mmap_threshold
                                         else pin_mmap_threshold())

    import numpy as np
    import torch

    from edge_infer.models.layers.linear import onednn_bf16_available
    from edge_infer.models.loader import install_dense
    from edge_infer.quant.native import enable_native_ops

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    dtype = getattr(torch, args.dtype)
    # The engine's dense choice: oneDNN's packed bf16 linears where they run (engine.core.weight_backend).
    backend = "onednn" if dtype == torch.bfloat16 and onednn_bf16_available() else "dense"
    enable_native_ops(dtype)  # attention and elementwise steps as the engine runs them (engine.core.load_model)
    if args.checkpoint is not None:
        from edge_infer.models.encoders import load_encoders

        vision, audio = load_encoders(args.checkpoint, dtype, install_dense(backend), release=malloc_trim)
    else:
        vision, audio = random_towers(json.loads(args.config.read_text()), dtype, backend)
    rng = np.random.default_rng(0)
    if args.image_grid:
        tower, grid = vision, tuple(args.image_grid)
        if tower is None:
            raise SystemExit("this model has no vision tower")
        t, h, w = grid
        features = rng.standard_normal((t * h * w, tower.cfg.patch_dim), dtype=np.float32)

        def encode() -> None:
            with torch.inference_mode():
                tower(torch.from_numpy(features), [grid])
    else:
        tower = audio
        if tower is None:
            raise SystemExit("this model has no audio tower")
        features = rng.standard_normal((tower.cfg.num_mel_bins, args.audio_frames), dtype=np.float32)

        def encode() -> None:
            with torch.inference_mode():
                tower(torch.from_numpy(features))
    result = {"mmap_threshold_pinned": pinned, "dtype": args.dtype, "backend": backend, "threads": torch.get_num_threads(),
              "weight_bytes": tower.resident_bytes(), "input_bytes": features.nbytes, **measure(encode)}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
