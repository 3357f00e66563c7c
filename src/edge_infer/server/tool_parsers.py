"""Tool calls in generated text: the formats real models write, and their repairs.

Both supported formats wrap each call in ``<tool_call>`` ... ``</tool_call>``:

- ``hermes`` (Hermes, Qwen2.5, Qwen3): a JSON object,
  ``<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>``
- ``glm45`` (GLM-4.5 / 4.6): the name, then key/value tags,
  ``<tool_call>get_weather\\n<arg_key>city</arg_key>\\n<arg_value>Paris</arg_value>\\n</tool_call>``

``ToolCallExtractor`` splits text into message content and calls as it
arrives, so streaming and non-streaming responses go through the same code
and yield the same calls. A call the model wrote malformed but recoverably
(unterminated JSON, a missing brace, a missing end tag) is repaired, and each
repair is returned as a ``Recovery`` for the response and the metrics; a call
that cannot be repaired stays in the content as text, also with a
``Recovery`` (``recovered=False``). Nothing is dropped silently.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from edge_infer.engine.grammar import JSON_OPTIONS, closed_objects

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's ``function.arguments``


@dataclass(frozen=True)
class Recovery:
    call_index: int | None  # the call it produced; None when the text was kept as content
    problem: str
    action: str
    recovered: bool


@dataclass
class BlockResult:
    """What a parser made of the text between the tags."""

    call: ParsedCall | None
    fixes: list[tuple[str, str]] = field(default_factory=list)  # (problem, action) of each repair
    error: str | None = None  # why no call could be made


class ToolCallParser:
    """Turns the body of one ``<tool_call>`` block into a call."""

    name = ""

    def __init__(self, tools: list[dict[str, Any]] | None = None):
        # tool name -> its JSON-schema "parameters"
        self.tools = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}

    def parse_block(self, body: str) -> BlockResult:
        raise NotImplementedError


def _closers(text: str) -> str | None:
    """The characters that would close ``text``'s open strings and brackets; None if they are mismatched."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack[-1] != ch:
                return None
            stack.pop()
    return ('"' if in_string else "") + "".join(reversed(stack))


def parse_json_lenient(text: str) -> tuple[Any, list[tuple[str, str]]]:
    """JSON from model output, repairing what models commonly get wrong.

    Returns (value, repairs) or raises ValueError when no repair works.
    Repairs: text after a complete value, a missing opening brace, and
    unterminated strings/objects/arrays (closed at the end).
    """
    text = text.strip()
    fixes: list[tuple[str, str]] = []
    if text.startswith('"'):
        text = "{" + text
        fixes.append(("the JSON object has no opening brace", "added '{'"))
    try:
        return json.loads(text), fixes
    except json.JSONDecodeError:
        pass
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        pass
    else:
        extra = text[end:].strip()
        return value, fixes + [(f"text after the JSON value: {extra[:40]!r}", "ignored it")]
    closers = _closers(text)
    if closers:
        trimmed = text.rstrip().rstrip(",") if not closers.startswith('"') else text
        try:
            return json.loads(trimmed + closers), fixes + [(f"unterminated JSON (missing {closers!r})", f"appended {closers!r}")]
        except json.JSONDecodeError:
            pass
    raise ValueError("not valid JSON and no repair made it valid")


class HermesParser(ToolCallParser):
    name = "hermes"

    def parse_block(self, body: str) -> BlockResult:
        try:
            obj, fixes = parse_json_lenient(body)
        except ValueError as exc:
            return BlockResult(None, error=f"tool call body {body.strip()[:60]!r} is {exc}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return BlockResult(None, error="tool call JSON has no string 'name'")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args, more = parse_json_lenient(args)
            except ValueError:
                return BlockResult(None, error=f"arguments of {obj['name']!r} are a string that is not JSON")
            fixes += more
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return BlockResult(None, error=f"arguments of {obj['name']!r} are not a JSON object")
        return BlockResult(ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False)), fixes)


_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_GLM_OPEN_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*)", re.DOTALL)


class Glm45Parser(ToolCallParser):
    name = "glm45"

    def parse_block(self, body: str) -> BlockResult:
        head, tag, rest = body.partition("<arg_key>")
        name = head.strip()
        if not name or any(c.isspace() for c in name):
            return BlockResult(None, error=f"tool call {body.strip()[:60]!r} does not start with a function name")
        rest = tag + rest
        args: dict[str, Any] = {}
        fixes: list[tuple[str, str]] = []
        end = 0
        for m in _GLM_PAIR.finditer(rest):
            args[m.group(1).strip()] = self._value(name, m.group(1).strip(), m.group(2))
            end = m.end()
        leftover = rest[end:].strip()
        if leftover:
            open_pair = _GLM_OPEN_PAIR.match(leftover)
            if open_pair:
                key = open_pair.group(1).strip()
                args[key] = self._value(name, key, open_pair.group(2).rstrip())
                fixes.append((f"unterminated <arg_value> of {key!r}", "took the text up to the end of the call"))
            else:
                fixes.append((f"stray text in the call: {leftover[:40]!r}", "ignored it"))
        return BlockResult(ParsedCall(name, json.dumps(args, ensure_ascii=False)), fixes)

    def _value(self, tool: str, key: str, raw: str) -> Any:
        """Values are written bare: strings stay strings where the schema says so, the rest is JSON when it parses."""
        prop = (self.tools.get(tool, {}).get("properties") or {}).get(key) or {}
        if prop.get("type") == "string":
            return raw
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw


PARSERS: dict[str, type[ToolCallParser]] = {"hermes": HermesParser, "glm45": Glm45Parser}


def detect_parser(chat_template: str | None) -> str:
    """The format a checkpoint's chat template teaches its model."""
    return "glm45" if chat_template and "<arg_key>" in chat_template else "hermes"


@dataclass
class ToolEvents:
    """What one piece of text added: content to show and calls completed."""

    content: str = ""
    calls: list[tuple[int, ParsedCall]] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)


class ToolCallExtractor:
    """Incremental split of generated text into content and tool calls.

    Text that might be the beginning of ``<tool_call>`` is held back until
    the next piece decides it; the inside of a block is held until its end
    tag (or the end of the text) and then parsed.
    """

    def __init__(self, parser: ToolCallParser):
        self.parser = parser
        self.calls: list[ParsedCall] = []
        self.recoveries: list[Recovery] = []
        self._buffer = ""
        self._in_call = False

    def feed(self, text: str) -> ToolEvents:
        self._buffer += text
        out = ToolEvents()
        while True:
            if not self._in_call:
                i = self._buffer.find(START_TAG)
                if i == -1:
                    keep = _partial_tag_len(self._buffer, START_TAG)
                    cut = len(self._buffer) - keep
                    out.content += self._buffer[:cut]
                    self._buffer = self._buffer[cut:]
                    return out
                out.content += self._buffer[:i]
                self._buffer = self._buffer[i + len(START_TAG) :]
                self._in_call = True
            else:
                j = self._buffer.find(END_TAG)
                k = self._buffer.find(START_TAG)
                if k != -1 and (j == -1 or k < j):  # the next call began before this one ended
                    self._close(self._buffer[:k], f"missing {END_TAG} before the next {START_TAG}", out)
                    self._buffer = self._buffer[k:]
                    self._in_call = False
                elif j != -1:
                    self._close(self._buffer[:j], None, out)
                    self._buffer = self._buffer[j + len(END_TAG) :]
                    self._in_call = False
                else:
                    return out

    def finish(self, cut_off: bool = False) -> ToolEvents:
        """The end of the text: an open block is parsed as it is (and reported). ``cut_off``: the text ended at
        max_tokens, so an open block that needs a repair is a call the model had not finished writing: it stays
        text (a repair would invent its end)."""
        out = ToolEvents()
        if self._in_call:
            self._close(self._buffer, f"missing {END_TAG} at the end of the output", out, cut_off)
        else:
            out.content = self._buffer
        self._buffer = ""
        self._in_call = False
        return out

    def _close(self, body: str, missing_end: str | None, out: ToolEvents, cut_off: bool = False) -> None:
        result = self.parser.parse_block(body)
        unfinished = cut_off and any(problem.startswith("unterminated") for problem, _ in result.fixes)
        if result.call is None or unfinished:
            out.content += START_TAG + body + ("" if missing_end else END_TAG)
            problem = ("the call was cut off by max_tokens before it was complete" if unfinished or cut_off
                       else result.error or "unparseable tool call")
            rec = Recovery(None, problem, "kept the text as message content", False)
            out.recoveries.append(rec)
            self.recoveries.append(rec)
            return
        index = len(self.calls)
        self.calls.append(result.call)
        out.calls.append((index, result.call))
        fixes = ([(missing_end, "ended the call there")] if missing_end else []) + result.fixes
        if self.parser.tools and result.call.name not in self.parser.tools:
            fixes.append((f"called {result.call.name!r}, which is not among the tools offered", "kept the call"))
        for problem, action in fixes:
            rec = Recovery(index, problem, action, True)
            out.recoveries.append(rec)
            self.recoveries.append(rec)


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def extract(parser: ToolCallParser, text: str) -> tuple[str, list[ParsedCall], list[Recovery]]:
    """Content, calls and recoveries of a complete text."""
    extractor = ToolCallExtractor(parser)
    content = extractor.feed(text).content + extractor.finish().content
    return content, extractor.calls, extractor.recoveries


def hermes_calls_grammar(tools: list[dict[str, Any]], required: bool, parallel: bool, tags_are_tokens: bool,
                         content: dict[str, Any] | None = None) -> str:
    """A Lark grammar (llguidance's dialect) for output in the ``hermes`` format whose calls name one of
    ``tools``. ``required``: the output is calls only (tool_choice "required" or a named tool), and every
    call's arguments match its tool's parameters (as vLLM forces them); otherwise only tools marked ``strict``
    have their arguments held to their parameters (any object for the others), and the output may instead be
    content: JSON matching ``content`` (response_format's schema), or else text, which may come before the calls
    and may not spell the start tag. ``parallel``: more than one call. ``tags_are_tokens``: the tokenizer has the
    tags as tokens of their own, which llguidance writes as ``<tool_call>`` (a quoted string would be the
    characters)."""
    variants = []
    for tool in tools:
        fn = tool["function"]
        held = required or fn.get("strict")
        arguments = closed_objects(fn.get("parameters") or {"type": "object"}) if held else {"type": "object"}
        variants.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": arguments},
                         "required": ["name", "arguments"], "additionalProperties": False})
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema["x-guidance"] = JSON_OPTIONS  # whitespace as for any JSON output
    start, end = (START_TAG, END_TAG) if tags_are_tokens else (json.dumps(START_TAG), json.dumps(END_TAG))
    calls = "call+" if parallel else "call"
    if required:
        start_rule = f"start: {calls}"
    elif content is not None:
        start_rule = f"start: content | {calls}"
    else:
        start_rule = f"start: TEXT? {'call*' if parallel else 'call?'}"
    lines = [
        start_rule,
        f"call: {start} WS? %json {json.dumps(schema)} WS? {end} WS?",
        r"WS: /[ \n]{1,4}/",
    ]
    if content is not None and not required:
        lines.append(f"content: %json {json.dumps({**closed_objects(content), 'x-guidance': JSON_OPTIONS})}")
    elif not required:
        lines.append(r"TEXT: /(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/")
    return "\n".join(lines)
