"""Results of the offline API (vLLM-compatible names)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # one dict per generated token: token id -> Logprob (the chosen token and the top alternatives)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    encode_time: float = 0.0  # seconds the engine spent encoding the request's media (images, audio, video)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: RequestMetrics | None = None
    error: str | None = None
    # with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (as vLLM)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens whose KV the prefix cache held (not computed)
    extra: dict = field(default_factory=dict)

    @property
    def finish_reason(self) -> str | None:
        """The first completion's finish reason (``stop``, ``length``, ``abort``, ``error``)."""
        return self.outputs[0].finish_reason if self.outputs else None
