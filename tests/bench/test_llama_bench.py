"""The pp/tg semantics both engines' arms share (no model needed)."""
from __future__ import annotations

import pytest

from edge_infer.bench.harness.llama_bench import PpTgSettings, RepTimes, measure, prompt_ids, rates
from edge_infer.bench.harness.runner import numeric_metrics
from edge_infer.bench.harness.stats import direction_of


def test_measure_runs_warmup_then_pp_tg1_tg_per_rep_from_the_same_one_token_prompt():
    calls: list[tuple[tuple[int, ...], int]] = []

    def generate(ids: list[int], n: int) -> float:
        calls.append((tuple(ids), n))
        return 0.01 * n + 0.001 * len(ids)

    s = PpTgSettings(pp=32, tg=8, reps=2, seed=5)
    reps = measure(generate, vocab_size=100, s=s)

    assert len(reps) == 2
    warmup, timed = calls[:2], calls[2:]
    assert [(len(ids), n) for ids, n in warmup] == [(32, 1), (1, 2)]
    assert [(len(ids), n) for ids, n in timed] == [(32, 1), (1, 1), (1, 8)] * 2
    # tg and its one-token baseline share their prompt; each repetition gets fresh prompts.
    assert timed[1][0] == timed[2][0]
    assert timed[0][0] != timed[3][0]
    assert all(0 <= t < 100 for ids, _ in calls for t in ids)


def test_depth_puts_context_before_the_decode_test_only():
    """llama-bench's -d for tg: both tg runs share a prompt of depth + 1 tokens, so their difference is tg - 1
    decode steps at that depth; the prefill test and its length stay as they were."""
    calls: list[tuple[tuple[int, ...], int]] = []

    def generate(ids: list[int], n: int) -> float:
        calls.append((tuple(ids), n))
        return 0.01 * n

    s = PpTgSettings(pp=32, tg=8, reps=2, depth=100)
    measure(generate, vocab_size=1000, s=s)
    assert [(len(ids), n) for ids, n in calls] == [(32, 1), (101, 2)] + [(32, 1), (101, 1), (101, 8)] * 2
    assert calls[3][0] == calls[4][0]
    assert s.context_tokens == 100 + 8 + 1
    assert PpTgSettings(pp=512, tg=8, depth=100).context_tokens == 513


def test_prompts_are_reproducible_so_both_engines_see_the_same_ids():
    assert prompt_ids(64, 1000, 0, 1, "pp") == prompt_ids(64, 1000, 0, 1, "pp")
    assert prompt_ids(64, 1000, 0, 1, "pp") != prompt_ids(64, 1000, 1, 1, "pp")


def test_rates_subtract_the_one_token_prefill_and_report_best_and_median():
    s = PpTgSettings(pp=100, tg=11, reps=3)
    reps = [RepTimes(pp_s=0.5, tg1_s=0.1, tg_s=1.1), RepTimes(pp_s=0.25, tg1_s=0.1, tg_s=2.1), RepTimes(pp_s=1.0, tg1_s=0.2, tg_s=0.7)]
    out = rates(reps, s)
    assert out["pp_tps"] == 400.0 and out["pp_median_tps"] == 200.0
    # (tg - 1) / (t_tg - t_1): 10/1.0, 10/2.0, 10/0.5
    assert out["tg_tps"] == 20.0 and out["tg_median_tps"] == 10.0
    assert out["raw"]["tg_tps"] == [10.0, 5.0, 20.0]
    # Printed by a grid arm, every number must be a rate the grid knows to maximise.
    assert {k: direction_of(k) for k in numeric_metrics(out)} == dict.fromkeys(out.keys() - {"raw"}, "max")


def test_rates_refuse_when_no_repetition_yields_a_decode_rate():
    with pytest.raises(ValueError, match="raise --tg"):
        rates([RepTimes(pp_s=0.1, tg1_s=0.2, tg_s=0.2)], PpTgSettings(pp=10, tg=2, reps=1))


@pytest.mark.parametrize("kwargs, message", [({"tg": 1}, "--tg"), ({"pp": 0}, "--pp"), ({"reps": 0}, "--reps"),
                                             ({"depth": -1}, "--depth")])
def test_settings_name_the_bad_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PpTgSettings(**kwargs).validate()
