"""A scripted player that solves every task on the demo phone: the teacher of the demo model.

It plays through the same loop as a model (``ExpertModel`` is a
``ChatModel``), so its episodes are exactly the prompts a model gets; the
demo model's training corpus is made of them. It reads the phone's own
state to choose (it is the oracle's sibling, not a model), and the screen
only to find the element's index.

On the page of a switch the task names, its reply first copies that
switch's line from the screen and adds the state the task wants, then
calls: '[2] Switch "Wi-Fi" on; task: on.' A small model cannot compare the
switch's state with the task's on/off in one token (it answered with the
training share of tap and done, whatever the state); the line is copied
verbatim once its index is chosen, and the call then compares two of the
model's own last words.
"""
from __future__ import annotations

import json
from typing import Any

from edge_infer.agent.chat import Reply
from edge_infer.agent.phone import SECTION_SWITCHES, DemoPhone
from edge_infer.agent.simulator import SimulatedDevice
from edge_infer.agent.state import PhoneState
from edge_infer.agent.tasks import AlarmGoal, AppGoal, Goal, SwitchGoal, Task
from edge_infer.agent.ui_tree import Screen, parse_ui_dump


def _section(switch: str) -> str:
    """The Settings page that holds a switch."""
    for section, switches in SECTION_SWITCHES.items():
        if switch in switches:
            return section
    return "network"  # Wi-Fi, Airplane mode, Data Saver and the decoys


def _find(screen: Screen, label: str, cls: str | None = None) -> int:
    for element in screen.elements:
        if element.label.split(" · ")[0] == label and (cls is None or element.cls == cls):
            return element.index
    raise LookupError(f"no element {label!r} on screen:\n{screen.render()}")


def next_action(task: Task, phone: DemoPhone, screen: Screen, before: PhoneState, seen: set) -> tuple[str, dict[str, Any]]:
    """The next step; ``seen`` collects the goals the screen has shown to hold (done means shown, not assumed)."""
    state = phone.state()
    for goal in task.goals:
        if goal in seen:
            continue
        if goal.holds(before, state) and _shown(goal, phone):
            seen.add(goal)
            continue
        return _toward(goal, phone, screen)
    return "task_complete", {"summary": " ".join(goal.summary() for goal in task.goals)}


def _shown(goal: Goal, phone: DemoPhone) -> bool:
    page = phone.stack[-1]
    if isinstance(goal, SwitchGoal):
        return page == f"settings/{_section(goal.name)}"
    if isinstance(goal, AlarmGoal):
        return page == "clock/alarms"
    return True  # an app in front is on screen


def _toward(goal: Goal, phone: DemoPhone, screen: Screen) -> tuple[str, dict[str, Any]]:
    labels, page = phone.labels, phone.stack[-1]
    if isinstance(goal, AppGoal):
        return "open_app", {"name": labels[goal.app]}
    if isinstance(goal, SwitchGoal):
        section = _section(goal.name)
        if page == f"settings/{section}":  # there, and not yet in the wanted state
            return "tap", {"index": _find(screen, labels[goal.name], "Switch")}
        if page == "settings/":
            return "tap", {"index": _find(screen, labels[section])}
        if page.startswith("settings/"):
            return "press_key", {"key": "back"}
        return "open_app", {"name": labels["settings"]}
    assert isinstance(goal, AlarmGoal)
    clock, _, meridiem = goal.time.partition(" ")
    hour, _, minute = clock.partition(":")
    if page == "clock/new_alarm":
        for rid, value in (("hour", hour), ("minute", minute)):
            if phone.fields.get(rid) != value:
                index = next(e.index for e in screen.elements if e.short_id == rid)
                return "type_text", {"index": index, "text": value}
        if phone.meridiem != meridiem:
            return "tap", {"index": _find(screen, meridiem)}
        return "tap", {"index": _find(screen, "Save")}
    if page == "clock/alarms":
        return "tap", {"index": _find(screen, "Add alarm")}
    if page.startswith("clock/"):
        return "tap", {"index": _find(screen, labels["alarms"])}
    return "open_app", {"name": labels["clock"]}


def reading(goals: list[Goal], phone: DemoPhone, screen: Screen) -> str:
    """For each of ``goals`` that is a switch on this page, its screen line and the wanted state; "" if none is."""
    page, lines = phone.stack[-1], []
    for goal in goals:
        if isinstance(goal, SwitchGoal) and page == f"settings/{_section(goal.name)}":
            switch = screen.elements[_find(screen, phone.labels[goal.name], "Switch")]
            lines.append(f"{switch.render()}; task: {'on' if goal.on else 'off'}.")
    return " ".join(lines)


class ExpertModel:
    """Answers each turn with the expert's action, as a server would return a parsed tool call."""

    def __init__(self, task: Task, device: SimulatedDevice):
        self.task, self.device = task, device
        self.before = device.phone_state()
        self.seen: set = set()
        # (messages, what it read off the screen, tool, arguments)
        self.turns: list[tuple[list[dict[str, Any]], str, str, dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], thinking: bool = True) -> Reply:
        screen = parse_ui_dump(self.device.dump())
        seen_before = set(self.seen)
        name, args = next_action(self.task, self.device.app, screen, self.before, self.seen)
        # What it read: the goals this screen showed done, then the one the action is for.
        confirmed = [goal for goal in self.task.goals if goal in self.seen - seen_before]
        acted_on = [goal for goal in self.task.goals if goal not in self.seen][:1]
        text = reading(confirmed + acted_on, self.device.app, screen)
        self.turns.append((messages, text, name, args))
        return Reply(text, [(name, json.dumps(args))])
