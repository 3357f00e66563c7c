"""End-to-end: SIGTERM lets in-flight requests finish within the grace period, cancels the rest
explicitly, exits 0 and leaves no process behind."""
from __future__ import annotations

import signal
import threading

import openai
import psutil
import pytest

from .serverutil import ServerProcess, wait_until

pytestmark = pytest.mark.slow

GRACE_S = 5


def test_sigterm_drains_then_cancels_then_exits_0_without_orphans(served_model):
    # Two sequences at a time and far more work queued than the grace period allows.
    with ServerProcess(served_model, "--max-num-seqs", "2", "--max-model-len", "512", "--shutdown-grace-s", str(GRACE_S)) as server:
        workers = server.worker_pids()
        client = server.client()
        outcomes: dict[int, str] = {}
        started = threading.Semaphore(0)

        def run(i: int, max_tokens: int) -> None:
            try:
                stream = client.chat.completions.create(
                    model=served_model.name, messages=[{"role": "user", "content": f"Hello {i}"}], max_tokens=max_tokens,
                    stream=True, extra_body={"ignore_eos": True},
                )
                finish = None
                for n, chunk in enumerate(stream):
                    if n == 0:
                        started.release()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                outcomes[i] = f"finished:{finish}"
            except openai.APIError as exc:
                outcomes[i] = f"error:{exc.message}"

        jobs = [(0, 60), (1, 60)] + [(i, 480) for i in range(2, 18)]
        threads = [threading.Thread(target=run, args=job) for job in jobs]
        for t in threads:
            t.start()
        for _ in jobs:  # every request admitted and its stream open
            assert started.acquire(timeout=60)
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert server.proc.wait(60) == 0, server.output()

    assert sorted(outcomes) == list(range(18))
    # The first requests could finish within the grace period and did; the queue behind them was cancelled, explicitly.
    assert outcomes[0] == outcomes[1] == "finished:length"
    cancelled = [o for o in outcomes.values() if o.startswith("error:")]
    assert cancelled and all("shutting down" in o for o in cancelled)
    assert all(o in ("finished:length",) or o in cancelled for o in outcomes.values())
    wait_until(lambda: not any(psutil.pid_exists(p) for p in workers), "the worker process to be gone", 10)
