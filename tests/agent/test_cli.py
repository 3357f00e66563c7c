"""`edge-infer agent`: the task list, and bad input or an absent server as exit codes with a message, not a traceback."""
from __future__ import annotations

import pytest

from edge_infer.agent.serve import free_port
from edge_infer.cli import main


def test_tasks_lists_the_suite(capsys):
    assert main(["agent", "tasks"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["wifi_on", "Turn", "on", "Wi-Fi."] and len(lines) == 10
    assert any("wifi_on_already" in line and "(simulator only)" in line for line in lines)


def test_no_subcommand_is_a_usage_error(capsys):
    assert main(["agent"]) == 2
    assert "edge-infer agent {suite,episode,tasks}" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["suite", "--tasks", "wifi_on,bluetooth_on"], "unknown task(s) bluetooth_on"),
    (["suite", "--runs", "0"], "--runs must be at least 1"),
    (["suite", "--max-steps", "0"], "--max-steps must be at least 1"),
    (["suite", "--temperature", "-1"], "must not be negative"),
    (["suite", "some/model"], "a model (some/model) is given but not --serve"),
    (["episode", "wifi_on/nope"], "unknown task 'wifi_on/nope'"),
    (["episode", "wifi_on_already", "--adb"], "judged on the simulator's toggle history"),
])
def test_bad_input_exits_2_with_the_reason(capsys, argv, message):
    assert main(["agent", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_an_absent_server_exits_1_and_says_how_to_start_one(capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["agent", "suite", "--base-url", url, "--wait-s", "0"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the server at {url}" in err and "edge-infer serve" in err


def test_no_adb_exits_2(capsys, monkeypatch, tmp_path):
    # The server check comes first; a phone that cannot be reached is then bad input, not a crash.
    from edge_infer.agent import chat

    monkeypatch.setattr(chat, "wait_for_server", lambda *a, **k: "demo")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["agent", "episode", "wifi_on", "--adb"]) == 2
    assert "'adb' is not on PATH" in capsys.readouterr().err


def test_a_server_that_does_not_start_exits_1_with_its_output(capsys, tmp_path):
    assert main(["agent", "suite", "--serve", str(tmp_path / "no-such-model")]) == 1
    err = capsys.readouterr().err
    assert "did not come up" in err and "no-such-model" in err and "Traceback" not in err
