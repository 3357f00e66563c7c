"""A worker that dies is restarted (or the server exits for its supervisor); one that stops responding is
reported within seconds and its waiting requests end with an error; one that resumes is healthy again."""
from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from .serverutil import ServerProcess, wait_until

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello"}]
LONG = {"messages": HELLO, "max_tokens": 400, "ignore_eos": True}  # the test model has 512 positions
SHORT = {"messages": HELLO, "max_tokens": 2}


def chat(server, body, timeout=60) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=timeout)


# ~6 MB of answer (~2 KB a token): more than the socket buffers take on loopback, so that a request left unread
# stalls on its stream's credits and stays in flight however late the test acts (400 tokens of text fit, and
# this model writes them in half a second)
HELD = {**LONG, "n": 8, "stream": True, "logprobs": True, "top_logprobs": 20}


class HeldStream:
    """A streamed chat request read one event at a time: while unread it stays in flight (back-pressure)."""

    def __init__(self, server):
        self.client = httpx.Client(timeout=30)
        self.response = self.client.send(
            self.client.build_request("POST", server.base_url + "/v1/chat/completions", json=HELD), stream=True)
        self.lines = (line for line in self.response.iter_lines() if line.startswith("data: "))
        next(self.lines)  # the first chunk: the request runs

    def rest(self) -> str:
        try:
            return "\n".join(self.lines)
        finally:
            self.response.close()
            self.client.close()


def health(server) -> httpx.Response:
    return httpx.get(server.base_url + "/health", timeout=5)


def test_a_killed_worker_is_restarted_and_serves_again(served_model):
    with ServerProcess(served_model) as server:
        (worker,) = server.worker_pids()
        held = [HeldStream(server) for _ in range(2)]
        killed_at = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        for stream in held:  # in-flight requests end with an error event, not a hang
            rest = stream.rest()
            assert '"error"' in rest and "SIGKILL" in rest and rest.endswith("data: [DONE]")
        wait_until(lambda: health(server).status_code == 200, "the restarted worker to be healthy", 30)
        recovered_s = time.monotonic() - killed_at
        (new_worker,) = server.worker_pids()
        assert new_worker != worker
        assert chat(server, SHORT).status_code == 200
        metrics = server.metrics()
        assert metrics["edge_infer_engine_restarts_total"] == 1 and metrics["edge_infer_engine_up"] == 1
        assert "restarting it" in server.output()
        assert recovered_s < 30


def test_without_restarts_a_dead_worker_stops_the_server_with_a_nonzero_status(served_model):
    with ServerProcess(served_model, "--no-restart") as server:
        (worker,) = server.worker_pids()
        os.kill(worker, signal.SIGKILL)
        assert server.proc.wait(30) == 3
        assert "not restarting: restarts are off (--no-restart)" in server.output()


def test_a_stopped_worker_is_unhealthy_within_seconds_and_healthy_again_when_continued(served_model):
    with ServerProcess(served_model, "--heartbeat-timeout-s", "1.5") as server:
        (worker,) = server.worker_pids()
        waiting = HeldStream(server)
        os.kill(worker, signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            wait_until(lambda: health(server).status_code == 503, "/health to answer 503", 10)
            assert time.monotonic() - stopped_at < 5
            assert health(server).json()["status"] == "engine_unresponsive"
            rest = waiting.rest()  # the waiting request ends, with why
            assert '"error"' in rest and "stopped responding" in rest
            refused = chat(server, SHORT, timeout=10)  # a new one is refused at once, not left hanging
            assert refused.status_code == 503 and refused.headers["Retry-After"]
        finally:
            os.kill(worker, signal.SIGCONT)
        wait_until(lambda: health(server).status_code == 200, "/health to answer 200 again", 10)
        assert server.worker_pids() == [worker]  # the same worker, not a restart
        assert chat(server, SHORT).status_code == 200
