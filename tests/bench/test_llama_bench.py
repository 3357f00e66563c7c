"""The pp/tg semantics both engines' arms share (no model needed)."""
from __future__ import annotations

import pytest

from edge_infer.bench.harness.llama_bench import PpTgSettings, RepTimes, Timed, measure, prompt_ids, rates
from edge_infer.bench.harness.runner import numeric_metrics
from edge_infer.bench.harness.stats import direction_of


def test_measure_runs_warmup_then_pp_and_tg_per_rep_with_fresh_prompts():
    calls: list[tuple[tuple[int, ...], int]] = []

    def generate(ids: list[int], n: int) -> Timed:
        calls.append((tuple(ids), n))
        return Timed(0.01 * n + 0.001 * len(ids), 0.01 * (n - 1))

    s = PpTgSettings(pp=32, tg=8, reps=2, seed=5)
    reps = measure(generate, vocab_size=100, s=s)

    assert [(len(ids), n) for ids, n in calls] == [(32, 1), (1, 2)] + [(32, 1), (1, 8)] * 2
    assert calls[2][0] != calls[4][0] and calls[3][0] != calls[5][0]
    assert all(0 <= t < 100 for ids, _ in calls for t in ids)
    # tg's decode time is its own steps after the first token: no other run's prefill is subtracted.
    assert reps[0] == RepTimes(pp_s=0.01 + 0.032, tg_s=0.08 + 0.001, tg_decode_s=0.07)


def test_depth_puts_context_before_the_decode_test_only():
    """llama-bench's -d for tg: the tg prompt is depth + 1 tokens, the prefill test stays as it was."""
    calls: list[tuple[tuple[int, ...], int]] = []

    def generate(ids: list[int], n: int) -> Timed:
        calls.append((tuple(ids), n))
        return Timed(0.01 * n, 0.01 * (n - 1))

    s = PpTgSettings(pp=32, tg=8, reps=2, depth=100)
    measure(generate, vocab_size=1000, s=s)
    assert [(len(ids), n) for ids, n in calls] == [(32, 1), (101, 2)] + [(32, 1), (101, 8)] * 2
    assert s.context_tokens == 100 + 8 + 1
    assert PpTgSettings(pp=512, tg=8, depth=100).context_tokens == 513


def test_prompts_are_reproducible_so_both_engines_see_the_same_ids():
    assert prompt_ids(64, 1000, 0, 1, "pp") == prompt_ids(64, 1000, 0, 1, "pp")
    assert prompt_ids(64, 1000, 0, 1, "pp") != prompt_ids(64, 1000, 1, 1, "pp")


def test_rates_take_decode_after_the_first_token_and_report_best_and_median():
    s = PpTgSettings(pp=100, tg=11, reps=3)
    reps = [RepTimes(pp_s=0.5, tg_s=1.3, tg_decode_s=1.0), RepTimes(pp_s=0.25, tg_s=2.4, tg_decode_s=2.0),
            RepTimes(pp_s=1.0, tg_s=0.9, tg_decode_s=0.5)]
    out = rates(reps, s)
    assert out["pp_tps"] == 400.0 and out["pp_median_tps"] == 200.0
    # (tg - 1) / the time after the first token: 10/1.0, 10/2.0, 10/0.5
    assert out["tg_tps"] == 20.0 and out["tg_median_tps"] == 10.0
    assert out["raw"]["tg_tps"] == [10.0, 5.0, 20.0]
    # Printed by a grid arm, every number must be a rate the grid knows to maximise.
    assert {k: direction_of(k) for k in numeric_metrics(out)} == dict.fromkeys(out.keys() - {"raw"}, "max")


def test_rates_refuse_when_no_repetition_yields_a_decode_rate():
    with pytest.raises(ValueError, match="raise --tg"):
        rates([RepTimes(pp_s=0.1, tg_s=0.2, tg_decode_s=0.0)], PpTgSettings(pp=10, tg=2, reps=1))


@pytest.mark.parametrize("kwargs, message", [({"tg": 1}, "--tg"), ({"pp": 0}, "--pp"), ({"reps": 0}, "--reps"),
                                             ({"depth": -1}, "--depth")])
def test_settings_name_the_bad_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PpTgSettings(**kwargs).validate()
