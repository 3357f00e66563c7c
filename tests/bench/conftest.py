"""Helpers for the bench tests: tiny arms (python -c one-liners) and a grid runner."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import pytest

from edge_infer.bench.harness.results import GridResult, load_result
from edge_infer.cli import main

# Fast settings for tests that are not about the load check: short windows,
# and thresholds at 100% so other work on a shared test machine never
# refuses or labels a run (the preflight tests use real thresholds).


@pytest.fixture
def core() -> int:
    """A core the tests may pin arms to: one this process may run on (make test gives each worker its own), not core
    0; read when the test runs, after tests/conftest.py has pinned the worker (this file may be imported before)."""
    return min(os.sched_getaffinity(0))

FAST = ["--settle-s", "0", "--preflight-window-s", "0.05", "--max-stolen-pct", "100", "--max-core-busy-pct", "100"]


def metrics_arm(tag: str, per_pass: dict[str, list[float]], env: dict[str, str] | None = None) -> dict:
    """An arm that prints per_pass[metric][pass - 1] for each metric, after some log noise."""
    code = (
        "import json, os; p = int(os.environ['EDGE_INFER_BENCH_PASS']); "
        f"v = {per_pass!r}; print('loading...'); "
        "print(json.dumps({k: xs[(p - 1) % len(xs)] for k, xs in v.items()}))"
    )
    return {"tag": tag, "command": [sys.executable, "-c", code], "env": env or {}}


def code_arm(tag: str, code: str, env: dict[str, str] | None = None) -> dict:
    return {"tag": tag, "command": [sys.executable, "-c", code], "env": env or {}}


@pytest.fixture(autouse=True)
def private_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own host lock file, so tests never contend with real benchmarks."""
    path = tmp_path / "bench.lock"
    monkeypatch.setenv("EDGE_INFER_BENCH_LOCK", str(path))
    return path


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    def write(arms: list[dict], **extra: object) -> Path:
        path = tmp_path / "spec.json"
        path.write_text(json.dumps({"arms": arms, **extra}))
        return path

    return write


@pytest.fixture
def grid(tmp_path: Path) -> Callable[..., tuple[int, GridResult | None]]:
    """Run `edge-infer bench grid` in-process; returns (exit code, result or None)."""

    def run(spec: Path, *args: str, fast: bool = True) -> tuple[int, GridResult | None]:
        out = tmp_path / "result.json"
        out.unlink(missing_ok=True)
        rc = main(["bench", "grid", "--spec", str(spec), *(FAST if fast else []), *args, "--out", str(out)])
        return rc, load_result(out) if out.exists() else None

    return run
