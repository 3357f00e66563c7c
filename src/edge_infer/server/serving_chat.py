"""``POST /v1/chat/completions``: messages in, an assistant message (or its chunks) out.

The chat template renders the messages (and the tools, when offered); user
messages may carry image, audio and video parts, which the frontend reads,
decodes and places (engine/media_prompt.py; the route runs this on the media
threads, so other requests keep streaming meanwhile). The
output goes through the tool-call extractor when tools are in play, and
through the JSON check when ``response_format`` asks for JSON (enforced while decoding: ``output_constraint``).
Streaming and non-streaming responses use the same extractor, so they give
the same calls.
"""
from __future__ import annotations

import json
import uuid
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from edge_infer.engine.frontend import PreparedPrompt
from edge_infer.engine.grammar import MAX_JSON_DEPTH, nesting_depth, schema_problem
from edge_infer.engine.sampling_params import SamplingParams, StructuredOutputsParams
from edge_infer.server.errors import APIError
from edge_infer.server.generation import (Generation, Sample, TokenLogprob, build_params, response_format_schema,
                                          token_text)
from edge_infer.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChoiceReport,
    FormatCheck,
    FunctionCall,
    FunctionDelta,
    NamedToolChoice,
    ResponseMessage,
    ToolCall,
    ToolCallDelta,
    ToolCallRecovery,
    ToolChoiceCheck,
    ToolMessage,
    TopLogprob,
    Usage,
    UserContent,
)
from edge_infer.server.protocol import TokenLogprob as TokenLogprobOut
from edge_infer.server.text_service import TextService
from edge_infer.server.streaming import sse, sse_done, sse_error
from edge_infer.server.tool_parsers import (
    END_TAG, PARSERS, START_TAG, ParsedCall, Recovery, ToolCallExtractor, ToolCallParser, hermes_calls_grammar,
)


@dataclass
class ChatJob:
    """A validated chat request, ready for the engine."""

    request: ChatCompletionRequest
    prompt: PreparedPrompt
    params: SamplingParams
    tools: list[dict[str, Any]] = field(default_factory=list)  # the tools offered to the model

    @property
    def prompts(self) -> list[PreparedPrompt]:
        return [self.prompt]

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools)

    @property
    def tool_choice_label(self) -> str | None:
        choice = self.request.tool_choice
        if isinstance(choice, NamedToolChoice):
            return f"function:{choice.function.name}"
        return "required" if choice == "required" else None


def _content(content: UserContent | None) -> str | list[dict[str, Any]]:
    """A message's content as the frontend reads it: text, or content parts (text parts are joined there)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return [part.model_dump(exclude_none=True) for part in content]


def _arguments(arguments: str) -> Any:
    """Templates render arguments as JSON themselves: give them the object when it is one (and not nested so
    deeply that the conversation around it would pass MAX_JSON_DEPTH: then the text, as sent)."""
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return arguments
    return value if isinstance(value, dict) and nesting_depth(value) <= MAX_JSON_DEPTH // 2 else arguments


def template_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in req.messages:
        # Chat templates know system/user/assistant/tool; OpenAI's "developer" is the system role of newer models.
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _content(m.content)}
        if isinstance(m, AssistantMessage) and m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                for c in m.tool_calls
            ]
        if isinstance(m, ToolMessage):
            d["tool_call_id"] = m.tool_call_id
        if getattr(m, "name", None):
            d["name"] = m.name
        out.append(d)
    return out


def prepare(service: TextService, req: ChatCompletionRequest) -> ChatJob:
    frontend = service.frontend
    tools: list[dict[str, Any]] = []
    if req.tools and req.tool_choice != "none":
        template = frontend.require_tokenizer().chat_template or ""
        if "tools" not in template:
            raise APIError(
                400, "this model's chat template does not take tools, so the model would never see them; "
                "serve a checkpoint whose template supports tools, or send the request without tools",
                param="tools", code="tools_unsupported",
            )
        named = req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None
        tools = [t.model_dump(exclude_none=True) for t in req.tools if named is None or t.function.name == named]
    prompt = frontend.prepare_chat(template_messages(req), req.mm_processor_kwargs, tools=tools or None,
                                   add_generation_prompt=True, **(req.chat_template_kwargs or {}))
    top = (req.top_logprobs or 0) if req.logprobs else None
    try:
        params = build_params(frontend, req, req.output_limit, top, output_constraint(service, req, tools))
    except APIError as exc:
        if exc.param != "tools" or exc.code != "invalid_parameter":
            raise
        raise _unusable_part(req, tools) or exc from None
    return ChatJob(req, prompt, params, tools)


def output_constraint(service: TextService, req: ChatCompletionRequest,
                      tools: list[dict[str, Any]]) -> StructuredOutputsParams | None:
    """What response_format and the tools ask the output to match, enforced while decoding. With tools offered,
    in the hermes call format: calls only when a call is required (tool_choice "required" or a named tool: there
    is no content for response_format to shape); otherwise the content (in response_format's JSON when asked)
    or calls, at most one without parallel_tool_calls, strict tools' arguments held to their parameters. Without
    tools, response_format's JSON alone."""
    content = response_format_schema(req.response_format)
    required = req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice)
    single = req.parallel_tool_calls is False
    strict = any(t["function"].get("strict") for t in tools)
    if not tools or not (required or single or strict or content is not None):
        return None if content is None else StructuredOutputsParams(json=content)
    if service.settings.tool_call_parser != "hermes":
        if required or strict or content is not None:
            raise APIError(400, f"strict tools, required tool calls and response_format beside tools are enforced "
                           f"for the hermes call format only; this server parses "
                           f"{service.settings.tool_call_parser!r}: drop strict, tool_choice or response_format",
                           param="tools", code="unsupported_tool_constraint")
        return None  # one call: ChoiceBuilder keeps the first
    tokenizer = service.frontend.require_tokenizer()
    tags_are_tokens = all(tokenizer.token_to_id(tag) is not None for tag in (START_TAG, END_TAG))
    return StructuredOutputsParams(grammar=hermes_calls_grammar(tools, required, not single, tags_are_tokens,
                                                                content))


def _unusable_part(req: ChatCompletionRequest, tools: list[dict[str, Any]]) -> APIError | None:
    """Which part of a refused calls' grammar is at fault, in its own words (llguidance's about the whole grammar
    quote all of it): response_format's schema or a held tool's parameters. Checked on this error path only."""
    if (content := response_format_schema(req.response_format)) is not None and (problem := schema_problem(content)):
        return APIError(400, f"the response_format schema is not usable: {problem}", param="response_format",
                        code="invalid_parameter")
    required = req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice)
    offered = {t["function"]["name"] for t in tools}
    for i, tool in enumerate(req.tools or ()):
        fn = tool.function
        if (required or fn.strict) and fn.name in offered and fn.parameters and (problem := schema_problem(fn.parameters)):
            return APIError(400, f"tools[{i}].function.parameters is not a JSON Schema the arguments can be held to: "
                                 f"{problem}", param=f"tools[{i}].function.parameters", code="invalid_parameter")
    return None


class ChoiceBuilder:
    """One choice's content, tool calls and report, fed as text arrives (or all at once)."""

    def __init__(self, service: TextService, job: ChatJob, sample: Sample):
        self.service = service
        self.job = job
        self.sample = sample
        self.parser: ToolCallParser | None = PARSERS[service.settings.tool_call_parser](job.tools) if job.parses_tools else None
        self.extractor = ToolCallExtractor(self.parser) if self.parser else None
        self.calls: list[ToolCall] = []
        self.recoveries: list[Recovery] = []
        self._blank = ""  # the content so far while it is all whitespace: held until it is known to be content
        self._shown = False  # content other than whitespace came: the rest is shown as it comes

    def feed(self, text: str) -> tuple[str, list[tuple[int, ToolCall]]]:
        """Content to show and new tool calls from a piece of output text."""
        if self.extractor is None:
            return text, []
        events = self.extractor.feed(text)
        calls = self._add(events.calls, events.recoveries)
        return self._show(events.content, end=False), calls

    def finish(self) -> tuple[str, list[tuple[int, ToolCall]]]:
        if self.extractor is None:
            return "", []
        events = self.extractor.finish(cut_off=self.sample.finish_reason == "length")
        calls = self._add(events.calls, events.recoveries)
        return self._show(events.content, end=True), calls

    def _show(self, content: str, end: bool) -> str:
        """Content as a stream may send it: a message whose content is only whitespace beside its calls has none
        (``complete``), so whitespace is held until text follows, or the output ends without calls."""
        if self._shown:
            return content
        self._blank += content
        if not (self._blank.strip() or (end and not self.calls)):
            return ""
        self._shown = True
        content, self._blank = self._blank, ""
        return content

    def _add(self, calls: list[tuple[int, ParsedCall]], recoveries: list[Recovery]) -> list[tuple[int, ToolCall]]:
        new = []
        for index, call in calls:
            if index and self.job.request.parallel_tool_calls is False:  # a format no grammar holds to one call
                recoveries = [r for r in recoveries if r.call_index != index]  # its repairs went with it
                recoveries.append(Recovery(None, f"call {index + 1} ({call.name}) while parallel_tool_calls is false",
                                           "dropped it", False))
                continue
            tc = ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=call.name, arguments=call.arguments))
            self.calls.append(tc)
            new.append((index, tc))
        for rec in recoveries:
            self.service.metrics.tool_call_recoveries.labels(self.parser.name, "recovered" if rec.recovered else "unrecoverable").inc()
        self.recoveries += recoveries
        return new

    def finish_reason(self) -> str | None:
        """"tool_calls" when the output ends with its calls; cut off by max_tokens after anything else (a call
        half written, more text) it stays "length"."""
        ended = self.sample.finish_reason == "stop" or (
            self.sample.finish_reason == "length" and self.sample.text.rstrip().endswith(END_TAG))
        return "tool_calls" if self.calls and ended else self.sample.finish_reason

    def report(self, content: str) -> ChoiceReport | None:
        rep = ChoiceReport()
        if self.recoveries:
            rep.tool_call_recovery = [
                ToolCallRecovery(index=r.call_index, parser=self.parser.name, problem=r.problem, action=r.action, recovered=r.recovered)
                for r in self.recoveries
            ]
        fmt = self.job.request.response_format
        if fmt is not None and fmt.type != "text" and not (self.calls and not content.strip()):  # calls, no content
            rep.response_format = check_json_output(content, fmt.type)
            self.service.metrics.format_checks.labels(str(rep.response_format.valid).lower()).inc()
        label = self.job.tool_choice_label
        if label is not None:
            name = label.partition(":")[2]
            rep.tool_choice = ToolChoiceCheck(requested=label, met=any(not name or c.function.name == name for c in self.calls))
        return rep if rep.model_fields_set else None


def check_json_output(text: str, kind: str) -> FormatCheck:
    """The JSON the grammar enforced, checked once more as the client will read it: it fails only when
    decoding stopped before the value was complete (max_tokens, or a grammar dead end)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return FormatCheck(type=kind, valid=False, error=f"not valid JSON: {exc}")
    if kind == "json_object" and not isinstance(value, dict):
        return FormatCheck(type=kind, valid=False, error=f"valid JSON but a {type(value).__name__}, not an object")
    return FormatCheck(type=kind, valid=True)


def chat_logprobs(service: TextService, items: list[TokenLogprob]) -> ChatLogprobs:
    tokenizer = service.frontend.require_tokenizer()

    def entry(tid: int, lp: float) -> TopLogprob:
        # The token's own bytes: a character split between two tokens reads U+FFFD in each one's text.
        return TopLogprob(token=token_text(service.frontend, tid), logprob=lp, bytes=list(tokenizer.token_bytes(tid)))

    out = []
    for item in items:
        chosen = entry(item.token_id, item.logprob)
        out.append(TokenLogprobOut(**chosen.model_dump(), top_logprobs=[entry(t, lp) for t, lp in item.top]))
    return ChatLogprobs(content=out)



async def complete(service: TextService, job: ChatJob, gen: Generation) -> ChatCompletionResponse:
    samples = await gen.collect()
    failure = gen.failure()
    if failure is not None:
        raise failure
    choices = []
    for s in samples:
        builder = ChoiceBuilder(service, job, s)
        content, _ = builder.feed(s.text)
        rest, _ = builder.finish()
        content += rest
        if builder.calls and not content.strip():
            content = None
        message = ResponseMessage(content=content, tool_calls=builder.calls or None)
        choices.append(
            ChatChoice(
                index=s.index, message=message, finish_reason=builder.finish_reason(),
                logprobs=chat_logprobs(service, s.logprobs) if job.request.logprobs else None,
                edge_infer=builder.report(content or ""),
            )
        )
    return ChatCompletionResponse(id=f"chatcmpl-{gen.id}", model=service.settings.served_model_name, choices=choices, usage=gen.usage())


def _tool_deltas(calls: list[tuple[int, ToolCall]]) -> list[ToolCallDelta] | None:
    if not calls:
        return None
    return [
        ToolCallDelta(index=i, id=c.id, type="function", function=FunctionDelta(name=c.function.name, arguments=c.function.arguments))
        for i, c in calls
    ]


async def stream(service: TextService, job: ChatJob, gen: Generation) -> AsyncIterator[str]:
    req = job.request
    ident = f"chatcmpl-{gen.id}"
    model = service.settings.served_model_name
    created = int(time.time())

    def chunk(*choices: ChatChunkChoice, usage_: Usage | None = None) -> str:
        return sse(ChatCompletionChunk(id=ident, created=created, model=model, choices=list(choices), usage=usage_))

    builders = {s.index: ChoiceBuilder(service, job, s) for s in gen.samples}
    contents = {i: "" for i in builders}
    for i in builders:
        yield chunk(ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content="")))
    async for s, event in gen.events():
        b = builders[s.index]
        if event.kind == "token":
            text, calls = b.feed(event.text)
            contents[s.index] += text
            new_logprobs = s.take_logprobs() if req.logprobs and event.token_ids else []
            if text or calls or new_logprobs:
                yield chunk(ChatChunkChoice(
                    index=s.index, delta=ChatDelta(content=text or None, tool_calls=_tool_deltas(calls)),
                    logprobs=chat_logprobs(service, new_logprobs) if new_logprobs else None,
                ))
            continue
        text, calls = b.finish()
        contents[s.index] += text
        if event.kind in ("finished",) or (event.kind == "cancelled" and gen.cancel_reason is None):
            yield chunk(ChatChunkChoice(
                index=s.index, delta=ChatDelta(content=text or None, tool_calls=_tool_deltas(calls)),
                finish_reason=b.finish_reason(), edge_infer=b.report(contents[s.index]),
            ))
        else:  # the error ends the response for every choice
            yield sse_error(gen.failure() or APIError(500, "generation failed"))
            gen.cancel(None)
            break
    if req.stream_options is not None and req.stream_options.include_usage:
        yield chunk(usage_=gen.usage())
    yield sse_done()
