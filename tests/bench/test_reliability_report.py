"""`bench reliability` on a tiny model: every fault behaviour is an individual recorded outcome."""
from __future__ import annotations

import json

import pytest

from edge_infer.cli import main

from .engine_models import last_json, run_cli, tiny_text_checkpoint

OUTCOMES = [
    "oversized_plan_refused", "engine_start", "baseline", "saturation", "cancel_mid_stream", "request_after_cancel",
    "stale_session_rejected", "worker_kill", "restart_after_kill", "clean_close",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_text_checkpoint(tmp_path_factory.mktemp("reliability"))


@pytest.mark.slow
def test_reliability_records_each_behaviour_and_the_engine_passes_them(tiny, tmp_path):
    out = tmp_path / "rel"
    done = run_cli("bench", "reliability", str(tiny), "--out", str(out), "--dtype", "float32",
                   "--max-model-len", "256", "--max-tokens", "24", "--max-chunks", "3")
    report = json.loads((out / "report.json").read_text())
    by_name = {o["name"]: o for o in report["outcomes"]}
    assert [o["name"] for o in report["outcomes"]] == OUTCOMES
    failing = {n: (o["status"], o["error"]) for n, o in by_name.items() if o["status"] != "passed"}
    assert failing == {}
    assert done.returncode == 0, done.stderr
    assert report["status"] == "completed" and report["passed"] is True
    assert report["owned_processes_requiring_harness_cleanup"] == []
    assert last_json(done.stdout)["passed"] is True

    saturation = by_name["saturation"]["evidence"]["stats_while_unread"]
    assert saturation["high_water_chunks"] == saturation["max_chunks"] == 3
    cancel = by_name["cancel_mid_stream"]
    assert cancel["evidence"]["events_after_cancel"] == ["cancelled"]
    assert cancel["timings"]["ack_s"] is not None and "late_core_events" in cancel["evidence"]
    kill = by_name["worker_kill"]["evidence"]
    assert kill["explicit_error_reported"] and kill["healthy_after"] is False
    # The killed process was verified as the engine's own worker before the signal.
    assert kill["target"]["ppid"] == kill["target"]["harness_pid"]
    assert by_name["stale_session_rejected"]["evidence"]["error_type"] == "StaleSessionError"
    assert by_name["oversized_plan_refused"]["evidence"]["admitted"] is False


def test_a_refused_plan_is_reported_as_rejected(tiny, tmp_path, capsys):
    out = tmp_path / "rel"
    assert main(["bench", "reliability", str(tiny), "--out", str(out), "--max-model-len", "100000"]) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "rejected" and report["passed"] is False
    assert "max_model_len" in report["notes"][0]


def test_an_existing_report_directory_is_never_overwritten(tiny, tmp_path, capsys):
    (tmp_path / "old.json").write_text("{}")
    assert main(["bench", "reliability", str(tiny), "--out", str(tmp_path)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
