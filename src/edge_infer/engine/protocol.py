"""Messages between a frontend (LLM, LocalTextEngine, server) and the engine core.

The core speaks token ids only; text (detokenization, stop strings) lives in
the frontend. Everything here is picklable: in the default set-up the core
runs in a worker process and these travel over a pipe.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from edge_infer.engine.sampling_params import SamplingParams


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Tokens the core may produce ahead of the consumer; None = unbounded.
    credits: int | None = None
    arrival_time: float = field(default_factory=time.time)


@dataclass
class TokenDelta:
    """One request's progress in one step: a new token, an end, or both."""

    request_id: str
    token_id: int | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    stop_reason: int | None = None  # the stop token id, when one ended the request
    num_prompt_tokens: int = 0
    num_preemptions: int = 0
    error: str | None = None


@dataclass
class CoreStats:
    num_waiting: int = 0
    num_running: int = 0
    num_paused: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    num_preemptions: int = 0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    steps: int = 0


@dataclass
class ReadyInfo:
    """What the core reports once loaded: the figures a plan is checked against."""

    pid: int
    dtype: str
    weight_bytes: int
    kv_cache_bytes: int
    kv_blocks: int
    rope_bytes: int
    weight_kernels: dict[str, int]  # kernel name -> linears holding it
    linear_kernels: dict[str, str]  # linear kind (decoder linears, output head, embedding lookup) -> kernel
    num_threads: int
    load_s: float
    trimmed_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)
