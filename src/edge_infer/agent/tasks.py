"""The task suite: what to ask, how the phone starts, and the oracle that scores the end state.

A task is a list of goals (a switch in a state, an app in front, an alarm
saved). The oracle compares the phone before and after the episode:

- ``goal_reached``: every goal holds at the end;
- ``collateral``: anything else that changed: another switch, an existing
  alarm, alarms not asked for, or a target switch that was already right and was
  toggled anyway (``wifi_on_already`` must not touch it);
- success needs the goal, no collateral damage, and the agent's own
  ``task_complete``; declaring done without the goal is a false claim.

Variants change the phone, not the goal: ``rename`` (other labels),
``reorder`` (lists shuffled), ``decoy`` (switches that also say Wi-Fi next to
it), ``chain`` (a second task after the first).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Union

from edge_infer.agent.phone import LABELS, PACKAGES, Variant, demo_phone
from edge_infer.agent.simulator import SimulatedDevice
from edge_infer.agent.state import PhoneState


@dataclass(frozen=True)
class SwitchGoal:
    name: str  # a switch of the demo phone: "wifi", "airplane", ...
    on: bool

    def holds(self, before: PhoneState, after: PhoneState) -> bool:
        return after.switch(self.name) == self.on

    def summary(self) -> str:
        return f"{LABELS[self.name]} is {'on' if self.on else 'off'}."


@dataclass(frozen=True)
class AppGoal:
    app: str  # "clock" or "settings"

    def holds(self, before: PhoneState, after: PhoneState) -> bool:
        return after.app == PACKAGES[self.app]

    def summary(self) -> str:
        return f"The {LABELS[self.app]} app is open."


@dataclass(frozen=True)
class AlarmGoal:
    time: str  # as the Clock app lists it: "7:30 AM"

    def holds(self, before: PhoneState, after: PhoneState) -> bool:
        if after.alarms is None:  # a real phone: the alarm must be on screen
            return after.has_text(self.time)
        return _count(after, self.time) > _count(before, self.time)

    def summary(self) -> str:
        return f"An alarm is set for {self.time}."


Goal = Union[SwitchGoal, AppGoal, AlarmGoal]


def _count(state: PhoneState, time: str) -> int:
    return sum(1 for t, on in state.alarms or () if t == time and on)


@dataclass(frozen=True)
class Verdict:
    goal_reached: bool
    collateral: list[str]


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    goals: tuple[Goal, ...]
    switches: tuple[tuple[str, bool], ...] = ()  # how the phone starts (others are off)
    variant: str = "base"
    phone: Variant = Variant()
    simulator_only: bool = False  # its oracle needs what only the simulator knows (toggle history)

    @property
    def id(self) -> str:
        return self.name if self.variant == "base" else f"{self.name}/{self.variant}"

    def device(self) -> SimulatedDevice:
        return demo_phone(dict(self.switches), variant=self.phone)

    def judge(self, before: PhoneState, after: PhoneState) -> Verdict:
        reached = all(goal.holds(before, after) for goal in self.goals)
        targets = {g.name: g.on for g in self.goals if isinstance(g, SwitchGoal)}
        damage = []
        for name, was in before.switches.items():
            now = after.switch(name)
            if name not in targets and now is not None and now != was:
                damage.append(f"{LABELS[name]} was turned {'on' if now else 'off'}")
            toggles = after.times_toggled(name)
            if name in targets and was == targets[name] and toggles:
                damage.append(f"{LABELS[name]} was already {'on' if was else 'off'} and was toggled {toggles} time(s)")
        if before.alarms is not None and after.alarms is not None:
            kept = list(after.alarms)
            for time, on in before.alarms:
                same = next((a for a in kept if a == (time, on)), None) or next((a for a in kept if a[0] == time), None)
                if same is None:
                    damage.append(f"the {time} alarm was removed")
                    continue
                kept.remove(same)
                if same[1] != on:
                    damage.append(f"the {time} alarm was turned {'on' if same[1] else 'off'}")
            for goal in self.goals:
                if isinstance(goal, AlarmGoal) and (goal.time, True) in kept:
                    kept.remove((goal.time, True))
            if kept:
                damage.append("alarms not asked for were added: " + ", ".join(time for time, _ in kept))
        return Verdict(reached, damage)


# -- variants ----------------------------------------------------------------------------

RENAMED = (("network", "Connections"), ("wifi", "WLAN"), ("airplane", "Flight mode"))


def rename(task: Task, labels: tuple[tuple[str, str], ...] = RENAMED) -> Task:
    return replace(task, variant="rename", phone=replace(task.phone, labels=labels))


def reorder(task: Task, seed: int = 7) -> Task:
    return replace(task, variant="reorder", phone=replace(task.phone, shuffle=seed))


def decoy(task: Task) -> Task:
    return replace(task, variant="decoy", phone=replace(task.phone, decoys=("wifi_calling", "wifi_hotspot")))


def chain(task: Task, then: Task) -> Task:
    return replace(
        task, variant="chain", prompt=f"{task.prompt.rstrip('.')}, then {_lower_first(then.prompt)}",
        goals=task.goals + then.goals, switches=task.switches + then.switches,
    )


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


# -- the suite -----------------------------------------------------------------------------

WIFI_ON = Task("wifi_on", "Turn on Wi-Fi.", (SwitchGoal("wifi", True),), (("bluetooth", True),))
OPEN_CLOCK = Task("open_clock", "Open the Clock app.", (AppGoal("clock"),))
BASE_TASKS = (
    WIFI_ON,
    Task("wifi_on_already", "Turn on Wi-Fi.", (SwitchGoal("wifi", True),), (("wifi", True), ("bluetooth", True)),
         simulator_only=True),
    Task("wifi_off", "Turn off Wi-Fi.", (SwitchGoal("wifi", False),), (("wifi", True),)),
    Task("airplane_on", "Turn on Airplane mode.", (SwitchGoal("airplane", True),), (("wifi", True),)),
    OPEN_CLOCK,
    Task("add_alarm", "Set an alarm for 7:30 AM.", (AlarmGoal("7:30 AM"),)),
)
VARIANTS = (rename(WIFI_ON), reorder(WIFI_ON), decoy(WIFI_ON), chain(WIFI_ON, OPEN_CLOCK))
SUITE: tuple[Task, ...] = BASE_TASKS[:1] + VARIANTS + BASE_TASKS[1:]


def select(names: list[str] | None = None, variants: bool = True) -> list[Task]:
    """Tasks by name (``wifi_on`` includes its variants, ``wifi_on/decoy`` is one of them); ValueError names unknown ones."""
    pool = [t for t in SUITE if variants or t.variant == "base"]
    if not names:
        return pool
    unknown = [n for n in names if not any(n in (t.name, t.id) for t in SUITE)]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; the suite has {', '.join(t.id for t in SUITE)}")
    return [t for t in pool if t.name in names or t.id in names]


def by_id(task_id: str) -> Task:
    for task in SUITE:
        if task.id == task_id:
            return task
    raise ValueError(f"unknown task {task_id!r}; the suite has {', '.join(t.id for t in SUITE)}")


@dataclass
class Outcome:
    """One scored episode."""

    task: str  # the task's id
    success: bool
    goal_reached: bool
    declared_done: bool
    false_claim: bool  # declared done, goal not reached
    collateral: list[str]
    stop_reason: str
    steps: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    recoveries: dict[str, int] = field(default_factory=dict)  # tool-call source -> steps
    error: str | None = None


def score(task: Task, episode, before: PhoneState, after: PhoneState) -> Outcome:
    verdict = task.judge(before, after)
    sources: dict[str, int] = {}
    for step in episode.steps:
        if step.call is not None:
            sources[step.call.source] = sources.get(step.call.source, 0) + 1
    return Outcome(
        task=task.id, success=verdict.goal_reached and not verdict.collateral and episode.declared_done,
        goal_reached=verdict.goal_reached, declared_done=episode.declared_done,
        false_claim=episode.declared_done and not verdict.goal_reached, collateral=verdict.collateral,
        stop_reason=episode.stop_reason, steps=len(episode.steps), prompt_tokens=episode.prompt_tokens,
        completion_tokens=episode.completion_tokens, wall_s=round(episode.wall_s, 3), recoveries=sources,
        error=episode.error,
    )

