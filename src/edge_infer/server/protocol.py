"""OpenAI request and response shapes, apart from the serving logic.

Bounds live here, on the fields, so that they are part of the published
OpenAPI document and a request outside them is refused with a 400 naming the
field before anything reaches the engine. Fields that OpenAI defines but
edge-infer cannot honour (``suffix``, ``best_of``) are
declared so that using them is refused with a clear message instead of
being ignored.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, SerializerFunctionWrapHandler, Tag,
                      field_validator, model_serializer, model_validator)

from edge_infer.engine.grammar import MAX_JSON_DEPTH
from edge_infer.engine.media_prompt import MEDIA_PARTS
from edge_infer.engine.sampling_params import SEED_MAX, SEED_MIN

log = logging.getLogger(__name__)

# n samples of one prompt; more is never admitted on an edge box anyway.
MAX_N = 16
MAX_TOP_LOGPROBS = 20
# Item counts a request may hold, checked before its items are validated: each costs ~0.5-1 KB validated whatever
# its bytes ({"type":"text","text":""} is 25), and each bad one a validation error of as much. Above what a 96k-token
# context holds (a message is at least ~6 tokens of chat template, a text part 2).
MAX_MESSAGES = 16384
MAX_MESSAGE_ITEMS = 32768  # content parts and tool calls, over all messages
MAX_TOOLS = 128
MAX_CHOICES = 1024  # guided_choice strings
MAX_LOGIT_BIAS = 1024
MAX_PROMPT_TOKEN_IDS = 1 << 20
TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")  # a logit_bias key: vocabularies stay far below 10**10
# Chat template variables edge-infer sets (from the request, the checkpoint, or its own options to the rendering),
# which chat_template_kwargs may not override; the template's own functions are refused where it renders.
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "continue_final_message", "documents",
                                "bos_token", "eos_token", "pad_token", "unk_token", "mm_processor_kwargs",
                                "specials_in_content"})


def at_most(limit: int, what: str) -> BeforeValidator:
    """Refuse a list or object of more than ``limit`` items before any item is validated (pydantic's max_length
    counts after validating them all, one error per bad item)."""

    def check(value: Any) -> Any:
        if isinstance(value, (list, dict)) and len(value) > limit:
            raise ValueError(f"at most {limit} {what} per request, got {len(value)}")
        return value

    return BeforeValidator(check)


class _Request(BaseModel):
    # Unknown fields are tolerated (clients send newer ones) and logged by the server (UnknownFields). Types are
    # strict, as OpenAI's are: "max_tokens": "4" or "stream": "yes" is a 400, not a guess.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


class UnknownFields:
    """A route's log of the request fields it does not know: each named once, as a warning (they change nothing)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def note(self, body: BaseModel) -> None:
        new = set(body.model_extra or ()) - self.seen
        if new:
            self.seen |= new
            log.warning("ignoring request fields edge-infer does not know: %s", ", ".join(sorted(new)))


def body_problem(value: Any) -> str | None:
    """Where ``value`` (parsed JSON) holds text that is not valid Unicode — a lone UTF-16 surrogate, which
    JSON's \\u escapes can spell but UTF-8 cannot — or nests deeper than MAX_JSON_DEPTH, as a message naming
    the field; None when all is well. One pass, without recursion."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH and isinstance(item, (dict, list)):
            where = ".".join(map(str, path[:6]))
            return (f"{where}...: nests more than {MAX_JSON_DEPTH} levels deep, more than edge-infer takes; "
                    "flatten it (a schema: with $defs and $ref)")
        if isinstance(item, str):
            if item.isascii():
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = ".".join(map(str, path)) or "the request"
                return (f"{where}: text is not valid Unicode (a lone surrogate U+{ord(item[exc.start]):04X} at "
                        f"character {exc.start}); send UTF-8 text")
        elif isinstance(item, dict):  # pushed last to first: the first culprit in the body is named
            for key, member in reversed(item.items()):
                stack.append((member, (*path, key)))
                stack.append((key, path))
        elif isinstance(item, list) and item and isinstance(item[0], (str, dict, list)):
            # lists of numbers (token ids) are left to the field types: only text can be invalid here
            stack.extend((item[i], (*path, i)) for i in range(len(item) - 1, -1, -1))
    return None


class _TopRequest(_Request):
    """A whole request body: its text is checked to be valid Unicode before any field is read."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        problem = body_problem(data)
        if problem is not None:
            raise ValueError(problem)
        return data


class _Response(BaseModel):
    pass


class _KeepNulls(_Response):
    """Responses are sent without null fields; the fields named here are sent even when null."""

    _keep_null: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _with_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        for name in self._keep_null:
            out.setdefault(name, None)
        return out


# -- errors ----------------------------------------------------------------------


class ErrorInfo(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorInfo


# -- shared request fields ---------------------------------------------------------

Stop = Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=16)]]


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool | None = Field(None, description="not served (vLLM's usage in every chunk): false")

    @model_validator(mode="after")
    def _check_usage(self) -> "StreamOptions":
        if self.continuous_usage_stats:
            raise ValueError("continuous_usage_stats is not served; include_usage gives the usage in the last chunk")
        return self


class StructuredOutputs(_Request):
    """vLLM's structured_outputs object (its newer name for the guided_* fields): exactly one of them."""

    model_config = ConfigDict(extra="forbid", strict=True)
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_CHOICES),
                      at_most(MAX_CHOICES, "choice strings")] | None = None
    grammar: str | None = None

    @model_validator(mode="after")
    def _one(self) -> "StructuredOutputs":
        if len(self.given) != 1:
            raise ValueError("takes exactly one of json, json_object, regex, choice and grammar")
        return self

    @property
    def given(self) -> dict[str, Any]:
        return {name: value for name, value in (("json", self.json_), ("json_object", self.json_object or None),
                                                ("regex", self.regex), ("choice", self.choice),
                                                ("grammar", self.grammar)) if value is not None}


class NotServed:
    """Fields of OpenAI's and vLLM's that would change the output and that edge-infer does not serve, with what to
    do instead: declared on the requests, so that sending one is a 400 naming it (an undeclared field is ignored
    and logged: clients send newer, harmless ones). A value in ``harmless`` (the field's default) passes."""

    def __init__(self, advice: str, harmless: tuple = (None, False)):
        self.advice, self.harmless = advice, harmless

    def check(self, name: str, value: Any) -> None:
        if not any(value == h and type(value) is type(h) for h in self.harmless):
            raise ValueError(f"{name} is not served by edge-infer; {self.advice}")


NOT_SERVED_FIELD = Field(None, description="not served: a 400 unless absent or its default")


def refuse_not_served(fields: dict[str, NotServed]) -> Any:
    """A field validator refusing ``fields`` (declared ``Any = NOT_SERVED_FIELD``) when sent with a value that
    matters."""

    def check(cls: Any, value: Any, info: Any) -> Any:
        fields[info.field_name].check(info.field_name, value)
        return value

    return field_validator(*fields)(classmethod(check))


SAMPLING_NOT_SERVED = {
    "bad_words": NotServed("ban their tokens with logit_bias -100", (None, [])),
    "allowed_token_ids": NotServed("ban the other tokens with logit_bias -100"),
    "use_beam_search": NotServed("sample n choices instead"),
    "truncate_prompt_tokens": NotServed("a prompt over max_model_len is refused, never cut; shorten it"),
    "logits_processors": NotServed("use logit_bias or structured output", (None, [])),
    "prompt_logprobs": NotServed("/v1/completions with echo and logprobs gives the prompt's logprobs"),
}
CHAT_NOT_SERVED = {
    "functions": NotServed("send them as tools", (None, [])),
    "function_call": NotServed("send tool_choice", (None, "none")),
    "modalities": NotServed("the output is text; speech is POST /v1/audio/speech", (None, ["text"])),
    "audio": NotServed("the output is text; speech is POST /v1/audio/speech"),
    "continue_final_message": NotServed("the reply is a new assistant turn"),
    "add_generation_prompt": NotServed("the reply is a new assistant turn", (None, True)),
    "echo": NotServed("the response holds the reply alone"),
    "chat_template": NotServed("the checkpoint's chat template renders every request"),
    "documents": NotServed("put them in the messages", (None, [])),
}


class SamplingFields(_TopRequest):
    """The sampling knobs that chat and completions share (OpenAI names, plus vLLM's extras)."""

    model: str | None = Field(None, description="the served model name; defaults to it")
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1 disables (edge-infer extension)")
    min_p: float | None = Field(None, ge=0, le=1, description="edge-infer extension")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Below 0.01 the penalty divides logits into infinities; the distribution becomes NaN.
    repetition_penalty: float | None = Field(None, ge=0.01, le=100, description="edge-infer extension")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: Stop | None = None
    ignore_eos: bool = Field(False, description="keep generating past end-of-sequence (edge-infer extension)")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS),
                          at_most(MAX_LOGIT_BIAS, "logit_bias entries")] | None = Field(
        None, description="token id (as a string) -> bias added to its logit, in [-100, 100]")
    # vLLM's structured-output extensions; at most one, enforced while decoding (docs/serving.md)
    guided_json: dict[str, Any] | str | None = Field(None, description="a JSON schema the output must match")
    guided_regex: str | None = Field(None, description="a regular expression the whole output must match")
    guided_choice: Annotated[list[Annotated[str, Field(min_length=1)]],
                             Field(min_length=1, max_length=MAX_CHOICES, fail_fast=True),
                             at_most(MAX_CHOICES, "guided_choice strings")] | None = Field(
        None, description="the output is exactly one of these strings")
    guided_grammar: str | None = Field(None, description="a grammar the output must match: Lark (llguidance) or GBNF")
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM's newer form of the guided_* fields")
    # vLLM's sampling extras
    min_tokens: int | None = Field(None, ge=0, description="end-of-sequence and stop tokens are held off until this many")
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_LOGIT_BIAS),
                              at_most(MAX_LOGIT_BIAS, "stop_token_ids")] | None = None
    include_stop_str_in_output: bool = Field(False, description="a stop string that ended the output stays in it")
    skip_special_tokens: bool = Field(True, description="false: special tokens appear in the text")
    bad_words: Any = NOT_SERVED_FIELD
    allowed_token_ids: Any = NOT_SERVED_FIELD
    use_beam_search: Any = NOT_SERVED_FIELD
    truncate_prompt_tokens: Any = NOT_SERVED_FIELD
    logits_processors: Any = NOT_SERVED_FIELD
    prompt_logprobs: Any = NOT_SERVED_FIELD

    _not_served = refuse_not_served(SAMPLING_NOT_SERVED)

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:  # ASCII digits only: str.isdigit() also takes "²" and "١٢", which int() reads or not
            if not TOKEN_ID_KEY.fullmatch(key):
                raise ValueError(f"keys are token ids written as strings of up to 10 digits, such as \"1234\"; "
                                 f"got {key[:40]!r}")
        return bias

    @model_validator(mode="after")
    def _check_common(self) -> "SamplingFields":
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        given = [f"guided_{name}" for name in ("json", "regex", "choice", "grammar") if getattr(self, f"guided_{name}")
                 is not None] + (["structured_outputs"] if self.structured_outputs is not None else [])
        if len(given) > 1:
            raise ValueError(f"at most one of guided_json, guided_regex, guided_choice, guided_grammar and "
                             f"structured_outputs; got {', '.join(given)}")
        fmt = getattr(self, "response_format", None)  # both endpoints take it
        if given and fmt is not None and fmt.type != "text":
            raise ValueError(f"response_format and {given[0]} both constrain the output; send one")
        return self

    @property
    def prompt_count(self) -> int:
        """Prompts in the request (each sampled n times)."""
        return 1

    @property
    def guided(self) -> dict[str, Any]:
        """The guided_* fields or structured_outputs given, by their structured-output name (json, json_object,
        regex, choice, grammar)."""
        if self.structured_outputs is not None:
            return self.structured_outputs.given
        return {name: value for name in ("json", "regex", "choice", "grammar")
                if (value := getattr(self, f"guided_{name}")) is not None}


# -- chat ------------------------------------------------------------------------


class TextPart(_Request):
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _media_only_from_users(cls, data: Any) -> Any:
        # Read where a message may hold text parts only (system, assistant, tool): say so, not "Input should be 'text'".
        if isinstance(data, dict) and data.get("type") in MEDIA_PARTS:
            raise ValueError(f"only user messages carry {data['type']} parts; move it into a user message")
        return data


Content = Union[str, Annotated[list[TextPart], Field(fail_fast=True)]]


class MediaURL(_Request):
    url: str = Field(description="data:<type>;base64,...; file:// under --allowed-media-dir; http(s):// with "
                                 "--allow-remote-media")
    detail: Literal["auto", "low", "high"] | None = Field(
        None, description="image_url only; low: the picture read at up to 512 x 512 pixels' worth of tokens (a faster "
                          "encode, a shorter prompt); auto and high: at up to --max-image-tokens")

    @model_validator(mode="before")
    @classmethod
    def _bare_string(cls, data: Any) -> Any:
        # vLLM also takes the URL alone: {"type": "image_url", "image_url": "data:..."}
        return {"url": data} if isinstance(data, str) else data


class ImagePart(_Request):
    type: Literal["image_url"]
    image_url: MediaURL


class InputAudio(_Request):
    data: str = Field(description="the file, base64 (or a whole data: URL)")
    format: Literal["wav", "mp3", "flac", "ogg", "m4a", "webm"]


class InputAudioPart(_Request):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURLPart(_Request):
    """vLLM's audio part: a URL, like image_url."""

    type: Literal["audio_url"]
    audio_url: MediaURL


class VideoPart(_Request):
    """vLLM's video part; with Qwen2.5-Omni its sound track goes into the prompt too (use_audio_in_video)."""

    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[Union[TextPart, ImagePart, InputAudioPart, AudioURLPart, VideoPart], Field(discriminator="type")]
# User messages may carry media (a multimodal model reads them; a text model answers 400).
UserContent = Union[str, Annotated[list[ContentPart], Field(fail_fast=True)]]


class FunctionCall(_Request):
    name: str
    arguments: str


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Request):
    role: Literal["system"]
    content: Content
    name: str | None = None


class DeveloperMessage(_Request):
    role: Literal["developer"]
    content: Content
    name: str | None = None


class UserMessage(_Request):
    role: Literal["user"]
    content: UserContent
    name: str | None = None


class AssistantMessage(_Request):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: Annotated[list[ToolCall], Field(fail_fast=True)] | None = None
    name: str | None = None
    function_call: Any = NOT_SERVED_FIELD

    _not_served = refuse_not_served({"function_call": NotServed("send the call in tool_calls")})


class ToolMessage(_Request):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


ChatMessage = Annotated[
    Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")
]


class FunctionDefinition(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class JsonSchemaFormat(_Request):
    name: str = Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="the schema is enforced while decoding either way")


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"] = Field(
        description="json_object and json_schema are enforced while decoding, as a token mask"
    )
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_format(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format of type "json_schema" needs a json_schema object: {"name": ..., "schema": {...}}')
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f'json_schema is only allowed with type "json_schema", not {self.type!r}')
        return self


def _count_message_items(messages: Any) -> Any:
    if isinstance(messages, list):
        items = sum(len(m[key]) for m in messages if isinstance(m, dict)
                    for key in ("content", "tool_calls") if isinstance(m.get(key), list))
        if items > MAX_MESSAGE_ITEMS:
            raise ValueError(f"at most {MAX_MESSAGE_ITEMS} content parts and tool calls per request, got {items}")
    return messages


class ChatCompletionRequest(SamplingFields):
    # at_most runs first (the last before-validator runs first): the parts are counted in at most MAX_MESSAGES
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES, fail_fast=True),
                        BeforeValidator(_count_message_items), at_most(MAX_MESSAGES, "messages")]
    max_tokens: int | None = Field(None, ge=1, description="deprecated by OpenAI in favour of max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=MAX_TOOLS, fail_fast=True),
                     at_most(MAX_TOOLS, "tools")] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    mm_processor_kwargs: dict[str, Any] | None = Field(
        None, description='vLLM\'s preprocessing options: {"use_audio_in_video": false} leaves a video\'s sound out '
                          "(Qwen2.5-Omni; in by default)")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description='variables for the chat template, as vLLM takes them (Qwen3: {"enable_thinking": false})')
    functions: Any = NOT_SERVED_FIELD
    function_call: Any = NOT_SERVED_FIELD
    modalities: Any = NOT_SERVED_FIELD
    audio: Any = NOT_SERVED_FIELD
    continue_final_message: Any = NOT_SERVED_FIELD
    add_generation_prompt: Any = NOT_SERVED_FIELD
    echo: Any = NOT_SERVED_FIELD
    chat_template: Any = NOT_SERVED_FIELD
    documents: Any = NOT_SERVED_FIELD

    _chat_not_served = refuse_not_served(CHAT_NOT_SERVED)

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[ToolDefinition] | None) -> list[ToolDefinition] | None:
        names = [t.function.name for t in tools or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"more than one tool is named {twice[0]!r}; a call names its tool, so names are unique")
        return tools

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_variables(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(kwargs or ()) & TEMPLATE_VARIABLES)
        if taken:
            raise ValueError(f"{', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by edge-infer; leave "
                             f"{'it' if len(taken) == 1 else 'them'} out")
        return kwargs

    @property
    def has_media(self) -> bool:
        """Whether a message carries an image, audio or video part (its preparation decodes media)."""
        return any(isinstance(m.content, list) and any(not isinstance(p, TextPart) for p in m.content)
                   for m in self.messages)

    @model_validator(mode="after")
    def _check_chat(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
            if not self.tools:
                raise ValueError("tool_choice names a tool or requires one, but no tools are given")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# -- completions -------------------------------------------------------------------

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=MAX_PROMPT_TOKEN_IDS, fail_fast=True),
                     at_most(MAX_PROMPT_TOKEN_IDS, "prompt token ids")]


PROMPT_FORMS = ("text", "texts", "token_ids", "token_id_lists")  # tags in errors' loc, which errors.py leaves out


def _prompt_form(value: Any) -> str | None:
    # The form is read off the first item, so that a bad item is named ("prompt.3: Input should be a valid integer")
    # instead of every form's refusal of the whole list.
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return {str: "texts", int: "token_ids", list: "token_id_lists"}.get(type(value[0])) if value else "texts"
    return None


PromptField = Annotated[Union[
    Annotated[Annotated[str, Field(min_length=1)], Tag(PROMPT_FORMS[0])],
    Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_N, fail_fast=True),
              at_most(MAX_N, "prompts"), Tag(PROMPT_FORMS[1])],
    Annotated[TokenIds, Tag(PROMPT_FORMS[2])],
    Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_N, fail_fast=True), at_most(MAX_N, "prompts"),
              Tag(PROMPT_FORMS[3])],
], Discriminator(_prompt_form, custom_error_type="prompt_form",
                 custom_error_message="must be text, a list of texts, token ids or a list of token id lists")]


class CompletionRequest(SamplingFields):
    prompt: PromptField
    response_format: ResponseFormat | None = Field(None, description="as on chat (vLLM takes it here too)")
    max_tokens: int | None = Field(16, ge=0, description="0: only score the prompt (with echo and logprobs)")
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = Field(False, description="the prompt before the completion; with logprobs, the prompt's logprobs too")
    suffix: str | None = Field(None, description="not supported: must be absent")
    best_of: int | None = Field(None, description="not supported beyond n")

    @model_validator(mode="after")
    def _check_completion(self) -> "CompletionRequest":
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported by edge-infer; remove it")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported by edge-infer; use n")
        return self

    @property
    def prompt_count(self) -> int:
        return len(self.prompts)

    @property
    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


# -- responses ---------------------------------------------------------------------


class PromptTokensDetails(_Response):
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache instead of being computed


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ToolCallRecovery(_KeepNulls):
    """A tool call the model wrote malformed: what was wrong and what the server did."""

    _keep_null = ("index",)

    index: int | None = Field(description="index of the resulting tool call, or null when it was kept as text")
    parser: str
    problem: str
    action: str
    recovered: bool


class FormatCheck(_Response):
    type: str
    valid: bool
    error: str | None = None


class ToolChoiceCheck(_Response):
    requested: str
    met: bool


class ChoiceReport(_Response):
    """edge-infer's account of what it did to a choice beyond plain decoding."""

    tool_call_recovery: list[ToolCallRecovery] | None = None
    response_format: FormatCheck | None = None
    tool_choice: ToolChoiceCheck | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[TokenLogprob]


class ResponseMessage(_KeepNulls):
    _keep_null = ("content",)  # OpenAI sends "content": null beside tool calls

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Response):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    edge_infer: ChoiceReport | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionDelta(_Response):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    edge_infer: ChoiceReport | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: the first token of an echoed prompt (nothing precedes it)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "edge-infer"
    max_model_len: int
    # What this server runs it on: dtype, quantization, the CPU's ISA and the kernel of each linear kind.
    runtime: dict[str, Any] | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]
