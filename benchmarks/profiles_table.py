"""The decode-profile table from benchmarks/results/profiles/*.json (benchmarks/profile_decode.py).

    python benchmarks/profiles_table.py benchmarks/results/profiles

One row per profile: wall time per batch-1 decode step, the time inside
PyTorch operators and outside them (Python, scheduling, sampling
bookkeeping), and the three operators that take the most self time.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def row(path: Path) -> str:
    p = json.loads(path.read_text())
    top = ", ".join(f"`{o['op']}` {o['self_ms_per_step']:.1f}" for o in p["top_operators"][:3])
    return (f"| {path.stem.removeprefix('decode-')} | {p['wall_ms_per_step']:.1f} ({p['tokens_per_s']:.1f} tok/s) "
            f"| {p['operators_ms_per_step']:.1f} | {p['outside_operators_ms_per_step']:.1f} | {top} |")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    paths = sorted(Path(argv[0]).glob("*.json"))
    if not paths:
        print(f"no profiles in {argv[0]}", file=sys.stderr)
        return 1
    print("| profile | ms per step | in operators (ms) | outside (ms) | largest operators (ms per step) |")
    print("|---|---|---|---|---|")
    for path in paths:
        print(row(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
