"""Choosing a frame's codes from logits, by the reference's rules.

Logit processing follows the reference (Hugging Face ``generate`` with the
arguments ``Qwen3TTSForConditionalGeneration.generate`` passes), in this
order, so greedy runs match token for token and seeded sampled runs draw
the same random numbers:

first codebook (Talker): repetition penalty over earlier first codes ->
eos masked for the first ``MIN_FRAMES_BEFORE_EOS`` frames -> control ids
(the top 1024 codec ids, eos excepted) masked -> temperature -> top-k ->
top-p -> sample (or argmax).

residual codebooks (code predictor): temperature -> top-k -> top-p ->
sample (or argmax); no penalty, no masking.

``SamplingParams`` (models/qwen3_tts/config.py) says which rules apply.
"""
from __future__ import annotations


import torch

from edge_infer.models.qwen3_tts.config import SamplingParams, TalkerConfig

MIN_FRAMES_BEFORE_EOS = 2


def _warp(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Temperature, top-k, top-p on [1, V] fp32 scores (filtered entries become -inf)."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:
        k = min(top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p)
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


def _choose(scores: torch.Tensor, sample: bool, temperature: float, top_k: int, top_p: float,
            generator: torch.Generator | None) -> int:
    if not sample:
        return int(torch.argmax(scores, dim=-1))
    probs = torch.softmax(_warp(scores, temperature, top_k, top_p), dim=-1)
    return int(torch.multinomial(probs, num_samples=1, generator=generator))


class FrameSampler:
    """Applies the processing chain above; keeps the first-codebook history for the penalty."""

    def __init__(self, config: TalkerConfig, params: SamplingParams, generator: torch.Generator | None = None) -> None:
        self.params = params
        self.eos = config.codec.eos
        suppressed = [i for i in config.suppressed_ids if i != self.eos]
        self.suppressed = torch.tensor(suppressed, dtype=torch.long)
        self.generator = generator
        self.history: list[int] = []

    def first_code(self, logits: torch.Tensor) -> int:
        p = self.params
        scores = logits.float().reshape(1, -1).clone()
        if p.repetition_penalty != 1.0 and self.history:
            seen = torch.tensor(sorted(set(self.history)), dtype=torch.long)
            picked = scores[0, seen]
            scores[0, seen] = torch.where(picked < 0, picked * p.repetition_penalty, picked / p.repetition_penalty)
        if len(self.history) < MIN_FRAMES_BEFORE_EOS or p.ignore_eos:
            scores[0, self.eos] = float("-inf")
        scores[0, self.suppressed.to(scores.device)] = float("-inf")
        code = _choose(scores, p.do_sample, p.temperature, p.top_k, p.top_p, self.generator)
        self.history.append(code)
        return code

    def residual_code(self, logits: torch.Tensor) -> int:
        p = self.params
        scores = logits.float().reshape(1, -1)
        return _choose(scores, p.subtalker_do_sample, p.subtalker_temperature, p.subtalker_top_k,
                       p.subtalker_top_p, self.generator)

