"""``POST /v1/completions``: raw prompts (text or token ids, one or several) in, text out.

Choice ``i * n + k`` is sample ``k`` of prompt ``i``, as OpenAI numbers them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AbstractSet, AsyncIterator

from edge_infer.engine.frontend import PreparedPrompt
from edge_infer.engine.sampling_params import SamplingParams, StructuredOutputsParams
from edge_infer.server.errors import APIError
from edge_infer.server.generation import (Generation, Sample, TextOffsets, TokenLogprob, build_params,
                                          response_format_schema, token_text)
from edge_infer.server.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, Usage
from edge_infer.server.text_service import TextService
from edge_infer.server.streaming import sse, sse_done, sse_error


@dataclass
class CompletionJob:
    request: CompletionRequest
    prompts: list[PreparedPrompt]
    params: SamplingParams


def prepare(service: TextService, req: CompletionRequest) -> CompletionJob:
    prompts = [service.frontend.prepare(prompt) for prompt in req.prompts]
    schema = response_format_schema(req.response_format)
    params = build_params(service.frontend, req, req.max_tokens, req.logprobs,
                          None if schema is None else StructuredOutputsParams(json=schema))
    if req.echo and req.logprobs is not None:  # an echoed prompt comes with its logprobs (what evaluators score)
        params = params.clone(prompt_logprobs=req.logprobs)
    return CompletionJob(req, prompts, params)


def _echo(service: TextService, job: CompletionJob, s: Sample) -> str:
    if not job.request.echo:
        return ""
    prompt = job.prompts[s.prompt_index]
    return prompt.prompt if prompt.prompt is not None else service.frontend.require_tokenizer().decode(prompt.token_ids)


def generated_offsets(service: TextService, job: CompletionJob, s: Sample) -> TextOffsets:
    """Offsets of a choice's generated tokens: after its echo, decoded as its text is."""
    return TextOffsets(service.frontend, job.params.skip_special_tokens, start=len(_echo(service, job, s)))


def added_around_text(service: TextService, prompt: PreparedPrompt) -> set[int]:
    """Positions of a text prompt's tokens the tokenizer added around its text (a BOS): its echo does not hold them."""
    if prompt.prompt is None:
        return set()
    bare = service.frontend.require_tokenizer().encode(prompt.prompt, add_special_tokens=False)
    ids = prompt.token_ids
    for lead in range(len(ids) - len(bare) + 1):
        if ids[lead : lead + len(bare)] == bare:
            return set(range(lead)) | set(range(lead + len(bare), len(ids)))
    return set()


def completion_logprobs(service: TextService, items: list[TokenLogprob], offsets: TextOffsets,
                        out: CompletionLogprobs | None = None,
                        outside_text: AbstractSet[int] = frozenset()) -> CompletionLogprobs:
    """OpenAI's logprobs of ``items`` (appended to ``out``); ``offsets`` was fed the tokens of the text before them;
    the items at ``outside_text`` are not in the text (they begin where the next one does)."""
    if out is None:
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    for i, item in enumerate(items):
        text = token_text(service.frontend, item.token_id)
        out.tokens.append(text)
        out.token_logprobs.append(item.logprob)
        out.top_logprobs.append(None if item.top is None else _top_by_text(service, item.top))
        out.text_offset.append(offsets.next(item.token_id, in_text=i not in outside_text))
    return out


def _top_by_text(service: TextService, top: list[tuple[int, float]]) -> dict[str, float]:
    """OpenAI keys alternatives by their text; of two tokens with the same text (e.g. byte pieces shown as
    U+FFFD) the more likely one is kept."""
    out: dict[str, float] = {}
    for t, lp in top:  # most likely first
        out.setdefault(token_text(service.frontend, t), lp)
    return out


def echo_logprobs(service: TextService, job: CompletionJob, s: Sample) -> CompletionLogprobs:
    """The echoed prompt's logprobs, each token placed in the echoed text: a text prompt is echoed as sent, its
    special-token strings included, and a BOS the tokenizer added covers nothing."""
    prompt = job.prompts[s.prompt_index]
    offsets = TextOffsets(service.frontend, skip_special_tokens=prompt.prompt is None)
    return completion_logprobs(service, echoed_logprobs(job, s), offsets, outside_text=added_around_text(service, prompt))


def echoed_logprobs(job: CompletionJob, s: Sample) -> list[TokenLogprob]:
    """The echoed prompt's tokens with their logprobs: none for the first (nothing precedes it)."""
    ids = job.prompts[s.prompt_index].token_ids
    scored = s.prompt_logprobs or []
    return [TokenLogprob(ids[0], None, None), *(TokenLogprob(t, lp, top) for t, (lp, top) in zip(ids[1:], scored))]



async def complete(service: TextService, job: CompletionJob, gen: Generation) -> CompletionResponse:
    samples = await gen.collect()
    failure = gen.failure()
    if failure is not None:
        raise failure
    choices = []
    for s in samples:
        echo = _echo(service, job, s)
        logprobs = None
        if job.request.logprobs is not None:
            if echo:
                logprobs = echo_logprobs(service, job, s)
            logprobs = completion_logprobs(service, s.logprobs, generated_offsets(service, job, s), logprobs)
        choices.append(CompletionChoice(index=s.index, text=echo + s.text, logprobs=logprobs, finish_reason=s.finish_reason))
    return CompletionResponse(id=f"cmpl-{gen.id}", model=service.settings.served_model_name, choices=choices, usage=gen.usage())


async def stream(service: TextService, job: CompletionJob, gen: Generation) -> AsyncIterator[str]:
    req = job.request
    ident = f"cmpl-{gen.id}"
    model = service.settings.served_model_name
    created = int(time.time())

    def chunk(*choices: CompletionChoice, usage_: Usage | None = None) -> str:
        return sse(CompletionResponse(id=ident, created=created, model=model, choices=list(choices), usage=usage_))

    offsets = {s.index: generated_offsets(service, job, s) for s in gen.samples}
    scored_echo = req.echo and req.logprobs is not None  # the echo waits for its logprobs (the prefill's)
    for s in gen.samples:
        echo = _echo(service, job, s)
        if echo and not scored_echo:
            yield chunk(CompletionChoice(index=s.index, text=echo, finish_reason=None))
    async for s, event in gen.events():
        if scored_echo and event.prompt_logprobs is not None:
            echoed = echo_logprobs(service, job, s)
            yield chunk(CompletionChoice(index=s.index, text=_echo(service, job, s), logprobs=echoed, finish_reason=None))
        if event.kind == "token":
            logprobs = None
            if req.logprobs is not None and event.token_ids:
                logprobs = completion_logprobs(service, s.take_logprobs(), offsets[s.index])
            if event.text or logprobs is not None:
                yield chunk(CompletionChoice(index=s.index, text=event.text, logprobs=logprobs, finish_reason=None))
        elif event.kind == "finished" or (event.kind == "cancelled" and gen.cancel_reason is None):
            yield chunk(CompletionChoice(index=s.index, text="", finish_reason=s.finish_reason))
        else:  # the error ends the response for every choice
            yield sse_error(gen.failure() or APIError(500, "generation failed"))
            gen.cancel(None)
            break
    if req.stream_options is not None and req.stream_options.include_usage:
        yield chunk(usage_=gen.usage())
    yield sse_done()
