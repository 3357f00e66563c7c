"""The executor: every tool on the simulated phone, and every mistake answered with a sentence."""
from __future__ import annotations

from dataclasses import replace

import pytest

from edge_infer.agent.actions import TOOL_NAMES, TOOLS
from edge_infer.agent.executor import describe, execute
from edge_infer.agent.phone import demo_phone
from edge_infer.agent.ui_tree import Screen, parse_ui_dump


def on_screen(device):
    return parse_ui_dump(device.dump())


def picker():
    device = demo_phone()
    device.launch("Clock")
    for label in ("Alarms", "Add alarm"):
        element = next(e for e in on_screen(device).elements if e.label == label)
        device.tap(*element.center)
    return device


def test_tools_are_openai_function_tools():
    assert TOOL_NAMES == ("tap", "type_text", "swipe", "press_key", "open_app", "task_complete")
    for tool in TOOLS:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == list(params["properties"])


def test_tap_open_app_press_key_and_task_complete():
    device = demo_phone()
    result = execute(device, on_screen(device), "open_app", {"name": "Settings"})
    assert (result.ok, result.message, result.action) == (True, "Opened Settings.", 'open_app(name="Settings")')
    result = execute(device, on_screen(device), "tap", {"index": 1})
    assert result.ok and result.message == 'Tapped [1] LinearLayout "Network & internet · Wi-Fi, Mobile network".'
    assert on_screen(device).elements[1].label == "Network & internet"
    assert execute(device, on_screen(device), "press_key", {"key": "Back"}).message == "Pressed back."
    assert on_screen(device).elements[0].label == "Settings"
    done = execute(device, on_screen(device), "task_complete", {"summary": "Wi-Fi is on."})
    assert (done.ok, done.done, done.summary) == (True, True, "Wi-Fi is on.")


def test_quoted_indices_are_accepted():
    device = demo_phone()
    assert execute(device, on_screen(device), "tap", {"index": "7"}).message == 'Tapped [7] TextView "Settings".'
    device.keyevent("home")
    assert execute(device, on_screen(device), "tap", {"index": "[5]"}).ok


def test_type_text_focuses_the_field_and_replaces_its_text():
    device = picker()
    assert execute(device, on_screen(device), "type_text", {"index": 1, "text": "11"}).ok
    result = execute(device, on_screen(device), "type_text", {"index": 1, "text": "7"})
    assert result.message == 'Typed "7" into [1] EditText "11" #hour.'
    assert device.app.fields["hour"] == "7"
    assert ("key", "del") in device.records and ("text", "7") in device.records


def test_swipe_moves_the_finger_against_the_direction():
    device = demo_phone()
    assert execute(device, on_screen(device), "swipe", {"direction": "up"}).message == "Swiped up."
    assert execute(device, on_screen(device), "swipe", {"direction": "left"}).ok
    assert device.records == [("swipe", 540, 1800, 540, 600), ("swipe", 810, 1200, 270, 1200)]


@pytest.mark.parametrize(("name", "args", "message"), [
    ("click", {"index": 1}, "There is no tool named 'click'; use one of tap, type_text, swipe, press_key, open_app, task_complete."),
    ("tap", {}, "index must be an element number, got None."),
    ("tap", {"index": True}, "index must be an element number, got True."),
    ("tap", {"index": 42}, "There is no element 42 on this screen; the elements are numbered 0 to 7."),
    ("tap", {"index": -1}, "There is no element -1 on this screen; the elements are numbered 0 to 7."),
    ("type_text", {"index": 0, "text": "hi"}, 'Element 0 is not a text field: [0] TextView "Phone".'),
    ("type_text", {"index": 0, "text": ""}, "text must be a non-empty string, got ''."),
    ("swipe", {"direction": "sideways"}, "direction must be one of up, down, left, right, got 'sideways'."),
    ("press_key", {"key": "power"}, "key must be one of back, home, enter, got 'power'."),
    ("open_app", {"name": 3}, "name must be a non-empty string, got 3."),
    ("open_app", {"name": "Spotify"},
     'The phone could not do open_app(name="Spotify"): there is no app called \'Spotify\' on this phone; its apps are '
     "Phone, Messages, Camera, Photos, Chrome, Clock, Calendar, Settings."),
])
def test_mistakes_come_back_as_sentences(name, args, message):
    device = demo_phone()
    result = execute(device, on_screen(device), name, args)
    assert (result.ok, result.done, result.message) == (False, False, message)
    assert result.action == describe(name, args)


def test_disabled_elements_and_unreadable_screens():
    device = demo_phone()
    screen = on_screen(device)
    disabled = Screen([replace(screen.elements[0], enabled=False)], 0, "")
    assert execute(device, disabled, "tap", {"index": 0}).message == 'Element 0 is disabled: [0] TextView "Phone" disabled.'
    result = execute(device, None, "tap", {"index": 0})
    assert not result.ok and "could not be read" in result.message
    assert execute(device, None, "press_key", {"key": "home"}).ok  # keys need no screen
    assert device.records == [("key", "home")]
