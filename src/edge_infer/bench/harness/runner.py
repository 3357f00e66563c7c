"""Run one pass of one arm, pinned to the target cores, and read its metrics.

The arm runs in its own process group so that a timeout kills everything it
started (an engine's worker processes included), and so that processes it
leaves behind can be found and stopped before the next arm runs on the same
cores. Whatever happens, the outcome is an `Observation`: a crash, a timeout
or unusable output is recorded with its error, never dropped.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from edge_infer.bench.harness.provenance import now_utc
from edge_infer.bench.harness.results import Arm, Observation

STDERR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class PassContext:
    pass_index: int
    position: int
    under_load: bool


def last_json_object(stdout: str) -> dict | None:
    """The last line that starts with '{', parsed; ValueError if it is not a JSON object."""
    lines = [line.strip() for line in stdout.splitlines() if line.lstrip().startswith("{")]
    if not lines:
        return None
    obj = json.loads(lines[-1])
    if not isinstance(obj, dict):
        raise ValueError("the last line starting with '{' is not a JSON object")
    return obj


def numeric_metrics(obj: dict) -> dict[str, float]:
    """Top-level finite numbers; booleans are settings, not measurements."""
    return {
        k: float(v)
        for k, v in obj.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def _kill_group(pgid: int) -> bool:
    """SIGKILL a process group; True if anything was still in it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_arm(
    arm: Arm,
    ctx: PassContext,
    cores: list[int],
    timeout_s: float,
    required: list[str],
    keys: list[str] | None,
) -> Observation:
    env = {**os.environ, **arm.env, "EDGE_INFER_BENCH_ARM": arm.tag, "EDGE_INFER_BENCH_PASS": str(ctx.pass_index)}
    record = dict(arm=arm.tag, pass_index=ctx.pass_index, position=ctx.position, under_load=ctx.under_load)
    started_at, t0 = now_utc(), time.monotonic()
    try:
        proc = subprocess.Popen(
            arm.command,
            shell=isinstance(arm.command, str),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )
    except OSError as exc:
        return Observation(
            **record, status="error", exit_code=None, started_at=started_at, wall_s=0.0,
            error=f"could not start {arm.command!r}: {exc.strerror or exc}",
        )

    notes: list[str] = []
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        timed_out = True
    wall_s = time.monotonic() - t0
    if not timed_out and _kill_group(proc.pid):
        notes.append("the arm left processes running in its process group; they were killed")

    base = dict(**record, started_at=started_at, wall_s=round(wall_s, 3), stderr_tail=stderr[-STDERR_TAIL_CHARS:], notes=notes)
    if timed_out:
        return Observation(
            **base, status="timeout", exit_code=None,
            error=f"timed out after {timeout_s:g} s; its process group was killed (raise --timeout if the arm needs longer)",
        )
    try:
        output = last_json_object(stdout)
    except ValueError as exc:
        output, parse_error = None, f"the last JSON line of stdout could not be parsed: {exc}"
    else:
        parse_error = None
    if proc.returncode != 0:
        return Observation(**base, status="failed", exit_code=proc.returncode, output=output, error=_describe_exit(proc.returncode))
    if parse_error or output is None:
        tail = stdout.strip().splitlines()[-1:] or ["<no output>"]
        return Observation(
            **base, status="error", exit_code=0,
            error=parse_error or f"no JSON object line in stdout (last line: {tail[0][:200]!r}); the arm must print its metrics as one JSON line",
        )
    metrics = numeric_metrics(output)
    missing = [k for k in required if k not in metrics]
    if missing:
        return Observation(
            **base, status="error", exit_code=0, output=output,
            error=f"metric(s) {', '.join(missing)} missing from the arm's JSON (numeric keys: {', '.join(metrics) or 'none'})",
        )
    if keys:
        metrics = {k: v for k, v in metrics.items() if k in keys}
    return Observation(**base, status="ok", exit_code=0, output=output, metrics=metrics)
