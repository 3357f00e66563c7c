"""Where a batch-1 decode step's time goes: torch.profiler over real engine steps.

    python benchmarks/profile_decode.py benchmarks/models/qwen2.5-0.5b \
        [--packed-head] [--quantization cpu_int4|cpu_w4a8|cpu_w8a8] --out benchmarks/results/profiles/NAME.json

Runs the engine core in this process (no worker) on two threads, decodes a
while to warm up, then profiles decode steps at a short context. Reports the
wall time per step, each operator's self time per step (the largest first),
and what is left outside operators (Python, the scheduler, the sampler's
bookkeeping). Run it on quiet cores, like every benchmark; `taskset -c 0-1`
pins it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from step_profile import time_and_profile

STEPS = 40
WARMUP_STEPS = 10
PROMPT_TOKENS = 16
TOP_OPS = 12


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--packed-head", action="store_true")
    parser.add_argument("--quantization", choices=["cpu_int4", "cpu_w4a8", "cpu_w8a8"], default=None)
    parser.add_argument("--quantize-head", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import os

    import torch

    from edge_infer.bench.harness import provenance
    from edge_infer.config import EngineConfig, QuantConfig
    from edge_infer.engine.core import EngineCore
    from edge_infer.engine.protocol import EngineRequest
    from edge_infer.engine.sampling_params import SamplingParams

    stamp = provenance.collect(sorted(os.sched_getaffinity(0)))
    quant = None
    if args.quantization:
        quant = QuantConfig.named(args.quantization, quantize_head=args.quantize_head)
    config = EngineConfig(
        model=args.model, dtype=args.dtype, max_model_len=512, max_num_seqs=1, max_num_batched_tokens=512,
        kv_cache_memory_bytes=32 << 20, quant=quant, packed_head=args.packed_head, num_threads=2,
    )
    core = EngineCore(config)
    total = WARMUP_STEPS + 2 * STEPS + 2
    params = SamplingParams(temperature=0, max_tokens=total, ignore_eos=True)
    core.add_request(EngineRequest("profile", list(range(100, 100 + PROMPT_TOKENS)), params))
    for _ in range(WARMUP_STEPS):
        core.step()

    wall_ms, per_step = time_and_profile(core.step, STEPS)
    in_ops_ms = sum(ms for _, ms, _ in per_step)
    result = {
        "kind": "edge-infer.profile.decode",
        "model": args.model,
        "settings": {"dtype": args.dtype, "packed_head": args.packed_head, "quantization": args.quantization,
                     "quantize_head": args.quantize_head, "threads": torch.get_num_threads(),
                     "context_tokens": f"{PROMPT_TOKENS + WARMUP_STEPS}..{PROMPT_TOKENS + total}", "steps": STEPS},
        "wall_ms_per_step": round(wall_ms, 3),
        "tokens_per_s": round(1e3 / wall_ms, 2),
        "operators_ms_per_step": round(in_ops_ms, 3),
        "outside_operators_ms_per_step": round(wall_ms - in_ops_ms, 3),
        "top_operators": [{"op": k, "self_ms_per_step": round(ms, 3), "calls_per_step": round(n, 1)}
                          for k, ms, n in per_step[:TOP_OPS]],
    }
    stamp.finished_at = provenance.now_utc()
    result["provenance"] = stamp.model_dump()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{wall_ms:.1f} ms/step ({1e3 / wall_ms:.1f} tok/s); in operators {in_ops_ms:.1f} ms, "
          f"outside {wall_ms - in_ops_ms:.1f} ms")
    for row in result["top_operators"]:
        print(f"  {row['self_ms_per_step']:8.2f} ms  x{row['calls_per_step']:<6} {row['op']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
