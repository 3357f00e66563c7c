"""A real ``edge-infer serve`` process on a free loopback port, for end-to-end tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import edge_infer

READY_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def scrape(base_url: str) -> dict[str, float]:
    """Samples of /metrics by name (labels folded into the name as name{k=v,...})."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=10).text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


class ServerProcess:
    def __init__(self, model: Path | None, *args: str, api_key: str | None = None):
        """``model`` None: no model named, as `make run` serves (the embedded default)."""
        self.port = free_port()
        self.api_key = api_key
        named = [str(model)] if model is not None else []
        self.cmd = [sys.executable, "-m", "edge_infer.cli", "serve", *named, "--port", str(self.port), "--dtype", "float32",
                    # one compute thread: a tiny model on a shared machine is many times faster without thread contention
                    "--num-threads", "1", *args]
        if api_key:
            self.cmd += ["--api-key", api_key]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="edge-infer-serve-", suffix=".log")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        env = dict(os.environ)
        src = str(Path(edge_infer.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
        # Its own process group, as under a service manager: the server, its worker and nothing else.
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def output(self) -> str:
        self._log.flush()
        return Path(self._log.name).read_text()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not ready within {timeout_s} s:\n{self.output()}")

    def client(self, **kwargs):
        import openai

        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.OpenAI(base_url=self.base_url + "/v1", max_retries=0, timeout=120, **kwargs)

    def async_client(self, **kwargs):
        import openai

        kwargs.setdefault("api_key", self.api_key or "unused")
        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", max_retries=0, timeout=120, **kwargs)

    def metrics(self) -> dict[str, float]:
        return scrape(self.base_url)

    def worker_pids(self) -> list[int]:
        import psutil

        return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
