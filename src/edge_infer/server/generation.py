"""One API call's engine requests: n samples of each prompt, as one merged event stream.

A ``Generation`` starts its engine requests at once (so that a prompt that
does not fit is a 400 before any byte is streamed), merges their events
while keeping each stream's back-pressure, keeps each sample's text, tokens
and logprobs, feeds the latency metrics, and cancels what is left when the
client goes away or the server shuts down.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

from edge_infer.engine.frontend import PreparedPrompt
from edge_infer.engine.media_gate import MediaSlots
from edge_infer.engine.protocol import TokenLogprobs
from edge_infer.engine.grammar import checked_grammar
from edge_infer.engine.sampling_params import SamplingParams, StructuredOutputsParams
from edge_infer.engine.streams import RequestStream, StreamEvent
from edge_infer.engine.frontend import Frontend
from edge_infer.errors import GrammarLimitError, InvalidRequestError
from edge_infer.server.errors import APIError
from edge_infer.server.protocol import PromptTokensDetails, ResponseFormat, SamplingFields, Usage

if TYPE_CHECKING:
    from edge_infer.server.text_service import TextService

# Undelivered events buffered per streamed sample; beyond that its decoding waits for the client.
STREAM_BUFFER_CHUNKS = 64
_ids = itertools.count()


# Request fields passed to SamplingParams only when the client set them (else the checkpoint's defaults hold).
_OPTIONAL_SAMPLING = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
)


def build_params(frontend: Frontend, req: SamplingFields, max_tokens: int | None, logprobs: int | None,
                 structured: StructuredOutputsParams | None = None) -> SamplingParams:
    """The request's sampling over the checkpoint's generation_config.json defaults; ``structured``: what the
    output must match, when the request's guided_* fields do not say. Its grammar is checked here, once for all
    the request's samples (this runs on the preparation thread, not the event loop)."""
    overrides = {k: getattr(req, k) for k in _OPTIONAL_SAMPLING if getattr(req, k) is not None}
    if req.guided:
        structured = StructuredOutputsParams(**req.guided)
    if structured is not None:
        try:
            structured = checked_grammar(structured)
        except InvalidRequestError as exc:  # the field it came from, for the error's param
            raise APIError(400, str(exc), param=_structured_field(req),
                           code="grammar_limit" if isinstance(exc, GrammarLimitError) else "invalid_parameter") from exc
    bias = {int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None
    return frontend.default_params(
        **overrides, n=req.n, stop=req.stop, ignore_eos=req.ignore_eos, max_tokens=max_tokens, logprobs=logprobs,
        structured_outputs=structured, logit_bias=bias, min_tokens=req.min_tokens or 0,
        stop_token_ids=req.stop_token_ids, include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
    )


def _structured_field(req: Any) -> str:
    """The request field a structured-output spec came from."""
    if req.structured_outputs is not None:
        return "structured_outputs"
    if req.guided:
        return f"guided_{next(iter(req.guided))}"
    return "tools" if getattr(req, "tools", None) and getattr(req, "tool_choice", None) != "none" else "response_format"


def response_format_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The JSON schema response_format holds the output to (any object for json_object); None for text."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema" and fmt.json_schema.schema_ is not None:
        return fmt.json_schema.schema_
    return {"type": "object"}


def token_text(frontend: Frontend, token_id: int) -> str:
    """One token as text, special tokens included (logprobs show what the model chose)."""
    return frontend.require_tokenizer().decode([token_id], skip_special_tokens=False)


class TextOffsets:
    """Where each of a text's tokens begins in it, in characters, fed the tokens in order and decoded as the
    text was: a token that ends inside a character (its own decode reads U+FFFD) and the one completing it
    begin where that character does; a special token the text skips covers nothing."""

    def __init__(self, frontend: Frontend, skip_special_tokens: bool, start: int = 0) -> None:
        self._decoder = frontend.require_tokenizer().decode_stream(skip_special_tokens)
        self._start = start

    def next(self, token_id: int, in_text: bool = True) -> int:
        """The offset of ``token_id``; one not ``in_text`` (a BOS the tokenizer added to a prompt) covers nothing."""
        offset = self._start + self._decoder.emitted
        if in_text:
            self._decoder.step(token_id)
        return offset


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float | None  # None: the first token of an echoed prompt
    top: list[tuple[int, float]] | None


@dataclass
class Sample:
    index: int  # the choice index
    prompt_index: int
    stream: RequestStream
    submitted_at: float
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1.., when asked
    finish_reason: str | None = None
    error: str | None = None
    last_token_at: float | None = None
    num_cached_tokens: int = 0  # of its prompt, found in the prefix cache

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None

    def take_logprobs(self) -> list[TokenLogprob]:
        """The logprobs not yet taken, let go: a stream sends each token's once (kept, they grow ~4 KB a token at
        20 alternatives for as long as the response runs; found by a memory probe)."""
        taken, self.logprobs = self.logprobs, []
        return taken


class Generation:
    def __init__(self, service: "TextService", prompts: list[PreparedPrompt], params: SamplingParams, stream: bool,
                 media: MediaSlots | None = None):
        self.service = service
        self.id = f"{next(_ids)}-{int(time.time() * 1000) % 10**10}"
        self.prompts = prompts
        self.samples: list[Sample] = []
        self.cancel_reason: str | None = None
        engine = service.engine
        try:
            for p, prompt in enumerate(prompts):
                for k in range(params.n):
                    sub = params.for_sample(k)
                    rid = f"{self.id}-{p}-{k}"
                    s = engine.add_request(prompt, sub, request_id=rid, max_chunks=STREAM_BUFFER_CHUNKS if stream else None,
                                           media_slots=media)
                    self.samples.append(Sample(len(self.samples), p, s, time.time()))
        except Exception:
            self.cancel(None)
            raise
        for prompt in prompts:  # the engine has the media now; the response needs their token ids only
            prompt.media = []
        service.metrics.prompt_tokens.inc(self.prompt_tokens)
        service.live.add(self)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    def usage(self) -> Usage:
        prompt, completion = self.prompt_tokens, self.completion_tokens
        per_prompt = len(self.samples) // len(self.prompts)
        cached = sum(s.num_cached_tokens for s in self.samples if s.index % per_prompt == 0)  # sample 0 of each prompt
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    def cancel(self, reason: str | None) -> None:
        """End every sample still running (the engine frees its KV blocks)."""
        if reason is not None and self.cancel_reason is None:
            self.cancel_reason = reason
        for s in self.samples:
            if not s.stream.ended:
                self.service.engine.cancel_nowait(s.stream.request_id)
            self._end(s, "abort")  # counted now: nobody may read the stream's cancelled event

    def close(self) -> None:
        self.cancel(None)
        self.service.live.discard(self)

    async def events(self) -> AsyncIterator[tuple[Sample, StreamEvent]]:
        """Every sample's events, as they come; ends when all samples have ended."""
        if len(self.samples) == 1:
            s = self.samples[0]
            async for event in s.stream:
                self._apply(s, event)
                yield s, event
            return
        pending = {asyncio.ensure_future(s.stream.get()): s for s in self.samples}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: pending[f].index):
                    s = pending.pop(fut)
                    event = fut.result()
                    self._apply(s, event)
                    yield s, event
                    if not event.terminal:
                        pending[asyncio.ensure_future(s.stream.get())] = s
        finally:
            for fut in pending:
                fut.cancel()

    async def collect(self) -> list[Sample]:
        async for _ in self.events():
            pass
        return self.samples

    def failure(self) -> APIError | None:
        """Why the samples did not all end normally, as the error to answer with."""
        if self.cancel_reason is not None and any(s.finish_reason == "abort" for s in self.samples):
            return APIError(503, f"the request was cancelled: {self.cancel_reason}", code="cancelled")
        errors = [s.error for s in self.samples if s.error]
        if not errors:
            return None
        if not self.service.engine.healthy:
            return self.service.engine_failed(f"the engine worker is down: {errors[0]}")
        return APIError(500, f"generation failed: {errors[0]}")

    def _apply(self, s: Sample, event: StreamEvent) -> None:
        metrics = self.service.metrics
        if event.prompt_logprobs is not None:
            s.prompt_logprobs = event.prompt_logprobs
        s.num_cached_tokens = max(s.num_cached_tokens, event.num_cached_tokens)
        if event.kind == "token":
            s.text += event.text
            if event.token_ids:
                s.token_ids += event.token_ids
                metrics.generation_tokens.inc(len(event.token_ids))
                if s.last_token_at is None:
                    metrics.ttft.observe(max(0.0, event.time - s.submitted_at))
                else:
                    metrics.itl.observe(max(0.0, event.time - s.last_token_at))
                s.last_token_at = event.time
            for tid, (lp, top) in zip(event.token_ids, event.logprobs or []):
                s.logprobs.append(TokenLogprob(tid, lp, top))
            return
        reason = event.finish_reason or ("abort" if event.kind == "cancelled" else "error")
        self._end(s, reason, (event.error or "the engine reported an error") if event.kind == "error" else None)

    def _end(self, s: Sample, reason: str, error: str | None = None) -> None:
        if s.ended:
            return
        s.finish_reason, s.error = reason, error
        self.service.metrics.finished.labels(reason).inc()
        self.service.metrics.e2e.observe(max(0.0, time.time() - s.submitted_at))
