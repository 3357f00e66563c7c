"""``edge-infer synth``: write a random checkpoint of a supported family, tiny or of a real shape."""
from __future__ import annotations

import argparse
import sys

from edge_infer.models.synth import FAMILIES, PRESETS, THINKER_FAMILIES, write_checkpoint


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="directory to write (created if missing)")
    parser.add_argument("--family", required=True, choices=FAMILIES + THINKER_FAMILIES + ("qwen3-tts",))
    parser.add_argument("--preset", default="tiny",
                        help=f"shape preset: {', '.join(PRESETS)} (qwen2_5_vl: tiny, qwen2.5-vl-3b; qwen2_5_omni: tiny, "
                             "qwen2.5-omni-3b, its thinker; qwen3-tts: tiny, qwen3-tts-0.6b)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--shard-bytes", type=int, default=2 << 30, help="split weights into shards of at most this size")


def run(args: argparse.Namespace) -> int:
    try:
        if args.family == "qwen3-tts":
            from edge_infer.models.qwen3_tts.synth import write_random_checkpoint

            write_random_checkpoint(args.out, preset=args.preset, seed=args.seed)
        else:
            write_checkpoint(args.out, args.family, args.preset, args.seed, args.dtype, args.shard_bytes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.family} ({args.preset}) checkpoint to {args.out}")
    return 0
