"""An ``edge-infer serve`` process for the suite to play against, and what it measured.

The suite can run against any OpenAI-compatible server; started here, the
server is ours, so its banner says what was loaded (dtype, weight bytes:
the build really is the one asked for) and its ``/metrics`` give decode and
prefill rates as the engine saw them during the episodes.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from edge_infer.agent.chat import ChatError

READY_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServedModel:
    """``with ServedModel(lambda port: [...serve command...]) as server:`` -> ``server.base_url``."""

    def __init__(self, command_for_port, ready_timeout_s: float = READY_TIMEOUT_S):
        self.port = free_port()
        self.command = command_for_port(self.port)
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = self.root + "/v1"
        self.ready_timeout_s = ready_timeout_s
        self._log = tempfile.NamedTemporaryFile("w+", prefix="edge-infer-agent-serve-", suffix=".log")
        self.proc: subprocess.Popen | None = None
        self.banner = ""

    def __enter__(self) -> "ServedModel":
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                output = self.output()
                self.__exit__(None, None, None)
                raise ChatError(f"the server ({' '.join(self.command)}) did not come up:\n{output[-2000:]}")
            time.sleep(0.2)
        while "edge-infer is serving" not in self.output() and time.monotonic() < deadline:
            time.sleep(0.05)  # the banner is printed just after /health turns ready
        self.banner = next((line for line in self.output().splitlines() if line.startswith("loaded ")), "")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def output(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.root + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def rates(self) -> dict[str, float]:
        """Decode and prefill tokens per second over everything served so far (from /metrics)."""
        return server_rates(self.root)


def server_rates(root: str) -> dict[str, float]:
    """``decode_tps`` and ``prefill_tps`` from an edge-infer server's /metrics; empty for other servers."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(root + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}
    out = {}
    itl, firsts = samples.get("edge_infer_inter_token_latency_seconds_sum"), samples.get("edge_infer_time_to_first_token_seconds_count")
    generated, ttft = samples.get("edge_infer_generation_tokens_total"), samples.get("edge_infer_time_to_first_token_seconds_sum")
    if itl and generated is not None and firsts is not None:
        out["decode_tps"] = round((generated - firsts) / itl, 2)  # the tokens after each first, over the gaps between them
    prompt = samples.get("edge_infer_prompt_tokens_total")
    if ttft and prompt is not None:
        out["prefill_tps"] = round(prompt / ttft, 1)  # TTFT includes queueing: with one client there is none
    return out
