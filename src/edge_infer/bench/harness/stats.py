"""Direction, best, median and spread of a metric.

Direction comes from the metric's name: rates (``tg_tps``, ``tokens_per_s``,
``throughput``) are better high; memory, times and latencies (``rss_anon_mb``,
``ready_s``, ``step_ms``, ``ttft``) are better low. A name that matches
neither has no direction until the user gives one (``--direction m=max``):
guessing would silently pick the wrong "best".

Spread is ``(max - min) / |median| * 100``: the full range of the passes as a
percentage of their median. With three passes it is the honest width of what
was seen; it is undefined when the median is zero and the values differ.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from edge_infer.bench.harness.results import Direction

_RATE_SUFFIXES = ("_tps", "_per_s", "_per_sec", "_per_second")
_RATE_NAMES = ("tps",)
_RATE_PARTS = ("throughput",)

_MEMORY_SUFFIXES = ("_mb", "_mib", "_gb", "_gib", "_kb", "_kib", "_bytes")
_MEMORY_PREFIXES = ("rss", "peak")
_OP_TIME_SUFFIXES = ("_ms", "_us", "_ns")
_TIME_SUFFIXES = ("_s", "_sec", "_seconds")
_LATENCY_WORDS = ("latency", "ttft", "ttfa", "itl", "rtf")  # matched as whole "_"-separated words


def is_rate(metric: str) -> bool:
    """Throughput-like: higher is better, and too noisy on a shared host to gate."""
    name = metric.lower()
    return name in _RATE_NAMES or name.endswith(_RATE_SUFFIXES) or any(p in name for p in _RATE_PARTS)


def is_memory(metric: str) -> bool:
    name = metric.lower()
    return not is_rate(name) and (name.endswith(_MEMORY_SUFFIXES) or name.startswith(_MEMORY_PREFIXES))


def is_op_time(metric: str) -> bool:
    return not is_rate(metric) and metric.lower().endswith(_OP_TIME_SUFFIXES)


def is_time(metric: str) -> bool:
    """End-to-end times and latencies (seconds-scale, noisier than per-op times)."""
    name = metric.lower()
    if is_rate(name) or is_op_time(name):
        return False
    return name.endswith(_TIME_SUFFIXES) or any(w in name.split("_") for w in _LATENCY_WORDS)


def direction_of(metric: str, overrides: dict[str, Direction] | None = None) -> Direction | None:
    if overrides and metric in overrides:
        return overrides[metric]
    if is_rate(metric):
        return "max"
    if is_memory(metric) or is_op_time(metric) or is_time(metric):
        return "min"
    return None


def parse_direction_overrides(items: list[str]) -> dict[str, Direction]:
    """Parse repeated ``metric=max|min`` options."""
    overrides: dict[str, Direction] = {}
    for item in items:
        metric, sep, value = item.partition("=")
        if not sep or not metric or value not in ("max", "min"):
            raise ValueError(f"--direction {item!r}: expected METRIC=max or METRIC=min")
        overrides[metric] = value  # type: ignore[assignment]
    return overrides


@dataclass(frozen=True)
class Stats:
    n: int
    median: float | None
    best: float | None
    min: float | None
    max: float | None
    spread_pct: float | None


def spread_pct(values: list[float]) -> float | None:
    if not values:
        return None
    low, high, mid = min(values), max(values), statistics.median(values)
    if high == low:
        return 0.0
    if mid == 0:
        return None
    return (high - low) / abs(mid) * 100.0


def summarize(values: list[float], direction: Direction | None) -> Stats:
    if not values:
        return Stats(0, None, None, None, None, None)
    best = None if direction is None else (max(values) if direction == "max" else min(values))
    return Stats(
        n=len(values),
        median=statistics.median(values),
        best=best,
        min=min(values),
        max=max(values),
        spread_pct=spread_pct(values),
    )
