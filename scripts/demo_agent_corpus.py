"""Phone-agent turns for the demo model: the expert playing random tasks on randomised demo phones.

Each episode is played through the real agent loop (`edge_infer.agent.loop`)
by the scripted expert (`edge_infer.agent.expert`), so every turn is the
exact request the loop sends a server: the system prompt, the tools and one
user message with the screen, the last actions, any note and the task. A
turn becomes one training dialogue whose answer is the expert's tool call,
rendered by the model's chat template as `edge-infer serve` renders the
loop's request (tests/agent/test_demo_agent.py holds them byte-identical).
On a switch's page the answer starts with what the expert read there
('[2] Switch "Wi-Fi" on; task: on.', see `edge_infer.agent.expert.reading`).

The phones vary as the suite's variants do, and more: any switch to turn on
or off (often already in the wanted state, which must end in task_complete
without a toggle), any app to open, any alarm time, two tasks chained,
labels renamed with a few real phones' words (Connections, WLAN, Flight
mode, ...), lists shuffled, decoy switches beside Wi-Fi, other switches and
alarms, and start screens other than home. In some episodes one step is
taken at random (a wrong app, a wrong row, back, home): it is played but not
learnt, and the turns after it show the expert recovering. Only episodes the
task oracle passes are kept.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from edge_infer.agent.actions import TOOLS
from edge_infer.agent.chat import Reply
from edge_infer.agent.expert import ExpertModel
from edge_infer.agent.loop import AgentConfig, run_episode
from edge_infer.agent.phone import (
    CLOCK_TABS, DECOYS, DEFAULT_ALARMS, HOME_APPS, LABELS, SETTINGS_SECTIONS, DemoPhone, Variant,
)
from edge_infer.agent.simulator import SimulatedDevice
from edge_infer.agent.tasks import AlarmGoal, AppGoal, SwitchGoal, Task, chain
from edge_infer.agent.ui_tree import parse_ui_dump

from demo_corpus import Dialogue, Message

# Other words phones use for the same things (the suite's rename variant uses some of them).
SYNONYMS = {
    "network": ("Connections", "Network", "Internet"),
    "wifi": ("WLAN", "Wireless"),
    "airplane": ("Flight mode", "Aeroplane mode"),
    "connected": ("Devices", "Bluetooth & devices"),
    "display": ("Screen", "Display & brightness"),
    "battery": ("Power", "Battery & power"),
    "data_saver": ("Data saving",),
    "dark_theme": ("Dark mode", "Night mode"),
    "battery_saver": ("Power saving",),
}

# Switches a task may ask for, with how often; decoys only on phones that show them.
TARGET_SWITCHES = (("wifi", 6), ("airplane", 4), ("bluetooth", 2), ("data_saver", 1), ("dark_theme", 1),
                   ("battery_saver", 1))
# The suite's wording comes first and is used most.
SWITCH_ON = ("Turn on {x}.", "Turn {x} on.", "Switch on {x}.", "Enable {x}.")
SWITCH_OFF = ("Turn off {x}.", "Turn {x} off.", "Switch off {x}.", "Disable {x}.")
OPEN_APP = ("Open the {x} app.", "Open {x}.", "Launch the {x} app.")
SET_ALARM = ("Set an alarm for {x}.", "Add an alarm at {x}.", "Wake me up at {x}.")
SUITE_WORDING = 0.6

# As often as not: the step after reaching the switch's page depends on its state, not on the steps before.
ALREADY_DONE = 0.5
MISTAKE_RATE = 0.12  # episodes with one random step in them
START_HOME = 0.6  # episodes that start on the home screen, as every suite task does
MAX_COPIES = 6  # of one identical turn: the commonest screens would otherwise fill the corpus


@dataclass(frozen=True)
class Turn:
    messages: list[Message]  # what the loop sent
    reading: str  # the reply's text before the call: the named switch's screen line and the wanted state, or ""
    name: str  # the tool the expert called
    arguments: dict[str, Any]
    on_section_page: bool  # a Settings section's page: tap the switch the task names, or done already, or leave

    def dialogue(self) -> Dialogue:
        call = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        answer = {"role": "assistant", "content": self.reading, "tool_calls": [call]}
        return Dialogue(f"agent_{self.name}", [*self.messages, answer], TOOLS)


def generate_agent_dialogues(count: int, seed: int, section_page_share: float | None = None) -> list[Dialogue]:
    """``count`` turns from expert episodes on random phones; the same seed gives the same turns.

    ``section_page_share`` makes that share of them turns on a Settings section's page, where the
    decisions a small model finds hardest are (which switch the task names, and whether its state
    already matches); by default turns come as episodes bring them.
    """
    rng = random.Random(seed)
    copies: Counter[str] = Counter()
    wanted = None if section_page_share is None else {True: round(count * section_page_share)}
    if wanted is not None:
        wanted[False] = count - wanted[True]
    taken: Counter[bool] = Counter()
    out: list[Dialogue] = []
    while len(out) < count:
        for turn in play_random_episode(rng):
            key = turn.messages[-1]["content"]
            room = len(out) < count if wanted is None else taken[turn.on_section_page] < wanted[turn.on_section_page]
            if copies[key] < MAX_COPIES and room:
                copies[key] += 1
                taken[turn.on_section_page] += 1
                out.append(turn.dialogue())
    return out


def play_random_episode(rng: random.Random) -> list[Turn]:
    """The learnt turns of one random episode (none if the oracle failed it)."""
    task = random_task(rng)
    phone = DemoPhone(dict(task.switches), _alarms(rng), task.phone)
    phone.stack = _start_page(rng)
    return play(task, SimulatedDevice(phone), rng.randrange(4) if rng.random() < MISTAKE_RATE else None, rng)


def play(task: Task, device: SimulatedDevice, mistake_at: int | None, rng: random.Random) -> list[Turn]:
    """The expert's turns on ``device``, but for the random one at ``mistake_at``; none if the oracle fails the episode."""
    teacher = Teacher(task, device, mistake_at, rng)
    before = device.phone_state()
    episode = run_episode(device, task.prompt, AgentConfig(), teacher)
    verdict = task.judge(before, device.phone_state())
    if not (episode.declared_done and verdict.goal_reached and not verdict.collateral):
        return []
    return [Turn(*turn, on_section_page=page.startswith("settings/") and page != "settings/")
            for i, (turn, page) in enumerate(zip(teacher.turns, teacher.pages)) if i != mistake_at]


class Teacher(ExpertModel):
    """The expert, except for one random step at turn ``mistake_at`` (played, then recovered from)."""

    def __init__(self, task: Task, device: SimulatedDevice, mistake_at: int | None, rng: random.Random):
        super().__init__(task, device)
        self.mistake_at, self.rng = mistake_at, rng
        self.pages: list[str] = []  # the page each turn was played on

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], thinking: bool = True) -> Reply:
        self.pages.append(self.device.app.stack[-1])
        reply = super().complete(messages, tools, thinking)
        messages, _, name, args = self.turns[-1]
        if len(self.turns) - 1 != self.mistake_at or name == "task_complete":
            return reply
        wrong = [a for a in self._wrong_steps() if a != (name, args)]
        name, args = wrong[self.rng.randrange(len(wrong))]
        self.turns[-1] = (messages, "", name, args)
        return Reply("", [(name, json.dumps(args))])

    def _wrong_steps(self) -> list[tuple[str, dict[str, Any]]]:
        phone = self.device.app
        steps: list[tuple[str, dict[str, Any]]] = [("press_key", {"key": "back"}), ("press_key", {"key": "home"})]
        steps += [("open_app", {"name": phone.labels[app]}) for app in HOME_APPS]
        # Nothing that toggles or saves: that would be damage, not a detour.
        screen = parse_ui_dump(self.device.dump())
        steps += [("tap", {"index": e.index}) for e in screen.elements if not e.checkable and e.label != "Save"]
        return steps


# -- random tasks and phones -------------------------------------------------------------------

def random_task(rng: random.Random) -> Task:
    variant = _variant(rng)
    kind = rng.random()
    if kind < 0.42:
        task = _switch_task(rng, variant)
    elif kind < 0.6:
        task = _app_task(rng)
    elif kind < 0.8:
        task = _alarm_task(rng)
    else:
        first = _switch_task(rng, variant)
        if rng.random() < 0.6:
            then = _app_task(rng)
        else:
            then = _switch_task(rng, variant, avoid=first.goals[0].name)
        task = chain(first, then)
    others = {name: rng.random() < 0.3 for name, _ in TARGET_SWITCHES}
    return replace(task, phone=variant, switches=tuple((others | dict(task.switches)).items()))


def _variant(rng: random.Random) -> Variant:
    labels = ()
    if rng.random() < 0.2:
        labels = tuple((key, _pick(rng, words)) for key, words in SYNONYMS.items() if rng.random() < 0.5)
    # Shuffles and decoys are frequent: on the standard layout a model could learn indices by heart
    # instead of finding the element the task names.
    shuffle = rng.randrange(10**6) if rng.random() < 0.4 else None
    decoys = tuple(d for d in DECOYS if rng.random() < 0.6) if rng.random() < 0.35 else ()
    return Variant(labels, shuffle, decoys)


def _switch_task(rng: random.Random, variant: Variant, avoid: str | None = None) -> Task:
    names = [name for name, _ in TARGET_SWITCHES] + list(variant.decoys)
    weights = [weight for _, weight in TARGET_SWITCHES] + [1] * len(variant.decoys)
    name = avoid
    while name == avoid:
        name = rng.choices(names, weights)[0]
    on = rng.random() < 0.6
    already = rng.random() < ALREADY_DONE
    wording = _wording(rng, SWITCH_ON if on else SWITCH_OFF)
    return Task("switch", wording.format(x=LABELS[name]), (SwitchGoal(name, on),), ((name, on == already),))


def _app_task(rng: random.Random) -> Task:
    app = rng.choices(HOME_APPS, [3 if app in ("clock", "settings") else 1 for app in HOME_APPS])[0]
    return Task("app", _wording(rng, OPEN_APP).format(x=LABELS[app]), (AppGoal(app),))


def _alarm_task(rng: random.Random) -> Task:
    minute = _pick(rng, ("00", "15", "30", "45")) if rng.random() < 0.7 else f"{rng.randrange(60):02d}"
    time = f"{rng.randint(1, 12)}:{minute} {_pick(rng, ('AM', 'PM'))}"
    return Task("alarm", _wording(rng, SET_ALARM).format(x=time), (AlarmGoal(time),))


def _wording(rng: random.Random, wordings: tuple[str, ...]) -> str:
    return wordings[0] if rng.random() < SUITE_WORDING else _pick(rng, wordings[1:])


def _alarms(rng: random.Random) -> tuple[tuple[str, bool], ...]:
    if rng.random() < 0.5:
        return DEFAULT_ALARMS
    times = {f"{rng.randint(1, 12)}:{_pick(rng, ('00', '15', '30', '45'))} {_pick(rng, ('AM', 'PM'))}"
             for _ in range(rng.randrange(4))}
    return tuple((time, rng.random() < 0.5) for time in sorted(times))


def _start_page(rng: random.Random) -> list[str]:
    if rng.random() < START_HOME:
        return ["home"]
    pages = [["home", "settings/"], *(["home", "settings/", f"settings/{s}"] for s in SETTINGS_SECTIONS),
             *(["home", f"clock/{tab}"] for tab in CLOCK_TABS), ["home", "clock/alarms", "clock/new_alarm"],
             *(["home", app] for app in HOME_APPS if app not in ("clock", "settings"))]
    return _pick(rng, pages)


def _pick(rng: random.Random, options):
    return options[rng.randrange(len(options))]
