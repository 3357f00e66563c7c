from __future__ import annotations

import json

import pytest

from edge_infer.bench.harness.checks import family_band_pct, load_expectations

from .conftest import metrics_arm


@pytest.mark.parametrize(
    "metric, band",
    [("rss_anon_mb", 1.5), ("peak_rss_anon_mb", 2.0), ("rss_anon_at_context_mb", 2.0),
     ("init_s", 12.0), ("ready_s", 12.0), ("step_ms", 6.0), ("gemm_ms", 6.0), ("exact_match", 5.0)],
)
def test_bands_come_from_the_metric_family(metric, band):
    assert family_band_pct(metric) == band


@pytest.fixture
def check(tmp_path, write_spec, grid):
    """Run a one-arm grid printing `metrics`, checked against `expected` ({arm: {metric: ...}})."""

    def run(metrics: dict[str, float], expected: dict, *args: str):
        path = tmp_path / "expect.json"
        path.write_text(json.dumps({"arms": expected}))
        spec = write_spec([metrics_arm("A", {k: [v] for k, v in metrics.items()})])
        return grid(spec, "--check", str(path), *args)

    return run


def test_regression_fails_the_run(check, capsys):
    rc, result = check({"rss_anon_mb": 110.0}, {"A": {"rss_anon_mb": 100.0}})
    assert rc == 1
    assert [c.status for c in result.checks] == ["REGRESSION"]
    assert "REGRESSION" in capsys.readouterr().out


def test_within_band_passes(check):
    rc, result = check({"rss_anon_mb": 101.0, "step_ms": 9.5}, {"A": {"rss_anon_mb": 100.0, "step_ms": 10.0}})
    assert rc == 0 and [c.status for c in result.checks] == ["ok", "ok"]


def test_improvement_outside_band_is_reported_not_failed(check):
    rc, result = check({"rss_anon_mb": 80.0}, {"A": {"rss_anon_mb": 100.0}})
    assert rc == 0 and result.checks[0].status == "IMPROVED"


def test_a_per_metric_band_overrides_the_family(check):
    rc, result = check({"rss_anon_mb": 110.0}, {"A": {"rss_anon_mb": {"expected": 100.0, "band_pct": 15}}})
    assert rc == 0 and result.checks[0].band_pct == 15


def test_throughput_is_reported_but_never_gated(check, capsys):
    rc, result = check({"tg_tps": 5.0, "pp_tps": 5.0}, {"A": {"tg_tps": 50.0, "pp_tps": {"expected": 50.0, "band_pct": 1}}})
    assert rc == 0
    assert [(c.status, c.gated) for c in result.checks] == [("REPORTED", False), ("REPORTED", False)]
    assert result.checks[0].delta_pct == pytest.approx(-90.0)
    assert "not gated" in capsys.readouterr().out


def test_expected_metric_without_a_result_fails(check):
    rc, result = check({"rss_anon_mb": 100.0}, {"A": {"rss_anon_mb": 100.0}, "gone": {"rss_anon_mb": 100.0}})
    assert rc == 1 and [c.status for c in result.checks] == ["ok", "MISSING"]


def test_invalid_expectations_are_refused_before_running(tmp_path, write_spec, grid, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"arms": {"A": {"rss_anon_mb": 0}}}))
    rc, result = grid(write_spec([metrics_arm("A", {"rss_anon_mb": [1.0]})]), "--check", str(bad))
    assert rc == 2 and result is None
    assert "non-zero" in capsys.readouterr().err


def test_written_expectations_gate_the_next_run(tmp_path, write_spec, grid):
    spec = write_spec([metrics_arm("A", {"rss_anon_mb": [100.0, 100.5, 100.2], "step_ms": [10.0, 11.0, 10.5],
                                         "tg_tps": [20.0, 22.0, 21.0]})])
    expectations = tmp_path / "expect.json"
    rc, _ = grid(spec, "--write-expectations", str(expectations))
    assert rc == 0
    written = load_expectations(expectations)
    rss, step = written.arms["A"]["rss_anon_mb"], written.arms["A"]["step_ms"]
    assert rss.expected == 100.2 and rss.band_pct == 1.5  # spread 0.5%: the family band holds
    assert step.expected == 10.5 and step.band_pct == pytest.approx(19.1)  # spread 9.5%: widened to 2x
    rc, result = grid(spec, "--check", str(expectations))
    assert rc == 0 and {c.status for c in result.checks} == {"ok", "REPORTED"}
