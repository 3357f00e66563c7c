"""The agent loop: screen -> model -> action -> screen, until the model says it is done or a rule stops it.

Each turn is one fresh conversation (system prompt, then the current screen,
the last few actions and the task), so a prompt stays the same size however
long the episode runs; that is what a small model on an edge box can afford.

Rules, each with its ``stop_reason``:

- an empty reply (no text, no call) is asked again without thinking, up to
  ``retries`` times (``no_reply`` when it stays empty);
- after an action that changed nothing on screen, the next turn says so;
- the same action on the same screen as the turn before is not run again
  (``repeated_action``);
- going back and forth between the same two screens twice (a step undone,
  redone and undone again) stops the episode (``oscillation``), while
  entering a submenu and leaving it again is navigation, not an undo loop;
- at most ``max_steps`` turns (``step_budget``);
- only the model's ``task_complete`` ends an episode as done
  (``task_complete``); the loop never judges success, the task oracle does.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from edge_infer.agent.actions import SYSTEM_PROMPT, TOOLS
from edge_infer.agent.chat import ChatError, ChatModel, Reply
from edge_infer.agent.device import Device, DeviceError
from edge_infer.agent.executor import ActionResult, execute
from edge_infer.agent.tool_parse import ParsedCall, extract_tool_call, visible_text
from edge_infer.agent.ui_tree import Screen, UiDumpError, parse_ui_dump

NO_CHANGE = "The screen did not change after your last action."
NO_CALL = "Your last reply had no tool call. Answer with one tool call."


@dataclass(frozen=True)
class AgentConfig:
    base_url: str = "http://127.0.0.1:8000/v1"  # edge-infer serve's default
    model: str | None = None  # default: the first model the server lists
    api_key: str = "unused"
    max_steps: int = 12
    max_tokens: int = 1024
    temperature: float = 0.0
    retries: int = 3  # re-asks of an empty reply; also unreadable screens in a row
    max_elements: int = 60
    history: int = 4  # past actions shown in each turn
    timeout_s: float = 120.0


@dataclass
class Step:
    screen: str  # as the model saw it
    reply: str  # the text of the reply that was used
    call: ParsedCall | None
    result: ActionResult | None = None
    retries: int = 0
    notes: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


@dataclass
class Episode:
    task: str
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = ""
    declared_done: bool = False
    summary: str = ""
    error: str | None = None
    wall_s: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.steps)


def user_message(task: str, history: list[str], notes: list[str], screen: str) -> str:
    """One turn's prompt; the demo model's training data is rendered by this same function.

    The task comes last, next to where the answer starts: a small model
    attends to what is near far more easily than to what is 100 tokens back.
    """
    parts = ["Screen:\n" + screen]
    if history:
        parts.append("Last actions:\n" + "\n".join(history))
    return "\n".join([*parts, *notes, f"Task: {task}"])


def messages_for(task: str, history: list[str], notes: list[str], screen: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_message(task, history, notes, screen)}]


def history_line(result: ActionResult) -> str:
    return result.action if result.ok else f"{result.action} failed: {result.message}"


class _Undos:
    """Counts steps that undo the step before them, per pair of screens."""

    def __init__(self):
        self.visited: list[str] = []  # signatures, consecutive repeats collapsed
        self.counts: Counter[frozenset[str]] = Counter()
        self._last_was_undo = False

    def see(self, signature: str) -> int:
        """Record the screen after a step; returns the undo count of the pair it returned between (0 if none)."""
        if self.visited and self.visited[-1] == signature:
            return 0
        undo = len(self.visited) >= 2 and self.visited[-2] == signature and not self._last_was_undo
        self._last_was_undo = undo
        pair = frozenset((signature, self.visited[-1])) if self.visited else frozenset()
        self.visited.append(signature)
        if not undo:
            return 0
        self.counts[pair] += 1
        return self.counts[pair]


def run_episode(device: Device, task: str, config: AgentConfig = AgentConfig(), model: ChatModel | None = None) -> Episode:
    """Operate ``device`` until the model calls task_complete or a rule stops it; never raises for the model's mistakes."""
    if model is None:
        from edge_infer.agent.chat import OpenAIChat

        model = OpenAIChat(config.base_url, config.model, config.api_key, config.max_tokens, config.temperature, config.timeout_s)
    episode = Episode(task)
    start = time.perf_counter()
    try:
        _play(device, task, config, model, episode)
    except ChatError as exc:
        episode.stop_reason, episode.error = "error", str(exc)
    episode.wall_s = time.perf_counter() - start
    return episode


def _read(device: Device, config: AgentConfig) -> tuple[Screen | None, str, str | None]:
    """(screen, its text for the model, its signature); an unreadable screen is described, not raised.

    It has no signature: nothing is known about it, so it is neither a repeat nor an undo of anything.
    """
    try:
        screen = parse_ui_dump(device.dump(), config.max_elements)
    except (UiDumpError, DeviceError) as exc:
        return None, f"(the screen could not be read: {exc})", None
    return screen, screen.render(), screen.signature()


def _ask(model: ChatModel, messages: list[dict[str, str]], config: AgentConfig, step: Step) -> Reply | None:
    reply = model.complete(messages, TOOLS)
    step.prompt_tokens, step.completion_tokens = reply.prompt_tokens, reply.completion_tokens
    while not reply.tool_calls and not visible_text(reply.content):
        if step.retries == config.retries:
            return None
        step.retries += 1
        reply = model.complete(messages, TOOLS, thinking=False)
        step.prompt_tokens += reply.prompt_tokens
        step.completion_tokens += reply.completion_tokens
    return reply


def _play(device: Device, task: str, config: AgentConfig, model: ChatModel, episode: Episode) -> None:
    history: list[str] = []
    notes: list[str] = []
    undos = _Undos()
    last: tuple[str, str] | None = None  # (signature, action key) of the last action run
    acted = False  # an action ran since the previous screen was read
    unreadable = 0
    for _ in range(config.max_steps):
        began = time.perf_counter()
        screen, shown, signature = _read(device, config)
        unreadable = unreadable + 1 if screen is None else 0
        if unreadable > config.retries:
            episode.stop_reason = "screen_unreadable"
            return
        if signature is not None:
            if acted and episode.steps[-1].result.ok and signature == last[0]:
                notes.append(NO_CHANGE)
            if undos.see(signature) >= 2:
                episode.stop_reason = "oscillation"
                return
        acted = False
        step = Step(screen=shown, reply="", call=None, notes=notes)
        episode.steps.append(step)
        reply = _ask(model, messages_for(task, history[-config.history:], notes, shown), config, step)
        notes = []
        step.seconds = time.perf_counter() - began
        if reply is None:
            episode.stop_reason = "no_reply"
            return
        step.reply = reply.content
        step.call = extract_tool_call(reply, TOOLS)
        if step.call.source == "none":
            notes.append(NO_CALL)
            continue
        if signature is not None and last == (signature, step.call.key):
            episode.stop_reason = "repeated_action"
            return
        step.result = execute(device, screen, step.call.name, step.call.args)
        step.seconds = time.perf_counter() - began
        if step.result.done:
            episode.declared_done, episode.summary = True, step.result.summary
            episode.stop_reason = "task_complete"
            return
        history.append(history_line(step.result))
        last, acted = (signature, step.call.key), True
    episode.stop_reason = "step_budget"
