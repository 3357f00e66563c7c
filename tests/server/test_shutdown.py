"""End-to-end SIGTERM: in-flight requests may finish within the grace period, what outlives it is
cancelled explicitly, the exit status is 0 and no process is left behind."""
from __future__ import annotations

import os
import signal
import threading

import openai
import psutil
import pytest

from .serverutil import ServerProcess, wait_until

pytestmark = pytest.mark.slow


def sigterm_during(served_model, grace_s: float, max_tokens: list[int], whole_group: bool = False) -> list[str]:
    """Start one stream per entry, send SIGTERM once all are open; each stream's outcome.

    ``whole_group``: signal the server's process group (its worker included), as a
    service manager stopping a control group or `timeout` does.
    """
    args = ("--max-num-seqs", "2", "--max-model-len", "512", "--shutdown-grace-s", str(grace_s))
    with ServerProcess(served_model, *args) as server:
        workers = server.worker_pids()
        client = server.client()
        outcomes: dict[int, str] = {}
        opened = threading.Semaphore(0)

        def run(i: int) -> None:
            try:
                stream = client.chat.completions.create(
                    model=served_model.name, messages=[{"role": "user", "content": f"Hello {i}"}], max_tokens=max_tokens[i],
                    stream=True, extra_body={"ignore_eos": True},
                )
                finish = None
                for n, chunk in enumerate(stream):
                    if n == 0:
                        opened.release()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                outcomes[i] = f"finished:{finish}"
            except openai.APIError as exc:
                outcomes[i] = f"error:{exc.message}"

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(max_tokens))]
        for t in threads:
            t.start()
        for _ in threads:  # every request admitted and its stream open (two decoding, the rest queued)
            assert opened.acquire(timeout=60)
        if whole_group:
            os.killpg(server.proc.pid, signal.SIGTERM)
        else:
            server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert server.proc.wait(60) == 0, server.output()
    wait_until(lambda: not any(psutil.pid_exists(p) for p in workers), "the worker process to be gone", 10)
    return [outcomes[i] for i in range(len(max_tokens))]


def test_sigterm_lets_in_flight_requests_finish_and_exits_0(served_model):
    assert sigterm_during(served_model, 120, [100] * 4) == ["finished:length"] * 4


def test_sigterm_to_the_whole_process_group_still_drains(served_model):
    assert sigterm_during(served_model, 120, [60] * 3, whole_group=True) == ["finished:length"] * 3


def test_sigterm_cancels_requests_that_outlive_the_grace_period(served_model):
    outcomes = sigterm_during(served_model, 0, [480] * 6)
    cancelled = [o for o in outcomes if o.startswith("error:")]
    # Four of them were still queued behind two long ones: they cannot all have finished.
    assert len(cancelled) >= 4
    assert all("shutting down" in o for o in cancelled)
    assert all(o == "finished:length" for o in outcomes if o not in cancelled)
