"""`edge-infer bench report RESULTS... [--out DIR] [--control TAG]`.

A Markdown report of grid result files: per arm and metric the median,
spread, n, best and flags; with `--control`, each median divided by the
control arm's median from the same run (ratios measured side by side hold
when absolute numbers drift between runs). With `--out`, the report is also
written to DIR/report.md next to one PNG per result and metric (median with
bars spanning the passes' range) when matplotlib is importable.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from edge_infer.bench.harness import render
from edge_infer.bench.harness.results import GridResult, ResultFileError, load_result


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULT", help="JSON files written by `edge-infer bench grid --out`")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write report.md and PNG plots into DIR")
    parser.add_argument("--control", metavar="TAG", help="arm to divide every median by (ratios, not absolutes)")


def provenance_line(result: GridResult) -> str:
    p = result.provenance
    commits = ", ".join(f"{g.commit[:10]}{' (dirty)' if g.dirty else ''}" for g in p.git) or "not in a git repository"
    cores = ",".join(map(str, result.settings.cores))
    isa = f"ISA {p.cpu_isa}" if p.cpu_isa else "ISA not recorded (measured before provenance named it)"
    if p.cpu_masked:
        isa += f", masked by EDGE_INFER_CPU_FEATURES (hides {' '.join(p.cpu_masked)})"
    return (
        f"Host `{p.host}`, CPU {p.cpu_model or 'unknown'} ({p.cpu_count} cores; {isa}), target cores {cores}; "
        f"commit {commits}; python {p.python}, torch {p.packages.get('torch') or 'absent'}; "
        f"started {p.started_at}; {result.settings.passes} rotated passes."
    )


def result_section(title: str, result: GridResult, control: str | None) -> str:
    parts = [f"## {title}", "", provenance_line(result), "", render.headline(result), "", render.summary_table(result, control)]
    if result.ranking:
        parts += ["", result.ranking]
    failures = render.failures_list(result)
    if failures:
        parts += ["", "Failed passes (kept, not averaged):", "", failures]
    if result.flags:
        parts += ["", "Flags:", "", render.flags_list(result)]
    if result.checks:
        parts += ["", "Checks:", "", render.checks_table(result)]
    return "\n".join(parts)


def plot_metric(result: GridResult, metric: str, path: Path) -> bool:
    """One PNG: each arm's median with a bar over min..max. False when no arm has a value."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = [r for r in result.summary if r.metric == metric]
    measured = [i for i, r in enumerate(rows) if r.median is not None]
    if not measured:
        return False
    medians = [rows[i].median or 0.0 for i in measured]
    below = [(rows[i].median or 0.0) - (rows[i].min or 0.0) for i in measured]
    above = [(rows[i].max or 0.0) - (rows[i].median or 0.0) for i in measured]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(rows) + 2), 3.5))
    try:
        ax.errorbar(measured, medians, yerr=[below, above], fmt="o", capsize=6)
        # Arms without a result keep their place on the axis, labelled as such.
        ax.set_xticks(range(len(rows)), [f"{r.arm}\nn={r.n}" if r.n else f"{r.arm}\nno result" for r in rows])
        ax.set_xlim(-0.5, len(rows) - 0.5)
        sense = {"max": "higher is better", "min": "lower is better"}.get(rows[0].direction or "", "direction unknown")
        ax.set_title(f"{metric} ({sense})\nmedian; bar = min..max of passes", fontsize=10)
        ax.set_ylabel(metric)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return True


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def run(args: argparse.Namespace) -> int:
    results: list[tuple[Path, GridResult]] = []
    try:
        for path in args.results:
            results.append((path, load_result(path)))
    except ResultFileError as exc:
        print(f"edge-infer bench report: {exc}", file=sys.stderr)
        return 2
    if args.control:
        for path, result in results:
            tags = [a.tag for a in result.arms]
            if args.control not in tags:
                print(f"edge-infer bench report: --control {args.control!r} is not an arm of {path} (arms: {', '.join(tags)})", file=sys.stderr)
                return 2

    plotting_note = None
    if args.out is None:
        plotting_note = "Plots skipped: no --out directory to write them to."
    else:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            plotting_note = f"Plots skipped: matplotlib is not importable ({exc}); install the `plots` extra: pip install 'edge-infer[plots]'."
        args.out.mkdir(parents=True, exist_ok=True)

    sections = ["# Benchmark report"]
    for index, (path, result) in enumerate(results, start=1):
        section = result_section(str(path), result, args.control)
        if args.out is not None and plotting_note is None:
            prefix = _slug(f"{index}-{path.stem}") if len(results) > 1 else _slug(path.stem)
            images = []
            for metric in result.metrics():
                png = args.out / f"{prefix}-{_slug(metric)}.png"
                if plot_metric(result, metric, png):
                    images.append(f"![{metric}]({png.name})")
            if images:
                section += "\n\n" + "\n".join(images)
        sections.append(section)
    if plotting_note:
        sections.append(plotting_note)
    text = "\n\n".join(sections) + "\n"
    print(text, end="")
    if args.out is not None:
        (args.out / "report.md").write_text(text)
        print(f"\nreport written to {args.out / 'report.md'}")
    return 0
