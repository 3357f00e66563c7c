"""Readable tables of a grid result: printed by `grid`, written by `report`.

The tables are Markdown with padded columns, so the same text reads well in
a terminal and renders in a document.
"""
from __future__ import annotations

from edge_infer.bench.harness.results import GridResult, MetricSummary

FLAG_LABELS = {"NOISY": "NOISY", "SINGLE_PASS": "n=1"}


def fmt(value: float | None, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.6g}{suffix}"


def fmt_pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}%"


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)])


def row_flags(result: GridResult, row: MetricSummary) -> str:
    labels = [FLAG_LABELS[f.kind] for f in result.flags if f.arm == row.arm and f.metric == row.metric and f.kind in FLAG_LABELS]
    arm = next(a for a in result.arms if a.tag == row.arm)
    total = arm.passes_ok + arm.passes_failed
    if arm.passes_failed:
        labels.append(f"failed {arm.passes_failed}/{total}")
    if row.n == 0:
        labels.append("no result")
    if row.n_under_load:
        labels.append(f"load {row.n_under_load}/{row.n}")
    return ", ".join(labels)


def summary_table(result: GridResult, control: str | None = None) -> str:
    headers = ["arm", "metric", "dir", "n", "median", "best", "spread", "min", "max"]
    if control:
        headers.append(f"vs {control}")
    headers.append("flags")
    rows = []
    for r in result.summary:
        cells = [r.arm, r.metric, r.direction or "?", str(r.n), fmt(r.median), fmt(r.best), fmt_pct(r.spread_pct), fmt(r.min), fmt(r.max)]
        if control:
            base = result.row(control, r.metric)
            ratio = r.median / base.median if base and base.median and r.median is not None else None
            cells.append("—" if ratio is None else f"{ratio:.3g}×")
        cells.append(row_flags(result, r))
        rows.append(cells)
    return format_table(headers, rows)


def failures_list(result: GridResult) -> str:
    lines = []
    for o in result.observations:
        if o.status == "ok":
            continue
        stderr = o.stderr_tail.strip().splitlines()[-1:] or [""]
        tail = f"; stderr: {stderr[0][:200]}" if stderr[0] else ""
        lines.append(f"- {o.arm}, pass {o.pass_index} (position {o.position}): {o.status}: {o.error}{tail}")
    return "\n".join(lines)


def flags_list(result: GridResult) -> str:
    return "\n".join(f"- {f.kind}: {f.message}" for f in result.flags)


def checks_table(result: GridResult) -> str:
    headers = ["arm", "metric", "expected", "median", "delta", "band", "spread", "status"]
    rows = [
        [c.arm, c.metric, fmt(c.expected), fmt(c.median), fmt_pct(c.delta_pct), f"±{c.band_pct:g}%",
         fmt_pct(c.spread_pct), c.status if c.gated else f"{c.status} (not gated)"]
        for c in result.checks
    ]
    return format_table(headers, rows)


def headline(result: GridResult) -> str:
    s = result.settings
    cores = ",".join(map(str, s.cores))
    metric = s.headline_metric or "none"
    direction = next((r.direction for r in result.summary if r.metric == s.headline_metric), None)
    sense = {"max": " (higher is better)", "min": " (lower is better)"}.get(direction or "", "")
    return f"grid: {len(result.arms)} arm(s) × {s.passes} pass(es) on cores {cores}; headline {metric}{sense}"


def grid_text(result: GridResult, control: str | None = None) -> str:
    parts = [headline(result), "", summary_table(result, control)]
    failures = failures_list(result)
    if failures:
        parts += ["", "Failed passes (kept, not averaged):", failures]
    if result.ranking:
        parts += ["", result.ranking]
    if result.flags:
        parts += ["", "Flags:", flags_list(result)]
    if result.checks:
        parts += ["", "Checks:", checks_table(result)]
    return "\n".join(parts)
