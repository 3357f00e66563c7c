"""The agent loop's rules, each against a scripted model on the simulated phone."""
from __future__ import annotations

import json

import pytest

from edge_infer.agent.actions import SYSTEM_PROMPT, TOOLS
from edge_infer.agent.chat import ChatError, Reply
from edge_infer.agent.loop import NO_CALL, NO_CHANGE, AgentConfig, messages_for, run_episode
from edge_infer.agent.phone import demo_phone
from edge_infer.agent.tasks import BASE_TASKS, score
from edge_infer.agent.ui_tree import parse_ui_dump


def call(tool: str, /, **args) -> Reply:
    return Reply("", [(tool, json.dumps(args))], prompt_tokens=100, completion_tokens=10)


class Scripted:
    """Replies from a list (the last one repeats); records what it was asked."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.asked: list[tuple[list[dict], bool]] = []

    def complete(self, messages, tools, thinking=True) -> Reply:
        assert tools is TOOLS
        self.asked.append((messages, thinking))
        reply = self.replies[min(len(self.asked) - 1, len(self.replies) - 1)]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def prompt(self, i: int) -> str:
        return self.asked[i][0][1]["content"]


def play(model, device=None, task="Turn on Wi-Fi.", **config):
    device = device or demo_phone()
    return run_episode(device, task, AgentConfig(**config), model), device


def in_settings():
    device = demo_phone()
    device.launch("Settings")
    return device


def in_network():
    device = in_settings()
    device.tap(*parse_ui_dump(device.dump()).elements[1].center)
    return device


def test_the_prompt_is_system_then_task_history_notes_and_screen():
    assert messages_for("Turn on Wi-Fi.", ["open_app(name=\"Settings\")"], [NO_CHANGE], "[0] TextView \"Settings\"") == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": 'Screen:\n[0] TextView "Settings"\nLast actions:\nopen_app(name="Settings")\n'
                                    f'{NO_CHANGE}\nTask: Turn on Wi-Fi.'},
    ]


def test_an_empty_reply_is_asked_again_without_thinking():
    model = Scripted(Reply(""), Reply("<think>let me see</think>"), call("task_complete", summary="done"))
    episode, _ = play(model)
    assert [thinking for _, thinking in model.asked] == [True, False, False]
    assert episode.steps[0].retries == 2 and episode.stop_reason == "task_complete"
    assert episode.prompt_tokens == 100 and episode.completion_tokens == 10  # empty replies counted too (0 each)


def test_a_reply_that_stays_empty_ends_the_episode():
    model = Scripted(Reply("  "))
    episode, _ = play(model, retries=2)
    assert len(model.asked) == 3 and episode.stop_reason == "no_reply" and not episode.declared_done


def test_after_a_no_op_the_next_turn_says_the_screen_did_not_change():
    model = Scripted(call("tap", index=0), call("tap", index=1), call("task_complete", summary="x"))
    episode, device = play(model, in_settings())  # [0] is the title: tapping it does nothing
    assert NO_CHANGE in model.prompt(1) and episode.steps[1].notes == [NO_CHANGE]
    assert NO_CHANGE not in model.prompt(2)  # tapping [1] opened Network & internet
    assert episode.stop_reason == "task_complete"


def test_the_same_action_on_the_same_screen_is_not_run_again():
    model = Scripted(call("tap", index=0))
    episode, device = play(model, in_settings())
    assert episode.stop_reason == "repeated_action" and len(episode.steps) == 2
    assert episode.steps[1].result is None and [r[0] for r in device.records] == ["launch", "tap"]


def test_the_same_action_on_a_new_screen_is_not_a_repeat():
    device = in_network()
    model = Scripted(call("press_key", key="back"), call("press_key", key="back"), call("task_complete", summary="home"))
    episode, _ = play(model, device)
    assert episode.stop_reason == "task_complete" and len(episode.steps) == 3


def test_toggling_back_and_forth_stops_after_two_undos():
    episode, device = play(Scripted(call("tap", index=2)), in_network())  # Wi-Fi on, off, on, off
    assert episode.stop_reason == "oscillation"
    assert device.app.toggled == [("wifi", True), ("wifi", False), ("wifi", True), ("wifi", False)]


def test_visiting_submenus_and_coming_back_is_navigation():
    network, display, battery = 1, 6, 5
    model = Scripted(*[r for i in (network, display, battery) for r in (call("tap", index=i), call("press_key", key="back"))],
                     call("task_complete", summary="looked around"))
    episode, _ = play(model, in_settings())
    assert episode.stop_reason == "task_complete" and len(episode.steps) == 7


def test_entering_and_leaving_the_same_submenu_twice_is_an_oscillation():
    model = Scripted(call("tap", index=1), call("press_key", key="back"), call("tap", index=1),
                     call("press_key", key="back"), call("task_complete", summary="x"))
    episode, _ = play(model, in_settings())
    assert episode.stop_reason == "oscillation" and len(episode.steps) == 4


def test_the_step_budget():
    apps = ["Settings", "Clock", "Camera"]
    model = Scripted(*[call("open_app", name=apps[i % 3]) for i in range(20)])
    episode, _ = play(model, max_steps=5)
    assert episode.stop_reason == "step_budget" and len(episode.steps) == 5 and len(model.asked) == 5


def test_the_loop_never_declares_success_itself():
    wifi_on = BASE_TASKS[0]
    device = wifi_on.device()
    before = device.phone_state()
    model = Scripted(call("open_app", name="Settings"), call("tap", index=1), call("tap", index=2),
                     call("press_key", key="home"), call("open_app", name="Clock"), call("press_key", key="home"))
    episode, device = play(model, device, max_steps=6)
    outcome = score(wifi_on, episode, before, device.phone_state())
    assert (episode.stop_reason, episode.declared_done) == ("step_budget", False)
    assert outcome.goal_reached and not outcome.success and not outcome.false_claim


def test_a_reply_without_a_call_is_told_so():
    model = Scripted(Reply("Wi-Fi sounds good."), call("task_complete", summary="x"))
    episode, _ = play(model)
    assert episode.steps[0].call.source == "none" and episode.steps[0].result is None
    assert NO_CALL in model.prompt(1)


def test_a_server_failure_ends_the_episode_with_the_error():
    model = Scripted(call("open_app", name="Settings"), ChatError("cannot reach the server at http://x/v1"))
    episode, _ = play(model)
    assert episode.stop_reason == "error" and episode.error == "cannot reach the server at http://x/v1"
    assert len(episode.steps) == 2


class Flaky:
    """A device whose first ``bad`` dumps are garbage."""

    def __init__(self, bad: int):
        self.inner, self.bad = demo_phone(), bad

    def dump(self) -> str:
        self.bad -= 1
        return "<hierarchy><node" if self.bad >= 0 else self.inner.dump()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_an_unreadable_screen_is_described_to_the_model():
    model = Scripted(call("tap", index=0), call("open_app", name="Clock"), call("task_complete", summary="x"))
    episode, _ = play(model, Flaky(bad=1))
    assert model.prompt(0).startswith("Screen:\n(the screen could not be read: the dump is not well-formed XML (")
    assert "tap(index=0) failed: The screen could not be read" in model.prompt(1)
    assert episode.stop_reason == "task_complete"


def test_a_screen_that_stays_unreadable_ends_the_episode():
    episode, _ = play(Scripted(call("press_key", key="back")), Flaky(bad=10), retries=2)
    assert episode.stop_reason == "screen_unreadable" and len(episode.steps) == 2


def test_the_history_shows_the_last_actions_and_failures():
    model = Scripted(call("open_app", name="Settings"), call("tap", index=99), call("tap", index=1),
                     call("task_complete", summary="x"))
    play(model, history=2)
    assert model.prompt(3).endswith(
        "\nLast actions:\n"
        "tap(index=99) failed: There is no element 99 on this screen; the elements are numbered 0 to 8.\n"
        "tap(index=1)\nTask: Turn on Wi-Fi."
    )


@pytest.mark.parametrize("task", BASE_TASKS, ids=lambda t: t.id)
def test_token_and_time_accounting(task):
    model = Scripted(call("open_app", name="Clock"), call("task_complete", summary="x"))
    episode, _ = play(model, task.device(), task.prompt)
    assert episode.prompt_tokens == 200 and episode.completion_tokens == 20
    assert episode.wall_s >= sum(s.seconds for s in episode.steps) > 0
