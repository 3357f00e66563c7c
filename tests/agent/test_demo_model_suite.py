"""End to end: the shipped demo model, served by `edge-infer serve`, operates the simulated phone (issue 18).

`edge-infer agent suite --serve` starts the real server on the demo model and
plays the suite's simple tasks greedily through the loop; each must pass the
oracle: goal reached, nothing else changed, and declared done by the model.
The model's other results (the wifi_on variants pass; add_alarm fails)
are in its README and docs/agent.md, not held here: the test stays at
five short episodes.
"""
from __future__ import annotations

import json

import pytest

from edge_infer.cli import main

SIMPLE_TASKS = ("wifi_on", "wifi_on_already", "wifi_off", "airplane_on", "open_clock")


@pytest.mark.slow
def test_the_demo_model_passes_the_simple_tasks(demo_model, tmp_path, capsys):
    report = tmp_path / "suite.json"
    # One thread: the server must not fight other work for the two cores; a reply is one call of ~22 tokens,
    # ~40 with the reading of a switch's line before it.
    argv = ["agent", "suite", str(demo_model), "--serve", "--tasks", ",".join(SIMPLE_TASKS), "--no-variants",
            "--num-threads", "1", "--max-tokens", "64", "--out", str(report)]
    assert main(argv) == 0, capsys.readouterr().err
    episodes = {e["task"]: e for e in json.loads(report.read_text())["episodes"]}
    assert sorted(episodes) == sorted(SIMPLE_TASKS)
    failed = {task: (e["stop_reason"], e["collateral"], e["steps"]) for task, e in episodes.items() if not e["success"]}
    assert failed == {}, capsys.readouterr().out
    # The shortest paths (home → Settings → Network & internet → the switch → done, or done at once when the
    # switch already is as asked; open the app → done), and
    # every call parsed by the server's tool parser, none recovered from free text.
    assert {task: e["steps"] for task, e in episodes.items()} == {"wifi_on": 4, "wifi_on_already": 3, "wifi_off": 4,
                                                                  "airplane_on": 4, "open_clock": 2}
    assert all(e["recoveries"] == {"tool_calls": e["steps"]} for e in episodes.values())
