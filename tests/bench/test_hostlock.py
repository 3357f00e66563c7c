from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import edge_infer
from edge_infer.bench.harness.hostlock import HostLock, LockHeld

from .conftest import FAST, code_arm, metrics_arm

SRC = str(Path(edge_infer.__file__).resolve().parent.parent)


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def test_second_holder_is_refused_with_the_holders_pid(private_lock):
    with HostLock(private_lock):
        with pytest.raises(LockHeld, match=f"pid {os.getpid()}.*--wait-lock"):
            HostLock(private_lock).acquire()
    with HostLock(private_lock):  # released: free again
        pass


def test_second_grid_is_refused_while_the_first_holds_the_lock(tmp_path, private_lock, write_spec, grid, capsys):
    release = tmp_path / "release"
    waiting_arm = code_arm(
        "waits",
        f"import json, os, time\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n"
        f"print(json.dumps({{'step_ms': 1.0}}))",
    )
    first_spec = tmp_path / "first.json"
    first_spec.write_text(json.dumps({"arms": [waiting_arm]}))
    first = subprocess.Popen(
        [sys.executable, "-m", "edge_infer.cli", "bench", "grid", "--spec", str(first_spec), "--passes", "1", *FAST],
        env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: private_lock.exists() and str(first.pid) in private_lock.read_text())
        rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [1.0]})]))
        assert rc == 3 and result is None
        err = capsys.readouterr().err
        assert f"pid {first.pid}" in err and "another benchmark holds the host lock" in err
    finally:
        release.touch()
        try:
            first.wait(timeout=60)
        finally:
            first.kill()
    assert first.returncode == 0, first.stderr.read()


def test_no_lock_runs_beside_a_holder(private_lock, write_spec, grid):
    with HostLock(private_lock):
        rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [1.0]})]), "--no-lock", "--passes", "1")
    assert rc == 0 and result.settings.lock is None


def test_wait_lock_queues_behind_the_holder(private_lock, write_spec, grid, capsys):
    holder = HostLock(private_lock)
    holder.acquire()
    timer = threading.Timer(0.5, holder.release)
    timer.start()
    try:
        rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [1.0]})]), "--wait-lock", "--passes", "1")
    finally:
        timer.join()
    assert rc == 0 and len(result.observations) == 1
    assert "waiting for the host lock" in capsys.readouterr().err
