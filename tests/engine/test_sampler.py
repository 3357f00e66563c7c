"""Sampling: greedy, truncation, penalties, seeds, min_tokens, logprobs."""
from __future__ import annotations

import math

import pytest
import torch

from edge_infer.engine.sampler import _truncate, sample_row
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import InvalidRequestError


def seq(**params) -> Sequence:
    s = Sequence(request_id="r", prompt_token_ids=[1, 2, 3], params=SamplingParams(**params), stop_ids=frozenset({0}),
                 arrival_time=0.0)
    if params.get("seed") is not None:
        s.generator = torch.Generator().manual_seed(params["seed"])
    return s


GEN = torch.Generator().manual_seed(0)
LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, -1.0, 2.9])


def test_greedy_picks_the_argmax():
    assert sample_row(LOGITS, seq(temperature=0), GEN).token_id == 1


def test_top_k_top_p_min_p_keep_only_the_expected_tokens():
    keep = lambda t: set(torch.nonzero(torch.isfinite(t)).flatten().tolist())  # noqa: E731
    assert keep(_truncate(LOGITS, 2, 1.0, 0.0)) == {1, 5}
    probs = torch.softmax(LOGITS, 0)
    # top_p: smallest prefix of the sorted distribution whose mass reaches p
    p = float(probs[1] + probs[5]) - 1e-4
    assert keep(_truncate(LOGITS, 0, p, 0.0)) == {1, 5}
    assert keep(_truncate(LOGITS, 0, 1.0, float(probs[2] / probs[1]) - 1e-4)) == {1, 5, 2}


def test_seeded_sampling_is_reproducible_and_independent_of_other_draws():
    a = [sample_row(LOGITS, s, GEN).token_id for s in [seq(temperature=1.0, seed=7)] for _ in range(20)]
    s2 = seq(temperature=1.0, seed=7)
    torch.rand(100)  # unrelated randomness in between
    b = [sample_row(LOGITS, s2, GEN).token_id for _ in range(20)]
    assert a == b
    assert len(set(a)) > 1


def test_penalties_change_the_choice():
    s = seq(temperature=0, presence_penalty=2.0)
    s.output_token_ids = [1]
    assert sample_row(LOGITS, s, GEN).token_id == 5
    r = seq(temperature=0, repetition_penalty=2.0)  # prompt tokens 1,2,3 are penalised
    assert sample_row(LOGITS, r, GEN).token_id == 5
    f = seq(temperature=0, frequency_penalty=0.06)
    f.output_token_ids = [1, 1]
    assert sample_row(LOGITS, f, GEN).token_id == 5


def test_min_tokens_masks_stop_ids():
    logits = torch.tensor([9.0, 1.0, 0.0])
    s = seq(temperature=0, min_tokens=2)
    assert sample_row(logits, s, GEN).token_id == 1
    s.output_token_ids = [1, 1]
    assert sample_row(logits, s, GEN).token_id == 0


def test_logprobs_come_from_the_raw_distribution():
    out = sample_row(LOGITS, seq(temperature=0, logprobs=2, presence_penalty=1.0), GEN)
    ref = torch.log_softmax(LOGITS, 0)
    assert math.isclose(out.logprob, float(ref[1]), rel_tol=1e-6)
    assert [t for t, _ in out.top_logprobs] == [1, 5]


def test_a_vanishing_top_p_keeps_the_top_token():
    kept = _truncate(LOGITS, 0, 5e-324, 0.0)
    assert torch.isfinite(kept).sum() == 1 and int(torch.argmax(kept)) == 1


def test_a_temperature_past_fp32s_range_samples_an_allowed_token():
    """1.18e308 is a finite Python float but inf in fp32: a grammar's masked tokens stay impossible (no NaN from
    -inf / inf), the allowed ones are drawn as from an infinite temperature (found by the fuzz test as a 500)."""
    allowed = torch.tensor([False, True, False, True, False, False])
    s = seq(temperature=1.178422569620432e308, seed=3)
    tokens = {sample_row(LOGITS, s, GEN, allowed).token_id for _ in range(40)}
    assert tokens == {1, 3}


def test_a_temperature_that_is_not_a_finite_number_is_refused():
    for bad in (float("inf"), float("nan"), -0.5):
        with pytest.raises(InvalidRequestError, match="temperature must be a finite number >= 0"):
            SamplingParams(temperature=bad)
