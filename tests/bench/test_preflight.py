from __future__ import annotations

import subprocess
import sys

import pytest

from edge_infer.bench.harness import preflight
from edge_infer.bench.harness.results import LoadSample

from .conftest import metrics_arm

BUSY_LOOP = "import os, sys; os.sched_setaffinity(0, {{{}}}); print('ready', flush=True)\nwhile True: pass"


@pytest.fixture
def busy_core(core):
    """A process spinning on ``core`` for the duration of one test, always stopped."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(core)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_idle_cores_pass():
    sample = preflight.assess({0: 1.0, 1: 3.0}, max_stolen_pct=5, max_core_busy_pct=50, when="preflight")
    assert not sample.busy and sample.reason is None and sample.stolen_pct == 2.0


def test_stolen_capacity_and_a_hot_core_are_both_reasons():
    stolen = preflight.assess({0: 8.0, 1: 6.0}, max_stolen_pct=5, max_core_busy_pct=50, when="preflight")
    assert stolen.busy and "7.0% of the target cores' capacity" in stolen.reason
    # Twelve cores, one at 60%: the mean (5%) is within limits, the hot core is not.
    per_core = {**{c: 0.0 for c in range(11)}, 11: 60.0}
    hot = preflight.assess(per_core, max_stolen_pct=5, max_core_busy_pct=50, when="preflight")
    assert hot.busy and "core 11 at 60%" in hot.reason and "capacity" not in hot.reason


def test_proc_stat_is_read_per_core(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  30 0 10 100 5 0 0 0 0 0\n"
        "cpu0 10 0 5 50 5 0 0 0 7 0\n"
        "cpu1 20 0 5 50 0 0 0 3 0 0\n"
        "intr 1 2 3\n"
    )
    # busy excludes idle and iowait; guest time is already inside user time.
    assert preflight.read_cpu_times(str(stat)) == {0: (15, 70), 1: (28, 78)}


def test_core_lists_parse():
    assert preflight.parse_cores("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(ValueError, match="0-3,6"):
        preflight.parse_cores("2-1")


def test_busy_target_core_is_refused(busy_core, core, write_spec, grid, capsys):
    spec = write_spec([metrics_arm("A", {"step_ms": [1.0]})])
    rc, result = grid(spec, "--cores", str(core), "--preflight-window-s", "0.2", fast=False)
    assert rc == 3 and result is None
    err = capsys.readouterr().err
    assert "refusing to run" in err and f"core {core}" in err and "--allow-busy" in err


def test_allow_busy_runs_and_labels_every_pass(busy_core, core, write_spec, grid, capsys):
    spec = write_spec([metrics_arm("A", {"step_ms": [1.0]}), metrics_arm("B", {"step_ms": [1.1]})])
    rc, result = grid(spec, "--cores", str(core), "--passes", "2", "--settle-s", "0",
                      "--preflight-window-s", "0.2", "--allow-busy", fast=False)
    assert rc == 0
    assert [s.when for s in result.load] == ["preflight", "before pass 2"]
    assert all(s.busy for s in result.load)
    assert len(result.observations) == 4 and all(o.under_load for o in result.observations)
    assert all(r.n_under_load == r.n == 2 for r in result.summary)
    assert any(f.kind == "UNDER_LOAD" and "4 of 4" in f.message for f in result.flags)
    assert "load 2/2" in capsys.readouterr().out


def test_load_appearing_between_passes_labels_those_passes(write_spec, grid, monkeypatch):
    def fake_check(cores, window_s, max_stolen, max_core, when):
        busy = when == "before pass 3"
        return LoadSample(when=when, per_core_pct={c: 90.0 if busy else 0.0 for c in cores},
                          stolen_pct=90.0 if busy else 0.0, busy=busy, reason="synthetic" if busy else None)

    monkeypatch.setattr(preflight, "check_cores", fake_check)
    rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [1.0]})]))
    assert [o.under_load for o in result.observations] == [False, False, True]
    assert any(f.kind == "UNDER_LOAD" and "1 of 3" in f.message for f in result.flags)
