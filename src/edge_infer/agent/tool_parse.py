"""One tool call from a model's reply, saying where it was found and what was repaired.

Sources, tried in this order:

- ``tool_calls``: the server parsed the call itself (its repairs come along);
- ``glm_block``: ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`` in the text
  (GLM-4.5), for servers that parse another format;
- ``bracketed``: ``<tool_call>{"name": ..., "arguments": ...}`` in the text, braces repaired;
- ``bare_json``: a ``{"name": ..., "arguments": ...}`` object in the text, without tags;
- ``none``: nothing that reads as a call.

The parsers are the server's own (``server/tool_parsers.py``), so a reply
repairs the same way whether the server or the agent reads it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from edge_infer.agent.chat import Reply
from edge_infer.server.tool_parsers import END_TAG, START_TAG, Glm45Parser, HermesParser, parse_json_lenient

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    args: dict[str, Any]
    source: str  # tool_calls | glm_block | bracketed | bare_json | none
    repairs: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Identity of the action, for noticing repeats."""
        return self.name + json.dumps(self.args, sort_keys=True)


NONE = ParsedCall("", {}, "none")


def visible_text(content: str) -> str:
    """The reply without its reasoning (``<think>`` blocks)."""
    return _THINK.sub("", content).strip()


def extract_tool_call(reply: Reply, tools: list[dict[str, Any]] | None = None) -> ParsedCall:
    extra = [f"the reply made {len(reply.tool_calls)} calls; ran the first"] if len(reply.tool_calls) > 1 else []
    if reply.tool_calls:
        name, arguments = reply.tool_calls[0]
        try:
            args, fixes = parse_json_lenient(arguments or "{}")
        except ValueError:
            args, fixes = None, []
        if isinstance(args, dict):
            return ParsedCall(name, args, "tool_calls", reply.server_recoveries + _texts(fixes) + extra)
    text = visible_text(reply.content)
    if START_TAG in text:
        body = text.split(START_TAG, 1)[1].split(END_TAG, 1)[0]
        unterminated = [] if END_TAG in text else [f"missing {END_TAG}: took the text to the end"]
        glm = "<arg_key>" in body or re.fullmatch(r"\s*[A-Za-z_][\w.-]*\s*", body)
        parser, source = (Glm45Parser(tools), "glm_block") if glm else (HermesParser(tools), "bracketed")
        block = parser.parse_block(body)
        if block.call is not None:
            return ParsedCall(block.call.name, json.loads(block.call.arguments), source, unterminated + _texts(block.fixes))
    start = text.find("{")
    if start != -1:
        try:
            obj, fixes = parse_json_lenient(text[start:])
        except ValueError:
            obj, fixes = None, []
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]:
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args, more = parse_json_lenient(args)
                    fixes += more
                except ValueError:
                    args = None
            if isinstance(args, dict):
                skipped = [f"text before the JSON: {text[:start].strip()[:40]!r}: ignored it"] if text[:start].strip() else []
                return ParsedCall(obj["name"], args, "bare_json", skipped + _texts(fixes))
    return NONE


def _texts(fixes: list[tuple[str, str]]) -> list[str]:
    return [f"{problem}: {action}" for problem, action in fixes]
