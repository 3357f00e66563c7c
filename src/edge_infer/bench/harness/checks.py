"""Gate medians against expectations: `grid --check` and `--write-expectations`.

An expectations file names, per arm and metric, an expected median and
optionally a band in percent:

    {"arms": {"eager": {"rss_anon_mb": 412.0,
                        "step_ms": {"expected": 9.1, "band_pct": 4}}}}

Without a band the metric's family decides: steady memory 1.5%, peak or
filled-context memory 2%, per-op times (ms, us) 6%, end-to-end times and
latencies 12%, anything else 5%. Throughput (rates) is reported against its
expectation but never gated: on a shared host it swings far beyond any band
that would still catch a real regression.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import BaseModel, ValidationError

from edge_infer.bench.harness import stats
from edge_infer.bench.harness.results import CheckRow, Direction, GridResult, MetricSummary


class Expectation(BaseModel):
    expected: float
    band_pct: float | None = None


class Expectations(BaseModel):
    arms: dict[str, dict[str, Expectation]]


class ExpectationsError(ValueError):
    pass


def family_band_pct(metric: str) -> float:
    name = metric.lower()
    if stats.is_memory(name):
        return 2.0 if ("peak" in name or "context" in name) else 1.5
    if stats.is_op_time(name):
        return 6.0
    if stats.is_time(name):
        return 12.0
    return 5.0


def load_expectations(path: Path) -> Expectations:
    try:
        raw = json.loads(path.read_text())
        # A bare number is shorthand for {"expected": number}.
        if isinstance(raw, dict) and isinstance(raw.get("arms"), dict):
            for metrics in raw["arms"].values():
                if isinstance(metrics, dict):
                    for name, value in list(metrics.items()):
                        if isinstance(value, (int, float)) and not isinstance(value, bool):
                            metrics[name] = {"expected": value}
        expectations = Expectations.model_validate(raw)
    except OSError as exc:
        raise ExpectationsError(f"cannot read expectations {path}: {exc.strerror}") from exc
    except ValueError as exc:
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise ExpectationsError(
            f"expectations {path} are invalid ({detail}); expected "
            '{"arms": {"TAG": {"METRIC": number or {"expected": number, "band_pct": number}}}}'
        ) from None
    for arm, metrics in expectations.arms.items():
        for metric, exp in metrics.items():
            if exp.expected == 0 or not math.isfinite(exp.expected):
                raise ExpectationsError(
                    f"expectations {path}: {arm}/{metric} expects {exp.expected}; bands are relative, "
                    "so the expected value must be finite and non-zero"
                )
            if exp.band_pct is not None and exp.band_pct < 0:
                raise ExpectationsError(f"expectations {path}: {arm}/{metric} has a negative band_pct")
    return expectations


def check_one(
    arm: str, metric: str, exp: Expectation, row: MetricSummary | None, direction: Direction | None
) -> CheckRow:
    band = exp.band_pct if exp.band_pct is not None else family_band_pct(metric)
    gated = not stats.is_rate(metric)
    median = row.median if row else None
    spread = row.spread_pct if row else None
    delta = None if median is None else (median - exp.expected) / abs(exp.expected) * 100.0

    def make(status: str) -> CheckRow:
        return CheckRow(
            arm=arm, metric=metric, expected=exp.expected, band_pct=band, median=median,
            delta_pct=None if delta is None else round(delta, 3), spread_pct=spread, gated=gated, status=status,
        )

    if not gated:
        return make("REPORTED")
    if median is None:
        return make("MISSING")
    if direction is None:
        return make("NO_DIRECTION")
    worse = delta if direction == "min" else -delta  # type: ignore[operator]
    if worse > band:
        return make("REGRESSION")
    if -worse > band:
        return make("IMPROVED")
    return make("ok")


def run_checks(result: GridResult, expectations: Expectations) -> list[CheckRow]:
    rows = []
    for arm, metrics in expectations.arms.items():
        for metric, exp in metrics.items():
            direction = stats.direction_of(metric, result.settings.directions)
            rows.append(check_one(arm, metric, exp, result.row(arm, metric), direction))
    return rows


def derive_expectations(result: GridResult) -> tuple[Expectations, list[str]]:
    """Expectations from a result: medians, with bands at least the family band and
    widened to twice the observed spread where this host is noisier than that.

    Metrics with fewer than two successful passes are skipped (their spread is
    unknown); the second element lists them.
    """
    arms: dict[str, dict[str, Expectation]] = {}
    skipped: list[str] = []
    for row in result.summary:
        if row.n < 2 or row.median is None or row.median == 0:
            skipped.append(f"{row.arm}/{row.metric} (n={row.n})")
            continue
        band = family_band_pct(row.metric)
        if row.spread_pct is not None:
            band = max(band, math.ceil(2 * row.spread_pct * 10) / 10)
        arms.setdefault(row.arm, {})[row.metric] = Expectation(expected=row.median, band_pct=band)
    return Expectations(arms=arms), skipped


def write_expectations(expectations: Expectations, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(expectations.model_dump_json(indent=2) + "\n")
