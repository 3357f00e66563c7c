"""The memory-levers table: one row per lever A/B from its `edge-infer bench grid` result.

    python benchmarks/quant/levers_table.py RESULTS_DIR   # reads RESULTS_DIR/levers-*.json

Each lever's result holds two arms, the lever (first arm of its spec) and its
alternative (second); the row gives both medians of the lever's headline
metric, their spreads, and the saving. The savings overlap (e.g. trimming
releases part of what blocked repacking avoids) and must not be added.
"""
from __future__ import annotations

import sys
from pathlib import Path

from edge_infer.bench.results import load_result


def row(path: Path) -> str:
    result = load_result(path)
    metric = result.settings.headline_metric
    lever, alternative = (a.tag for a in result.arms)
    on, off = result.row(lever, metric), result.row(alternative, metric)
    if on is None or off is None or on.median is None or off.median is None:
        return f"| {path.stem.removeprefix('levers-')} | {metric} | no result | | | |"
    if min(on.n, off.n) < 2:
        verdict = " (single pass: not a result)"
    elif abs(off.median - on.median) <= max(on.spread_pct or 0, off.spread_pct or 0) / 100 * on.median:
        verdict = " (within spread: not a ranking)"
    else:
        verdict = ""
    return (
        f"| {path.stem.removeprefix('levers-')} | {metric} | {lever}: {on.median:,.1f} (±{on.spread_pct or 0:.1f}%, n={on.n}) "
        f"| {alternative}: {off.median:,.1f} (±{off.spread_pct or 0:.1f}%, n={off.n}) | {off.median - on.median:,.1f}{verdict} |"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    paths = sorted(Path(argv[0]).glob("levers-*.json"))
    if not paths:
        print(f"no levers-*.json results in {argv[0]}", file=sys.stderr)
        return 2
    print("| lever | metric (MiB) | with the lever (median) | alternative (median) | saving |")
    print("|---|---|---|---|---|")
    for path in paths:
        print(row(path))
    print("\nSavings overlap and must not be added: each row is measured with every other lever on.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
