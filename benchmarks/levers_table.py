"""The memory-levers table from the `levers-*` grid results.

    python benchmarks/levers_table.py benchmarks/results    # reads levers-*.json there

Each lever's grid has two arms: the lever (its spec's first arm) and the
alternative that undoes it (second). A row gives both medians of the grid's
headline metric (MiB), their spreads and pass counts, and the saving. The
savings overlap (trimming returns part of what whole-tensor repacking leaves
behind, for example) and must not be added.
"""
from __future__ import annotations

import sys
from pathlib import Path

from edge_infer.bench.harness.results import load_result


def row(path: Path) -> str:
    result = load_result(path)
    metric = result.settings.headline_metric
    lever, alternative = (a.tag for a in result.arms)
    on, off = result.row(lever, metric), result.row(alternative, metric)
    name = path.stem.removeprefix("levers-")
    if on is None or off is None or on.median is None or off.median is None:
        return f"| {name} | {metric} | {lever}: no result | {alternative}: no result | |"
    if min(on.n, off.n) < 2:
        verdict = " (single pass: not a result)"
    elif abs(off.median - on.median) <= max(on.spread_pct or 0, off.spread_pct or 0) / 100 * on.median:
        verdict = " (within spread: not a ranking)"
    else:
        verdict = ""

    def cell(tag: str, s) -> str:
        return f"{tag}: {s.median:,.1f} (spread {s.spread_pct or 0:.1f}%, n={s.n})"

    return f"| {name} | {metric} | {cell(lever, on)} | {cell(alternative, off)} | {off.median - on.median:,.1f}{verdict} |"


def table(results_dir: Path) -> str | None:
    paths = sorted(results_dir.glob("levers-*.json"))
    if not paths:
        return None
    lines = [
        "| lever | metric (MiB) | with the lever | alternative | saving (MiB) |",
        "|---|---|---|---|---|",
        *(row(p) for p in paths),
        "",
        "Each row is measured with every other lever on: the savings overlap and must not be added.",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    text = table(Path(argv[0]))
    if text is None:
        print(f"no levers-*.json results in {argv[0]}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
