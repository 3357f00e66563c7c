"""The agent's action space as OpenAI tools, and the system prompt that explains it.

Descriptions are short on purpose: they are in every prompt, and the demo
model reads them with a context of a few hundred tokens.
"""
from __future__ import annotations

from typing import Any

SYSTEM_PROMPT = (
    "You operate an Android phone for the user. Each turn shows the screen as numbered elements, your last actions "
    "and the task. Answer with one tool call. Call task_complete only when the screen shows that the task is done."
)

DIRECTIONS = ("up", "down", "left", "right")
KEYS = ("back", "home", "enter")


def _tool(tool: str, description: str, /, **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": tool, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(properties)},
    }}


TOOLS: list[dict[str, Any]] = [
    _tool("tap", "Tap an element.", index={"type": "integer"}),
    _tool("type_text", "Type text into a field.", index={"type": "integer"}, text={"type": "string"}),
    _tool("swipe", "Swipe the screen.", direction={"type": "string", "enum": list(DIRECTIONS)}),
    _tool("press_key", "Press a key.", key={"type": "string", "enum": list(KEYS)}),
    _tool("open_app", "Open an app by name.", name={"type": "string"}),
    _tool("task_complete", "Finish: the task is done.", summary={"type": "string"}),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
