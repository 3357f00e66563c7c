"""Carrying out one tool call on a device.

Nothing here raises for a bad call: an unknown tool, a missing argument, an
element that is not on the screen or a device failure all come back as an
``ActionResult`` whose message is a sentence the model reads next turn.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge_infer.agent.actions import DIRECTIONS, KEYS, TOOL_NAMES
from edge_infer.agent.device import Device, DeviceError
from edge_infer.agent.ui_tree import Screen


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str  # one sentence, for the model
    done: bool = False  # the model called task_complete
    summary: str = ""  # its summary
    action: str = ""  # the call as text: tap(index=2)


def describe(name: str, args: dict[str, Any]) -> str:
    """A call as the model's history shows it: ``type_text(index=1, text="7")``."""
    return f"{name}(" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items()) + ")"


def execute(device: Device, screen: Screen | None, name: str, args: dict[str, Any]) -> ActionResult:
    action = describe(name, args)
    if name not in TOOL_NAMES:
        return ActionResult(False, f"There is no tool named {name!r}; use one of {', '.join(TOOL_NAMES)}.", action=action)
    try:
        message = _run(device, screen, name, args)
    except _Refused as exc:
        return ActionResult(False, str(exc), action=action)
    except DeviceError as exc:
        return ActionResult(False, f"The phone could not do {action}: {exc}.", action=action)
    if name == "task_complete":
        return ActionResult(True, message, done=True, summary=str(args.get("summary", "")), action=action)
    return ActionResult(True, message, action=action)


class _Refused(Exception):
    """A call that cannot be carried out as given; the message says why."""


def _run(device: Device, screen: Screen | None, name: str, args: dict[str, Any]) -> str:
    if name == "tap":
        element = _element(screen, args)
        device.tap(*element.center)
        return f"Tapped {element.render()}."
    if name == "type_text":
        element = _element(screen, args)
        text = _string(args, "text")
        if not element.editable:
            raise _Refused(f"Element {element.index} is not a text field: {element.render()}.")
        device.tap(*element.center)  # focus it
        if element.text:  # replace what is there, as a person would
            device.keyevent("move_end")
            for _ in element.text:
                device.keyevent("del")
        device.input_text(text)
        return f"Typed {json.dumps(text)} into {element.render()}."
    if name == "swipe":
        direction = _choice(args, "direction", DIRECTIONS)
        width, height = device.size()
        x, top, bottom = width // 2, height // 4, height * 3 // 4
        # The finger moves against the direction the content should come from: swipe up reveals what is below.
        start, end = {"up": ((x, bottom), (x, top)), "down": ((x, top), (x, bottom)),
                      "left": ((width * 3 // 4, height // 2), (width // 4, height // 2)),
                      "right": ((width // 4, height // 2), (width * 3 // 4, height // 2))}[direction]
        device.swipe(*start, *end)
        return f"Swiped {direction}."
    if name == "press_key":
        key = _choice(args, "key", KEYS)
        device.keyevent(key)
        return f"Pressed {key}."
    if name == "open_app":
        app = _string(args, "name")
        device.launch(app)
        return f"Opened {app}."
    return "Marked the task as done."  # task_complete: the loop ends the episode


def _element(screen: Screen | None, args: dict[str, Any]):
    if screen is None:
        raise _Refused("The screen could not be read, so there is no element to act on; try press_key or open_app.")
    raw = args.get("index")
    if isinstance(raw, str) and raw.strip().lstrip("[").rstrip("]").isdigit():  # "3" or "[3]": models quote numbers
        raw = int(raw.strip().strip("[]"))
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise _Refused(f"index must be an element number, got {raw!r}.")
    if not 0 <= raw < len(screen.elements):
        last = len(screen.elements) - 1
        raise _Refused(f"There is no element {raw} on this screen; the elements are numbered 0 to {last}.")
    element = screen.elements[raw]
    if not element.enabled:
        raise _Refused(f"Element {raw} is disabled: {element.render()}.")
    return element


def _string(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _Refused(f"{key} must be a non-empty string, got {value!r}.")
    return value


def _choice(args: dict[str, Any], key: str, options: tuple[str, ...]) -> str:
    value = str(args.get(key, "")).strip().lower()
    if value not in options:
        raise _Refused(f"{key} must be one of {', '.join(options)}, got {args.get(key)!r}.")
    return value
