"""From observations to a summary: per-arm statistics, flags and the ranking verdict.

Only successful passes feed the statistics; failed ones are counted and
flagged, never averaged in and never turned into zeros. Passes taken under
load are kept in the statistics (with all passes under load there is nothing
else) but each row says how many there were, and the run is flagged.
"""
from __future__ import annotations

from edge_infer.bench.harness import stats
from edge_infer.bench.harness.results import ArmStatus, Direction, Flag, MetricSummary, Observation

MIN_PASSES = 3


def metric_names(observations: list[Observation], keys: list[str]) -> list[str]:
    if keys:
        return list(keys)
    return list(dict.fromkeys(m for o in observations if o.status == "ok" for m in o.metrics))


def summarize(
    observations: list[Observation], tags: list[str], metrics: list[str], directions: dict[str, Direction]
) -> list[MetricSummary]:
    rows = []
    for tag in tags:
        ok = [o for o in observations if o.arm == tag and o.status == "ok"]
        for metric in metrics:
            with_metric = [o for o in ok if metric in o.metrics]
            values = [o.metrics[metric] for o in with_metric]
            direction = stats.direction_of(metric, directions)
            s = stats.summarize(values, direction)
            rows.append(MetricSummary(
                arm=tag, metric=metric, direction=direction, n=s.n,
                n_under_load=sum(o.under_load for o in with_metric), values=values,
                median=s.median, best=s.best, min=s.min, max=s.max,
                spread_pct=None if s.spread_pct is None else round(s.spread_pct, 3),
            ))
    return rows


def arm_statuses(observations: list[Observation], tags: list[str]) -> list[ArmStatus]:
    return [
        ArmStatus(
            tag=tag,
            passes_ok=sum(o.arm == tag and o.status == "ok" for o in observations),
            passes_failed=sum(o.arm == tag and o.status != "ok" for o in observations),
            passes_under_load=sum(o.arm == tag and o.under_load for o in observations),
        )
        for tag in tags
    ]


def ranking(rows: list[MetricSummary], headline: str | None) -> tuple[str | None, Flag | None]:
    """Rank the top two arms on the headline metric, or say why they are not ranked.

    Two arms are ranked only when the gap between their medians (relative to
    the runner-up's) exceeds the larger of their spreads, and both have at least
    two passes.
    """
    candidates = [r for r in rows if r.metric == headline and r.median is not None]
    if headline is None or len(candidates) < 2:
        return None, None
    direction = candidates[0].direction
    if direction is None:
        text = f"not a ranking: {headline} has no direction (pass --direction {headline}=max|min)"
        return text, Flag(kind="NOT_A_RANKING", metric=headline, message=text)
    ordered = sorted(candidates, key=lambda r: r.median or 0.0, reverse=direction == "max")
    first, second = ordered[0], ordered[1]
    m1, m2 = first.median or 0.0, second.median or 0.0
    gap = abs(m1 - m2) / abs(m2) * 100.0 if m2 else float("inf")
    if first.n < 2 or second.n < 2:
        text = f"not a ranking: {first.arm} and {second.arm} on {headline} rest on a single pass"
        return text, Flag(kind="NOT_A_RANKING", metric=headline, message=text)
    if first.spread_pct is None or second.spread_pct is None:
        widest = float("inf")
    else:
        widest = max(first.spread_pct, second.spread_pct)
    if gap <= widest:
        text = (
            f"not a ranking: {first.arm} and {second.arm} differ by {gap:.1f}% on {headline}, "
            f"within their spread ({widest:.1f}%)"
        )
        return text, Flag(kind="NOT_A_RANKING", metric=headline, message=text)
    better = "higher" if direction == "max" else "lower"
    text = f"{first.arm} leads {second.arm} on {headline}: {gap:.1f}% {better} than {second.arm} (spreads at most {widest:.1f}%)"
    return text, None


def flags_for(
    observations: list[Observation],
    arms: list[ArmStatus],
    rows: list[MetricSummary],
    passes: int,
    noise_threshold_pct: float,
) -> list[Flag]:
    flags: list[Flag] = []
    if passes < MIN_PASSES:
        flags.append(Flag(kind="FEW_PASSES", message=f"{passes} pass(es) per arm; publishable figures need at least {MIN_PASSES}"))
    for arm in arms:
        failed = [o for o in observations if o.arm == arm.tag and o.status != "ok"]
        if failed:
            detail = "; ".join(f"pass {o.pass_index}: {o.status} ({o.error})" for o in failed)
            flags.append(Flag(kind="FAILED_PASSES", arm=arm.tag, message=f"{arm.tag}: {len(failed)} of {arm.passes_ok + len(failed)} passes failed: {detail}"))
        if arm.passes_ok == 0:
            flags.append(Flag(kind="NO_RESULT", arm=arm.tag, message=f"{arm.tag}: no successful pass, no result"))
    for metric in dict.fromkeys(r.metric for r in rows):
        if any(r.metric == metric and r.direction is None for r in rows):
            flags.append(Flag(
                kind="NO_DIRECTION", metric=metric,
                message=f"{metric}: direction unknown from its name, best not computed; pass --direction {metric}=max|min",
            ))
    for r in rows:
        if r.n == 1:
            flags.append(Flag(kind="SINGLE_PASS", arm=r.arm, metric=r.metric, message=f"{r.arm}/{r.metric}: n=1: not a result"))
        if r.n >= 2 and (r.spread_pct is None or r.spread_pct > noise_threshold_pct):
            spread = "undefined (median 0)" if r.spread_pct is None else f"{r.spread_pct:.1f}%"
            flags.append(Flag(
                kind="NOISY", arm=r.arm, metric=r.metric,
                message=f"{r.arm}/{r.metric}: spread {spread} exceeds {noise_threshold_pct:g}%",
            ))
    loaded = sum(o.under_load for o in observations)
    if loaded:
        flags.append(Flag(kind="UNDER_LOAD", message=f"{loaded} of {len(observations)} passes were taken while the target cores were busy"))
    return flags
