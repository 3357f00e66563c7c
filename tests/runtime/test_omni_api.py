"""The synchronous API, admission before start, and workers dying with their parent."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from edge_infer.runtime.omni import DeployRefused, Omni
from edge_infer.runtime.transport import list_segments
from omni_helpers import write_config
from runtime import toys
from runtime.toys.executors import toy_ar_tokens
from testutil import live_children, wait_until

pytestmark = pytest.mark.slow


@dataclasses.dataclass
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None


def test_sync_generate_collects_outputs_with_stage_defaults_and_overrides():
    with Omni(toys.TOY_TEXT) as omni:
        assert omni.default_sampling_params_list == [{"max_tokens": 16}]
        results = omni.generate(["ab", [1, 2]])
        assert [r.status for r in results] == ["finished", "finished"]
        assert list(results[0].joined(0)) == toy_ar_tokens([97, 98], 16)  # config default max_tokens
        assert list(results[1].joined(0)) == toy_ar_tokens([1, 2], 16)
        (one,) = omni.generate([7, 7, 7], sampling_params_list=[Sampling(max_tokens=3)])
        assert list(one.joined(0)) == toy_ar_tokens([7, 7, 7], 3)
        assert one.metrics[0].tokens_in == 3 and one.metrics[0].tokens_out == 3
        with pytest.raises(ValueError, match="one per stage"):
            omni.generate("x", sampling_params_list=[None, None])
        with pytest.raises(TypeError, match="cannot use a float as a prompt"):
            omni.generate(1.5)


def test_a_crashing_stage_reports_why_and_can_be_replaced(tmp_path):
    path = write_config(tmp_path, "base_config: toy_text.yaml\nstages: [{stage_id: 0, executor_options: {crash_on_token: 66}}]\n")
    with Omni(path) as omni:
        (crashed,) = omni.generate([1, 66])
        assert crashed.status == "error"
        assert "stage 0" in crashed.error and "exited with code 1" in crashed.error and "crashes on token 66" in crashed.error
        health = omni.health()
        assert health.dead_stages == [0] and "crashes on token 66" in health.stages[0].detail
        omni.retire_worker(0)
        (ok,) = omni.generate([1, 2])
        assert ok.status == "finished" and omni.health().healthy


def test_deploy_that_does_not_fit_is_refused_before_any_process(tmp_path):
    path = write_config(tmp_path, """
        base_config: toy_text.yaml
        stages: [{stage_id: 0, reservation: {kv_bytes: 100 TiB}}]
    """)
    before = {p.pid for p in live_children()}
    with pytest.raises(DeployRefused, match=r"stage 0 overruns pool ram") as exc:
        Omni(path)
    assert not exc.value.plan.admitted
    assert {p.pid for p in live_children()} <= before  # none started (an earlier test's may have ended)


NO_MAIN_GUARD = """
import json, sys
from edge_infer.runtime.omni import Omni
from runtime import toys

toys.register()
with Omni(sys.argv[1]) as omni:
    (result,) = omni.generate([1, 2])
print(json.dumps({"status": result.status, "error": result.error, "tokens": [int(t) for t in result.joined(0)]}))
"""


def test_a_script_without_a_main_guard_runs_a_pipeline(tmp_path):
    # Stage processes are fresh interpreters: nothing re-runs this script's top level in them.
    script = tmp_path / "no_guard.py"
    script.write_text(NO_MAIN_GUARD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, str(script), str(toys.TOY_TEXT)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == {"status": "finished", "error": None, "tokens": toy_ar_tokens([1, 2], 16)}


SCRIPT = """
import json, sys, threading, time
from edge_infer.runtime.omni import Omni
from edge_infer.runtime.transport import list_segments
from runtime import toys

if __name__ == "__main__":
    toys.register()
    omni = Omni(sys.argv[1])
    threading.Thread(target=omni.generate, args=([1, 2],), daemon=True).start()
    prefix = omni._omni._orchestrator.prefix
    deadline = time.monotonic() + 30
    while not list_segments(prefix) and time.monotonic() < deadline:  # buffers in flight
        time.sleep(0.05)
    print(json.dumps({"pids": list(omni.worker_pids().values()), "prefix": prefix, "segments": list_segments(prefix)}), flush=True)
    time.sleep(120)
"""


def test_workers_die_with_their_parent_and_take_their_segments(tmp_path):
    # A slow consumer: the producer's shared buffers pile up (to max_unacked) unreleased.
    config = write_config(tmp_path, """
        base_config: toy_speech.yaml
        connectors: {shared_memory: {inline_threshold_bytes: 0}}
        stages:
          - {stage_id: 0, executor_options: {step_delay_s: 0.02}, default_sampling: {max_tokens: 400}}
          - {stage_id: 1, executor_options: {step_delay_s: 0.3}}
    """)
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen([sys.executable, str(script), str(config)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(parent.stdout.readline())
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    workers = info["pids"]
    assert len(workers) == 2 and info["segments"]  # killed with shared buffers in flight
    assert wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers))
    assert wait_until(lambda: list_segments(info["prefix"]) == [])


def test_an_omni_dropped_without_shutdown_stops_its_stages():
    """An Omni let go unshut kept its loop thread and its stage processes until the program ended."""
    import gc

    omni = Omni(toys.TOY_TEXT)
    pids = [pid for pid in omni.worker_pids().values() if pid]
    assert pids and omni.generate([1, 2])[0].status == "finished"
    del omni
    gc.collect()

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_until(lambda: all(map(gone, pids)), timeout=10)


def test_an_async_omni_dropped_without_shutdown_stops_its_stages():
    import asyncio
    import gc

    from edge_infer.runtime.omni import AsyncOmni

    async def scenario() -> bool:
        omni = AsyncOmni(toys.TOY_TEXT)
        events = [e async for e in omni.generate([1, 2])]
        assert events[-1].kind == "finished"
        pids = [pid for pid in omni.worker_pids().values() if pid]
        del omni, events
        gc.collect()
        for _ in range(100):  # its shutdown runs on this loop
            if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
                return True
            await asyncio.sleep(0.1)
        return False

    assert asyncio.run(scenario())


def test_an_interrupted_generate_aborts_its_requests_and_a_shut_down_omni_says_so(tmp_path):
    """Ctrl-C in Omni.generate left its requests running on the loop thread: the next generate queued behind them
    (17 s). Any exception in the waiting thread (a signal handler's, here) now cancels them. After shutdown, a call
    names the state (it was "Event loop is closed", with a coroutine never awaited)."""
    import threading

    from edge_infer.errors import StaleSessionError

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    path = write_config(tmp_path, "base_config: toy_text.yaml\n"
                                  "stages: [{stage_id: 0, executor_options: {step_delay_s: 0.02}}]\n")
    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with Omni(path) as omni:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            with pytest.raises(Interrupted):
                omni.generate([[1, 2]] * 4, sampling_params_list=[Sampling(max_tokens=500)])  # 10 s
            assert wait_until(lambda: omni.health().stages[0].inflight == 0, timeout=5)  # aborted, not run out
            (ok,) = omni.generate([1, 2], sampling_params_list=[Sampling(max_tokens=3)])
            assert ok.status == "finished"
        with pytest.raises(StaleSessionError, match="shut down"):
            omni.generate([1, 2])
    finally:
        signal.signal(signal.SIGUSR1, previous)
