from __future__ import annotations

import pytest

from edge_infer.bench.harness import stats


@pytest.mark.parametrize(
    "metric, direction",
    [
        ("tg_tps", "max"), ("tps", "max"), ("decode_tok_per_s", "max"), ("throughput", "max"),
        ("rss_anon_mb", "min"), ("peak_rss_anon_mb", "min"), ("kv_bytes", "min"), ("rss", "min"),
        ("ready_s", "min"), ("step_ms", "min"), ("latency", "min"), ("ttft", "min"), ("itl_p50", "min"),
        ("rtf_total", "min"), ("exact_match", None), ("n_procs_max", None), ("title_len", None),
    ],
)
def test_direction_comes_from_the_name(metric, direction):
    assert stats.direction_of(metric) == direction


def test_override_wins_over_the_name():
    assert stats.direction_of("tg_tps", {"tg_tps": "min"}) == "min"
    assert stats.parse_direction_overrides(["exact_match=max"]) == {"exact_match": "max"}
    with pytest.raises(ValueError, match="METRIC=max"):
        stats.parse_direction_overrides(["exact_match=up"])


def test_spread_is_range_over_median():
    assert stats.spread_pct([90.0, 100.0, 110.0]) == pytest.approx(20.0)
    assert stats.spread_pct([5.0, 5.0]) == 0.0
    assert stats.spread_pct([-1.0, 0.0, 1.0]) is None  # median 0: undefined


def test_best_is_max_for_rates_and_min_for_costs():
    assert stats.summarize([3.0, 1.0, 2.0], "max").best == 3.0
    assert stats.summarize([3.0, 1.0, 2.0], "min").best == 1.0
    assert stats.summarize([3.0, 1.0, 2.0], None).best is None
    assert stats.summarize([], "max").median is None
