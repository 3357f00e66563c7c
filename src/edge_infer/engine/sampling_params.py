"""``SamplingParams``: how one request is decoded (vLLM-compatible names)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any

from edge_infer.errors import InvalidRequestError

_GREEDY_EPS = 1e-5
# torch generators take seeds in [-2**63, 2**64); a prompt's n samples take seed, seed + 1, ... modulo 2**64.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
_INT_FIELDS = ("n", "top_k", "min_tokens")
_OPTIONAL_INT_FIELDS = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")

# OpenAI's bound on logit_bias values; at -100 a token is in effect banned, at 100 forced.
LOGIT_BIAS_LIMIT = 100.0


def token_id_list(values: Any, what: str) -> list[int]:
    """``values`` as token ids: whole numbers (numpy's and arrays and tensors of them too), not booleans; 3.7 used to
    become token 3."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidRequestError(f"{what} must be a list of token ids, not {type(values).__name__}")
    ids = values.tolist() if hasattr(values, "tolist") else list(values)  # an array's or tensor's items as Python's
    if not isinstance(ids, list):
        raise InvalidRequestError(f"{what} must be a list of token ids, not a 0-d {type(values).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise InvalidRequestError(f"{what} holds {t!r} at index {i}; token ids are whole numbers")
    return [int(t) for t in ids]


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What the output must match: exactly one of a JSON schema, any JSON object, a regular expression, one
    of a list of strings, or a grammar (Lark in llguidance's dialect, or GBNF as llama.cpp writes it).
    Enforced while decoding, as a token mask (engine/grammar.py). vLLM's names."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        given = self._given()
        if len(given) != 1:
            raise InvalidRequestError(
                "structured output takes exactly one of json, json_object, regex, choice and grammar, got "
                + (", ".join(given) if given else "none"))
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise InvalidRequestError("choice must be a non-empty list of non-empty strings")
        if self.grammar is not None and not self.grammar.strip():
            raise InvalidRequestError("the grammar for structured output is empty; send its rules (Lark or GBNF)")

    def _given(self) -> list[str]:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        return given + (["json_object"] if self.json_object else [])

    @property
    def kind(self) -> str:
        """Which one was given: json, json_object, regex, choice or grammar."""
        return self._given()[0]


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None  # number of top alternatives per token (0: only the chosen one)
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (scoring)
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._check_types()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = token_id_list([] if self.stop_token_ids is None else self.stop_token_ids, "stop_token_ids")
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias is not None:
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()}
        self.validate()

    def _check_types(self) -> None:
        """Counts are whole numbers (numpy's too) and knobs real numbers, as the engine worker takes them:
        a float top_k or an out-of-range seed failed there, and the seed took the worker down."""
        for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INT_FIELDS:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidRequestError(f"{name} must be a whole number, got {value!r}")
            setattr(self, name, int(value))
        for name in _FLOAT_FIELDS:  # their ranges (NaN and infinities out) are validate's
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise InvalidRequestError(f"{name} must be a number, got {value!r}")
            setattr(self, name, float(value))
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise InvalidRequestError(f"seed must be in [-2**63, 2**64 - 1], got {self.seed}")

    def validate(self) -> None:
        def bad(msg: str) -> None:
            raise InvalidRequestError(msg)

        if self.n < 1:
            bad(f"n must be at least 1, got {self.n}")
        if self.max_tokens is not None and self.max_tokens < 0:
            bad(f"max_tokens must be at least 0 (0: only process the prompt), got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            bad(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            bad(f"top_k must be 0 or -1 (disabled) or a positive count, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            bad(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2 <= self.presence_penalty <= 2:
            bad(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2 <= self.frequency_penalty <= 2:
            bad(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            bad(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            bad(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 20:
                bad(f"{name} must be between 0 and 20, got {value}")
        if any(not s for s in self.stop):
            bad("stop strings must be non-empty")
        for token, bias in (self.logit_bias or {}).items():
            if token < 0:
                bad(f"logit_bias token id {token} is negative")
            if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
                bad(f"logit_bias for token {token} is {bias}; biases must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone(self, **changes: Any) -> "SamplingParams":
        return replace(self, **changes)

    def for_sample(self, k: int) -> "SamplingParams":
        """The parameters of sample ``k`` of the n: one sample, seeded seed + k (in the generators' range), or
        unseeded (an independent draw)."""
        return self.clone(n=1, seed=None if self.seed is None else (self.seed + k) % (SEED_MAX + 1))

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}
