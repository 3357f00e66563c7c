"""Fidelity of a candidate model (e.g. W4A16) against a reference (bf16), measured.

For every prompt the reference generates a greedy continuation (up to
``max_new_tokens``, ending early at its end-of-sequence token). Then:

- **teacher-forced** on prompt + that continuation, both models give the
  next-token distribution at every position; we count how often their top-1
  tokens agree and average KL(reference || candidate) over all positions;
- **free-running**, the candidate generates greedily from the prompt for as
  many tokens as the reference did; the fraction of the reference's
  continuation it reproduces before the first different token is "kept", and
  a prompt whose continuation is reproduced whole is an exact match.

Both engines run in this process (``EngineCore.score`` for the logits), so
both models are resident at once.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest
from edge_infer.engine.sampling_params import SamplingParams

DEFAULT_MAX_NEW_TOKENS = 32

# The default prompt set: the demo model's domains (greetings, arithmetic, counting,
# repetition, capitals, colours, opposites) and a few it never saw.
DEFAULT_PROMPTS = (
    "Hello!",
    "Who are you?",
    "What is 7 plus 5?",
    "How much is 9 minus 4?",
    "Can you add 3 and 8?",
    "Count from 4 to 11.",
    "Please count from 12 to 19.",
    "Repeat after me: silver moon over the quiet river",
    "Say exactly this: warm bread and cold milk",
    "What is the capital of France?",
    "Which city is the capital of Kenya?",
    "What is the capital of Zorland?",
    "What language is spoken in Quentara?",
    "What color is a banana?",
    "What is the color of the ocean?",
    "What is the opposite of fast?",
    "What is the opposite of the word early?",
    "Thanks a lot.",
    "What is the weather like in Paris today?",
    "Send a message to Alice saying I am running late.",
    "Tell me a short story about a brave little bird.",
    "Explain why the sky is blue.",
    "List three things you can do.",
    "Goodbye!",
)


@dataclass
class PromptFidelity:
    prompt_tokens: int
    positions: int  # teacher-forced positions scored
    top1_agreements: int
    kl_sum: float
    reference_tokens: list[int]
    candidate_tokens: list[int]

    @property
    def kept(self) -> int:
        """Tokens of the reference continuation the candidate reproduced before the first difference."""
        n = 0
        for a, b in zip(self.reference_tokens, self.candidate_tokens):
            if a != b:
                break
            n += 1
        return n


@dataclass
class FidelityReport:
    reference: str
    candidate: str
    max_new_tokens: int
    prompts: list[PromptFidelity] = field(default_factory=list)

    @property
    def positions(self) -> int:
        return sum(p.positions for p in self.prompts)

    @property
    def top1_agreement(self) -> float:
        return sum(p.top1_agreements for p in self.prompts) / max(1, self.positions)

    @property
    def mean_kl(self) -> float:
        return sum(p.kl_sum for p in self.prompts) / max(1, self.positions)

    @property
    def greedy_kept_fraction(self) -> float:
        fractions = [p.kept / len(p.reference_tokens) for p in self.prompts if p.reference_tokens]
        return sum(fractions) / max(1, len(fractions))

    @property
    def greedy_exact_matches(self) -> int:
        return sum(1 for p in self.prompts if p.kept == len(p.reference_tokens))

    def to_dict(self) -> dict[str, Any]:
        return {
            "top1_agreement": self.top1_agreement,
            "mean_kl": self.mean_kl,
            "greedy_kept_fraction": self.greedy_kept_fraction,
            "greedy_exact_matches": self.greedy_exact_matches,
            "num_prompts": len(self.prompts),
            "num_positions": self.positions,
            "max_new_tokens": self.max_new_tokens,
            "reference": self.reference,
            "candidate": self.candidate,
            "per_prompt": [
                {**asdict(p), "kept": p.kept, "mean_kl": p.kl_sum / max(1, p.positions)} for p in self.prompts
            ],
        }


def greedy_tokens(core: EngineCore, prompt: list[int], max_tokens: int, stop_at_eos: bool) -> list[int]:
    """The greedy continuation of ``prompt`` (runs the core until this request ends)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=not stop_at_eos)
    error = core.add_request(EngineRequest("fidelity", list(prompt), params))
    if error is not None:
        raise ValueError(f"cannot generate from a {len(prompt)}-token prompt: {error.error}")
    tokens: list[int] = []
    while True:
        for delta in core.step():
            if delta.token_id is not None:
                tokens.append(delta.token_id)
            if delta.finished:
                if delta.error:
                    raise RuntimeError(delta.error)
                return tokens


def compare_prompt(reference: EngineCore, candidate: EngineCore, prompt: list[int], max_new_tokens: int) -> PromptFidelity:
    ref_tokens = greedy_tokens(reference, prompt, max_new_tokens, stop_at_eos=True)
    cand_tokens = greedy_tokens(candidate, prompt, len(ref_tokens), stop_at_eos=False)
    forced = (prompt + ref_tokens)[:-1]  # every prefix that has a next token
    ref_logp = torch.log_softmax(reference.score(forced).double(), dim=-1)
    cand_logp = torch.log_softmax(candidate.score(forced).double(), dim=-1)
    kl = (ref_logp.exp() * (ref_logp - cand_logp)).sum(-1)
    agree = ref_logp.argmax(-1) == cand_logp.argmax(-1)
    return PromptFidelity(
        prompt_tokens=len(prompt),
        positions=len(forced),
        top1_agreements=int(agree.sum()),
        kl_sum=float(kl.sum()),
        reference_tokens=ref_tokens,
        candidate_tokens=cand_tokens,
    )


def measure_fidelity(
    reference: EngineCore,
    candidate: EngineCore,
    prompts: list[list[int]],
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    reference_name: str = "reference",
    candidate_name: str = "candidate",
) -> FidelityReport:
    if reference.model.cfg.vocab_size != candidate.model.cfg.vocab_size:
        raise ValueError(
            f"the models have different vocabularies ({reference.model.cfg.vocab_size} vs "
            f"{candidate.model.cfg.vocab_size} tokens); fidelity compares two versions of one model"
        )
    report = FidelityReport(reference_name, candidate_name, max_new_tokens)
    for prompt in prompts:
        report.prompts.append(compare_prompt(reference, candidate, prompt, max_new_tokens))
    return report
