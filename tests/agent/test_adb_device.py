"""AdbDevice against a fake ``adb`` on PATH that records its argv and answers like a phone."""
from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from edge_infer.agent.device import AdbDevice, DeviceError, input_text_arg
from edge_infer.agent.executor import execute
from edge_infer.agent.phone import demo_phone
from edge_infer.agent.state import read_state
from edge_infer.agent.ui_tree import parse_ui_dump

# Answers by the joined arguments (after an optional `-s SERIAL`); FAKE_ADB_FAIL makes any command containing it fail.
FAKE_ADB = textwrap.dedent("""\
    #!{python}
    import json, os, sys, time
    args = sys.argv[1:]
    with open(os.environ["FAKE_ADB_LOG"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    if args[:1] == ["-s"]:
        args = args[2:]
    line = " ".join(args)
    fail = os.environ.get("FAKE_ADB_FAIL")
    if fail and fail in line:
        print("error: device offline", file=sys.stderr)
        sys.exit(1)
    if "SLEEP" in os.environ and line.startswith("shell input"):
        time.sleep(float(os.environ["SLEEP"]))
    answers = json.loads(os.environ.get("FAKE_ADB_ANSWERS", "{{}}"))
    sys.stdout.write(answers.get(line, ""))
""")


@pytest.fixture
def adb(tmp_path, monkeypatch):
    """Put the fake adb first on PATH; returns a function giving the argv lists it was called with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "adb"
    script.write_text(FAKE_ADB.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "adb.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ADB_LOG", str(log))

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return calls


def answer(monkeypatch, answers: dict[str, str]) -> None:
    monkeypatch.setenv("FAKE_ADB_ANSWERS", json.dumps(answers))


def test_each_action_issues_the_input_command(adb):
    device = AdbDevice(serial="emulator-5554")
    device.tap(540, 1200)
    device.swipe(540, 1800, 540, 600, 250)
    device.keyevent("back")
    device.input_text("hello world")
    prefix = ["-s", "emulator-5554", "shell", "input"]
    assert adb() == [
        prefix + ["tap", "540", "1200"],
        prefix + ["swipe", "540", "1800", "540", "600", "250"],
        prefix + ["keyevent", "KEYCODE_BACK"],
        prefix + ["text", "hello%sworld"],
    ]


@pytest.mark.parametrize(("text", "arg"), [
    ("7", "7"),
    ("it's 5 o'clock", "'it'\"'\"'s%s5%so'\"'\"'clock'"),
    ("a&b;c|d", "'a&b;c|d'"),
    ("$(reboot)", "'$(reboot)'"),
])
def test_input_text_is_quoted_for_the_device_shell(text, arg):
    assert input_text_arg(text) == arg


@pytest.mark.parametrize("text", ["", "café", "line\nbreak"])
def test_text_adb_cannot_type_is_refused(text):
    with pytest.raises(DeviceError):
        input_text_arg(text)


def test_dump_uses_exec_out_and_the_xml_parses(adb, monkeypatch):
    xml = demo_phone().dump()
    answer(monkeypatch, {"exec-out uiautomator dump /dev/tty": xml + "UI hierchary dumped to: /dev/tty\n"})
    screen = parse_ui_dump(AdbDevice().dump())
    assert screen.elements[0].label == "Phone"
    assert adb() == [["exec-out", "uiautomator", "dump", "/dev/tty"]]


def test_a_dump_without_hierarchy_is_a_device_error(adb, monkeypatch):
    answer(monkeypatch, {"exec-out uiautomator dump /dev/tty": "ERROR: null root node returned by UiTestAutomationBridge.\n"})
    with pytest.raises(DeviceError, match="null root node"):
        AdbDevice().dump()


def test_launch_by_known_name_package_or_lookup(adb, monkeypatch):
    answer(monkeypatch, {
        "shell pm list packages": "package:com.android.chrome\npackage:org.videolan.vlc\npackage:com.spotify.music\n",
        "shell monkey -p com.example.none -c android.intent.category.LAUNCHER 1": "No activities found to run, monkey aborted.\n",
    })
    device = AdbDevice()
    device.launch("Clock")
    device.launch("org.videolan.vlc")
    device.launch("VLC")
    monkey = ["shell", "monkey", "-p"]
    launcher = ["-c", "android.intent.category.LAUNCHER", "1"]
    assert [c for c in adb() if c[:3] == monkey] == [
        monkey + ["com.google.android.deskclock"] + launcher,
        monkey + ["org.videolan.vlc"] + launcher,
        monkey + ["org.videolan.vlc"] + launcher,
    ]
    with pytest.raises(DeviceError, match="no single app is named 'Maps Pro'"):
        device.launch("Maps Pro")
    with pytest.raises(DeviceError, match="no launcher activity"):
        device.launch("com.example.none")


def test_size_prefers_the_override(adb, monkeypatch):
    answer(monkeypatch, {"shell wm size": "Physical size: 1080x2400\nOverride size: 720x1600\n"})
    assert AdbDevice().size() == (720, 1600)


def test_failures_name_the_command_and_the_error(adb, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_FAIL", "keyevent")
    with pytest.raises(DeviceError, match=r"`adb shell input keyevent KEYCODE_HOME` failed \(exit 1\): error: device offline"):
        AdbDevice().keyevent("home")
    with pytest.raises(DeviceError, match="unknown key"):
        AdbDevice().keyevent("volume_up")


def test_a_hung_command_times_out(adb, monkeypatch):
    monkeypatch.setenv("SLEEP", "5")
    with pytest.raises(DeviceError, match="did not finish within 0.5 s"):
        AdbDevice(timeout_s=0.5).tap(1, 2)


def test_no_adb_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DeviceError, match="not on PATH; install Android platform-tools"):
        AdbDevice()


def test_the_executor_drives_a_real_phone_the_same_way(adb, monkeypatch):
    simulated = demo_phone()
    simulated.launch("Clock")
    simulated.tap(*parse_ui_dump(simulated.dump()).elements[2].center)  # Alarms
    simulated.tap(*parse_ui_dump(simulated.dump()).elements[2].center)  # Add alarm
    screen = parse_ui_dump(simulated.dump().replace('text="" resource-id="com.google.android.deskclock:id/hour"',
                                                    'text="12" resource-id="com.google.android.deskclock:id/hour"'))
    result = execute(AdbDevice(), screen, "type_text", {"index": 1, "text": "7"})
    assert result.ok, result.message
    x, y = screen.elements[1].center
    assert adb() == [
        ["shell", "input", "tap", str(x), str(y)],
        ["shell", "input", "keyevent", "KEYCODE_MOVE_END"],
        ["shell", "input", "keyevent", "KEYCODE_DEL"],
        ["shell", "input", "keyevent", "KEYCODE_DEL"],
        ["shell", "input", "text", "7"],
    ]


def test_read_state_of_a_real_phone(adb, monkeypatch):
    answer(monkeypatch, {
        "shell settings get global wifi_on": "1\n", "shell settings get global airplane_mode_on": "0\n",
        "exec-out uiautomator dump /dev/tty": demo_phone().dump(),
    })
    state = read_state(AdbDevice())
    assert state.switches == {"wifi": True, "airplane": False}
    assert state.app == "com.google.android.apps.nexuslauncher" and state.has_text("Clock")
    assert state.alarms is None and state.times_toggled("wifi") is None
