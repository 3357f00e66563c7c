"""The engine's fault behaviours (benchmarks/README.md, bench reliability), each checked against a live `LocalTextEngine`.

Order: the oversized plan (nothing loaded), start, a baseline request, a
saturated stream, a cancel mid-stream, a request after the cancel, a stale
session handle, a killed worker, a restart, then close and a search for
processes the engine left behind. Requests that must still be running when
they are cancelled or killed are given a small `max_chunks`, so back-pressure
holds them mid-stream however fast the model is.
"""
from __future__ import annotations

import asyncio
import copy
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from edge_infer.bench.harness.clock import TICK_S, since_boot_s, started_since_boot_s
from edge_infer.bench.measures.reliability_report import ReliabilityReport

# How often conditions are polled while waiting for them.
POLL_S = 0.02


@dataclass
class CheckSettings:
    max_tokens: int = 128
    max_chunks: int = 4
    saturation_timeout_s: float = 30.0
    kill_error_timeout_s: float = 5.0
    close_grace_s: float = 2.0
    prompt_tokens: int = 16


@dataclass
class OwnedProcess:
    """A process the engine started, identified so that no other process is ever signalled."""

    pid: int
    started_since_boot_s: float
    how: str


@dataclass
class Scenario:
    report: ReliabilityReport
    plan_kwargs: dict[str, Any]
    plan: Any  # the admitted TextPlan the engine is built from
    has_tokenizer: bool
    s: CheckSettings
    prompt: list[int] = field(default_factory=list)
    baseline_ids: list[int] | None = None
    engine: Any = None
    owned: list[OwnedProcess] = field(default_factory=list)
    engine_started_since_boot_s: float = 0.0

    # -- helpers -------------------------------------------------------------

    async def _drain(self, stream: Any, timeout_s: float) -> tuple[list[int], Any, list[str]]:
        """Read a stream to its end: (token ids, terminal event, kinds in order)."""
        ids: list[int] = []
        kinds: list[str] = []

        async def read() -> Any:
            async for event in stream:
                kinds.append(event.kind)
                if event.kind == "token":
                    ids.extend(event.token_ids)
                if event.terminal:
                    return event
            return None

        terminal = await asyncio.wait_for(read(), timeout_s)
        return ids, terminal, kinds

    async def _first_token(self, stream: Any, timeout_s: float) -> Any:
        event = await asyncio.wait_for(stream.get(), timeout_s)
        if event.kind != "token":
            raise RuntimeError(f"expected a token event first, got {event.kind} ({event.error or event.finish_reason})")
        return event

    def _remember_worker(self) -> None:
        pid = self.engine.worker_pid
        if pid is not None and pid != os.getpid():
            self.owned.append(OwnedProcess(pid, started_since_boot_s(pid), "engine worker_pid"))

    def _verify_owned(self, pid: int) -> dict[str, Any]:
        """Evidence that `pid` is this engine's worker: our child, started after the engine's start() began."""
        import psutil

        proc = psutil.Process(pid)
        started = started_since_boot_s(pid)
        evidence = {
            "pid": pid,
            "ppid": proc.ppid(),
            "harness_pid": os.getpid(),
            "started_since_boot_s": started,
            "engine_start_called_since_boot_s": round(self.engine_started_since_boot_s, 3),
            "cmdline": proc.cmdline()[:6],
        }
        is_child = proc.ppid() == os.getpid()
        created_after_start = started >= self.engine_started_since_boot_s - TICK_S
        if pid == os.getpid() or not is_child or not created_after_start:
            raise RuntimeError(f"refusing to kill pid {pid}: not verifiably this engine's worker ({evidence})")
        return evidence

    # -- checks ----------------------------------------------------------------

    async def oversized_plan(self) -> None:
        from edge_infer import plan_text_session
        from edge_infer.engine.local import LocalTextEngine
        from edge_infer.errors import PlanRefusedError

        async with self.report.outcome("oversized_plan_refused", "a plan with max_num_seqs=100000 is refused before loading, with its reasons") as o:
            plan = plan_text_session(**{**self.plan_kwargs, "max_num_seqs": 100000})
            o.evidence.update(admitted=plan.admitted, reasons=plan.reasons, levers=plan.levers)
            try:
                LocalTextEngine(plan)
                constructed = True
            except PlanRefusedError as exc:
                constructed = False
                o.evidence["engine_error"] = str(exc)
            o.check(not plan.admitted and not constructed, "the oversized plan was admitted or an engine was built from it")

    async def start(self) -> bool:
        from edge_infer.engine.local import LocalTextEngine

        async with self.report.outcome("engine_start", "the admitted plan loads and the engine reports ready") as o:
            self.engine = LocalTextEngine(self.plan, skip_tokenizer_init=not self.has_tokenizer)
            self.engine_started_since_boot_s = since_boot_s()
            ready = await self.engine.start()
            self._remember_worker()
            o.timings["start_s"] = round(since_boot_s() - self.engine_started_since_boot_s, 4)
            o.evidence.update(ready={k: v for k, v in vars(ready).items() if k != "extra"}, worker_pid=self.engine.worker_pid)
            o.check(self.engine.healthy, "the engine is not healthy after start()")
        return self.engine is not None and self.engine.healthy

    async def baseline(self) -> None:
        async with self.report.outcome("baseline", f"max_tokens={self.s.max_tokens}, ignore_eos: finishes without error with exactly that many tokens") as o:
            session = self.engine.open_session()
            rid, stream = await self.engine.submit(session, self.prompt, max_tokens=self.s.max_tokens, ignore_eos=True)
            ids, terminal, _ = await self._drain(stream, 120)
            record = self.engine.records[rid].to_dict()
            o.timings.update(ttft_s=record["ttft_s"], e2e_s=record["e2e_s"])
            o.evidence.update(output_tokens=len(ids), terminal=terminal.kind, finish_reason=terminal.finish_reason, error=record["error"])
            if o.check(terminal.kind == "finished" and record["error"] is None and len(ids) == self.s.max_tokens,
                       f"expected {self.s.max_tokens} tokens and a finished event, got {len(ids)} and {terminal.kind}"):
                self.baseline_ids = ids
            self.engine.close_session(session.session_id)

    async def saturation(self) -> None:
        n = self.s.max_chunks
        async with self.report.outcome("saturation", f"an unread stream buffers exactly max_chunks={n} events; after draining its tokens equal the baseline") as o:
            session = self.engine.open_session()
            t0 = time.perf_counter()
            rid, stream = await self.engine.submit(session, self.prompt, max_tokens=self.s.max_tokens, ignore_eos=True, max_chunks=n)
            while stream.stats()["high_water_chunks"] < n and time.perf_counter() - t0 < self.s.saturation_timeout_s:
                await asyncio.sleep(POLL_S)
            o.timings["time_to_high_water_s"] = round(time.perf_counter() - t0, 4)
            await asyncio.sleep(0.5)  # would the buffer grow beyond the bound if left alone?
            held = stream.stats()
            ids, terminal, _ = await self._drain(stream, 120)
            o.evidence.update(stats_while_unread=held, stats_after_drain=stream.stats(), output_tokens=len(ids), terminal=terminal.kind)
            o.check(
                held["high_water_chunks"] == n and ids == self.baseline_ids and terminal.kind == "finished",
                f"high_water_chunks={held['high_water_chunks']} (want {n}); tokens equal baseline: {ids == self.baseline_ids}",
            )
            self.engine.close_session(session.session_id)

    async def cancel(self) -> None:
        async with self.report.outcome("cancel_mid_stream", "after cancel() returns no token event is delivered and the stream ends with `cancelled`") as o:
            session = self.engine.open_session()
            rid, stream = await self.engine.submit(
                session, self.prompt, max_tokens=self.s.max_tokens, ignore_eos=True, max_chunks=self.s.max_chunks,
            )
            await self._first_token(stream, 60)
            await self._first_token(stream, 60)
            t0 = time.perf_counter()
            result = await self.engine.cancel(rid)
            o.timings["cancel_call_s"] = round(time.perf_counter() - t0, 4)
            o.timings["ack_s"] = result.get("ack_s")
            _, terminal, kinds = await self._drain(stream, 5)
            await asyncio.sleep(0.2)  # let stragglers from the core arrive, to count them
            late_tokens = kinds.count("token")
            o.evidence.update(cancel_result=result, events_after_cancel=kinds, record=self.engine.records[rid].to_dict())
            o.evidence["late_core_events"] = self.engine.records[rid].late_events
            o.check(
                result.get("cancelled") is True and late_tokens == 0 and terminal.kind == "cancelled",
                f"cancelled={result.get('cancelled')}, {late_tokens} token event(s) after cancel, terminal {terminal.kind}",
            )
            self.engine.close_session(session.session_id)

    async def after_cancel(self) -> None:
        async with self.report.outcome("request_after_cancel", "the next request after a cancel succeeds with the baseline's tokens") as o:
            session = self.engine.open_session()
            rid, stream = await self.engine.submit(session, self.prompt, max_tokens=self.s.max_tokens, ignore_eos=True)
            ids, terminal, _ = await self._drain(stream, 120)
            o.evidence.update(output_tokens=len(ids), terminal=terminal.kind, equals_baseline=ids == self.baseline_ids)
            o.check(terminal.kind == "finished" and ids == self.baseline_ids, f"terminal {terminal.kind}; tokens equal baseline: {ids == self.baseline_ids}")
            self.engine.close_session(session.session_id)

    async def stale_session(self) -> None:
        async with self.report.outcome("stale_session_rejected", "submit() with a closed session's handle (a deep copy of it) raises RuntimeError") as o:
            session = self.engine.open_session()
            stale = copy.deepcopy(session)
            self.engine.close_session(session.session_id)
            n_records = len(self.engine.records)
            try:
                await self.engine.submit(stale, self.prompt, max_tokens=4)
                raised = None
            except RuntimeError as exc:
                raised = exc
            o.evidence.update(
                error_type=None if raised is None else type(raised).__name__,
                message=None if raised is None else str(raised),
                request_created=len(self.engine.records) != n_records,
            )
            o.check(raised is not None and len(self.engine.records) == n_records, "the stale handle was accepted")

    async def worker_kill(self) -> None:
        limit = self.s.kill_error_timeout_s
        async with self.report.outcome("worker_kill", f"killing the engine's worker after the first token ends the stream with an explicit error within {limit:g} s; the engine reports unhealthy") as o:
            session = self.engine.open_session()
            rid, stream = await self.engine.submit(
                session, self.prompt, max_tokens=self.s.max_tokens, ignore_eos=True, max_chunks=self.s.max_chunks,
            )
            await self._first_token(stream, 60)
            pid = self.engine.worker_pid
            o.evidence["target"] = self._verify_owned(pid)
            t0 = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            try:
                _, terminal, kinds = await self._drain(stream, limit)
            except asyncio.TimeoutError:
                terminal, kinds = None, []
            elapsed = time.perf_counter() - t0
            o.timings["kill_to_terminal_s"] = round(elapsed, 4)
            o.evidence.update(
                terminal=None if terminal is None else terminal.to_dict(),
                events_after_kill=kinds,
                healthy_after=self.engine.healthy,
                explicit_error_reported=terminal is not None and terminal.kind == "error" and bool(terminal.error),
            )
            o.check(
                terminal is not None and terminal.kind == "error" and bool(terminal.error) and not self.engine.healthy,
                f"terminal {None if terminal is None else terminal.kind} after {elapsed:.2f} s; healthy={self.engine.healthy}",
            )

    async def restart(self) -> None:
        async with self.report.outcome("restart_after_kill", "restart() brings up a new worker and a request gets the baseline's tokens") as o:
            t0 = time.perf_counter()
            await self.engine.restart()
            self._remember_worker()  # the restarted worker is verified as a child started after the first start
            o.timings["restart_s"] = round(time.perf_counter() - t0, 4)
            session = self.engine.open_session()
            rid, stream = await self.engine.submit(session, self.prompt, max_tokens=self.s.max_tokens, ignore_eos=True)
            ids, terminal, _ = await self._drain(stream, 120)
            o.evidence.update(worker_pid=self.engine.worker_pid, healthy=self.engine.healthy, equals_baseline=ids == self.baseline_ids)
            o.check(self.engine.healthy and ids == self.baseline_ids, f"healthy={self.engine.healthy}; tokens equal baseline: {ids == self.baseline_ids}")

    async def close_and_sweep(self) -> None:
        async with self.report.outcome("clean_close", f"after close() and {self.s.close_grace_s:g} s no process the engine started is alive") as o:
            t0 = time.perf_counter()
            await self.engine.close()
            o.timings["close_s"] = round(time.perf_counter() - t0, 4)
            await asyncio.sleep(self.s.close_grace_s)
            leftovers = sweep_owned(self.owned, self.engine_started_since_boot_s)
            self.report.owned_processes_requiring_harness_cleanup.extend(leftovers)
            o.evidence["tracked_workers"] = [vars(p) for p in self.owned]
            o.check(not leftovers, f"{len(leftovers)} owned process(es) survived close() and were killed by the harness")

    # -- the whole run -----------------------------------------------------------

    async def run(self) -> None:
        await self.oversized_plan()
        if not await self.start():
            for name in ("baseline", "saturation", "cancel_mid_stream", "request_after_cancel",
                         "stale_session_rejected", "worker_kill", "restart_after_kill"):
                self.report.skip(name, "not run", "the engine did not start (see engine_start)")
        else:
            await self.baseline()
            if self.baseline_ids is None:
                for name in ("saturation", "request_after_cancel"):
                    self.report.skip(name, "not run", "no baseline tokens to compare with (see baseline)")
            else:
                await self.saturation()
            await self.cancel()
            if self.baseline_ids is not None:
                await self.after_cancel()
            await self.stale_session()
            await self.worker_kill()
            await self.restart()
        if self.engine is not None:
            await self.close_and_sweep()


def sweep_owned(tracked: list[OwnedProcess], engine_started_since_boot_s: float) -> list[dict[str, Any]]:
    """Kill and describe processes the engine started that are still alive.

    Candidates are this process's descendants started after the engine's
    start() began, and the workers recorded along the way (found again only
    if pid and start time both match, so a recycled pid is never touched).
    """
    import psutil

    found: dict[int, tuple[psutil.Process, str]] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if started_since_boot_s(child.pid) >= engine_started_since_boot_s - TICK_S:
                found[child.pid] = (child, "descendant of the harness")
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    for p in tracked:
        try:
            if started_since_boot_s(p.pid) == p.started_since_boot_s:
                found.setdefault(p.pid, (psutil.Process(p.pid), p.how))
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    out = []
    for pid, (proc, how) in found.items():
        try:
            info = {"pid": pid, "found_as": how, "cmdline": proc.cmdline()[:6], "status": proc.status()}
            if info["status"] == psutil.STATUS_ZOMBIE:
                continue  # already dead, only not yet reaped
            proc.kill()
            proc.wait(5)
            info["killed_by_harness"] = True
        except psutil.NoSuchProcess:
            continue
        out.append(info)
    return out
