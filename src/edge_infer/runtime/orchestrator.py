"""The orchestrator: routes payloads between stage processes on an asyncio loop.

Per request it opens the request on every stage, feeds the prompt to the
source stages, forwards each output along the routes whose contract it
carries, ends a stage's input once all its upstream stages finished, and
streams every final-output stage's chunks to the caller in arrival order.

Shared payloads: a forwarded payload is released to its producer only once
every consumer acknowledged it. When a worker dies, the payloads it held are
counted as acknowledged, the segments it produced are unlinked once their
consumers are done (the rest at once), and its in-flight requests end with an
error naming the stage. ``abort`` is a fence; ``retire_worker`` drains a
worker (no new requests, in-flight ones finish) and replaces or stops it.

All methods run on the loop's thread.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from edge_infer.engine.streams import RequestStream
from edge_infer.memory.ledger import LedgerRefusal, Reservation, SharedRamLedger
from edge_infer.runtime import messages as m
from edge_infer.runtime.config import DeployConfig, StageConfig
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.deploy_plan import DeployPlan, StagePlan
from edge_infer.runtime.executors import executor_target
from edge_infer.runtime.outputs import OmniOutput
from edge_infer.runtime.transport import (
    PayloadRef,
    TransportError,
    inline_ref,
    new_pipeline_prefix,
    receive,
    sweep_segments,
    sweep_stale_pipelines,
    unlink_segment,
    worker_prefix,
)
from edge_infer.runtime.worker import WorkerProcess, WorkerSpec


# A worker that sends nothing for this long (it beats every m.HEARTBEAT_INTERVAL_S) is unresponsive: stopped
# (SIGSTOP), wedged or starved. Its requests end with an error; it is running again when it speaks.
HEARTBEAT_TIMEOUT_S = 3.0
_WATCH_INTERVAL_S = 0.25


class StageStartError(RuntimeError):
    pass


@dataclass(frozen=True)
class StageHealth:
    stage_id: int
    label: str
    state: str  # running | unresponsive | dead | stopped
    pid: int | None
    inflight: int
    draining_pids: tuple[int, ...] = ()
    detail: str = ""
    silent_s: float = 0.0  # since its worker last spoke

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "draining_pids": list(self.draining_pids)}


@dataclass(frozen=True)
class PipelineHealth:
    stages: tuple[StageHealth, ...]

    @property
    def healthy(self) -> bool:
        return all(s.state == "running" for s in self.stages)

    @property
    def dead_stages(self) -> list[int]:
        return [s.stage_id for s in self.stages if s.state == "dead"]

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "stages": [s.to_dict() for s in self.stages]}


@dataclass(frozen=True)
class AbortReport:
    request_id: str
    found: bool
    confirmed_stages: tuple[int, ...] = ()  # stages that stopped work on it
    unconfirmed_stages: tuple[int, ...] = ()  # dead, or no answer within abort_timeout_s


@dataclass(frozen=True)
class RetirementReport:
    stage_id: int
    old_pid: int | None
    new_pid: int | None
    drained_requests: int  # in flight on the old worker when it was retired; all finished there


@dataclass
class _Delivery:
    ref: PayloadRef
    producer: WorkerProcess
    waiting: set[m.WorkerKey]


@dataclass
class _Request:
    request_id: str
    stream: RequestStream[OmniOutput]
    workers: dict[int, WorkerProcess]
    waiting_upstream: dict[int, int]
    done: set[int] = field(default_factory=set)
    metrics: dict[int, m.StageMetrics] = field(default_factory=dict)


@dataclass
class _Slot:
    stage: StageConfig
    plan: StagePlan
    active: WorkerProcess | None = None
    draining: list[WorkerProcess] = field(default_factory=list)
    generation: int = 0
    state: str = "starting"
    detail: str = ""


class Orchestrator:
    def __init__(self, config: DeployConfig, plan: DeployPlan):
        self.config = config
        self.plan = plan
        self.prefix = new_pipeline_prefix()
        self.slots = {s.stage_id: _Slot(s, plan.stage(s.stage_id)) for s in config.stages}
        self.requests: dict[str, _Request] = {}
        self.deliveries: dict[tuple[m.WorkerKey, int], _Delivery] = {}
        self.ledger = SharedRamLedger(plan.profile.pools)
        self.final = set(config.final_outputs)
        self.sources = config.source_stages
        self.closed = False
        self.swept_stale: list[str] = []
        self._background: set[asyncio.Future[None]] = set()
        self._watchdog: asyncio.Task | None = None

    # --- workers -------------------------------------------------------------

    def _reservation(self, slot: _Slot, generation: int) -> Reservation:
        return dataclasses.replace(slot.plan.reservation, owner=f"{slot.plan.reservation.owner} worker {generation}")

    def _spawn(self, slot: _Slot) -> WorkerProcess:
        generation = slot.generation
        slot.generation += 1
        shm = self.config.connectors.shared_memory
        spec = WorkerSpec(
            stage=slot.stage,
            executor_target=executor_target(slot.stage.executor),
            key=(slot.stage.stage_id, generation),
            segment_prefix=worker_prefix(self.prefix, slot.stage.stage_id, generation),
            inline_threshold_bytes=shm.inline_threshold_bytes,
            max_unacked=shm.max_unacked_per_producer,
            max_payload_bytes=slot.plan.max_payload_bytes,
        )
        worker = WorkerProcess(spec, self._on_message, self._on_exit)
        worker.start()
        return worker

    async def _await_ready(self, workers: list[WorkerProcess]) -> None:
        timeout = self.config.pipeline.stage_start_timeout_s
        try:
            await asyncio.wait_for(asyncio.gather(*(w.ready for w in workers)), timeout)
        except asyncio.TimeoutError:
            slow = [w.label for w in workers if not w.ready.done()]
            raise StageStartError(f"{', '.join(slow)} not ready within stage_start_timeout_s={timeout:g}; raise it in pipeline: or check the stage") from None

    async def start(self) -> None:
        self.swept_stale = sweep_stale_pipelines()
        for other in ([self.plan.server] if self.plan.server else []) + self.plan.beside:
            self.ledger.record(other)  # a worker replaced while its old one drains must fit beside these too
        for slot in self.slots.values():
            self.ledger.record(self._reservation(slot, 0))
        for slot in self.slots.values():
            slot.active = self._spawn(slot)  # all stages start side by side
        try:
            await self._await_ready([slot.active for slot in self.slots.values() if slot.active])
        except BaseException:
            await self.shutdown()
            raise
        for slot in self.slots.values():
            slot.state = "running"
        self._watchdog = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        """Mark a stage unresponsive while its worker is silent, ending the requests in it, and running again when
        it speaks (a stopped process continued)."""
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            now = time.monotonic()
            for slot in self.slots.values():
                worker = slot.active
                if worker is None or not worker.alive or slot.state not in ("running", "unresponsive"):
                    continue
                silent = now - worker.last_heard
                if silent > HEARTBEAT_TIMEOUT_S and slot.state == "running":
                    slot.state = "unresponsive"
                    slot.detail = f"{worker.label}: worker pid {worker.pid} stopped responding: no heartbeat for {silent:.1f} s"
                    for request_id in sorted(worker.inflight):
                        self._fail(request_id, f"{slot.detail} while this request was in it")
                elif silent <= HEARTBEAT_TIMEOUT_S and slot.state == "unresponsive":
                    slot.state, slot.detail = "running", ""

    def _on_message(self, worker: WorkerProcess, msg: Any) -> None:
        if isinstance(msg, m.Output):
            self._on_output(worker, msg)
        elif isinstance(msg, m.Acked):
            for producer, seq in msg.refs:
                self._acknowledge(producer, seq, worker)
        elif isinstance(msg, m.RequestFailed):
            req = self.requests.get(msg.request_id)
            if req is not None and req.workers.get(worker.stage_id) is worker:
                req.metrics[worker.stage_id] = msg.metrics
                self._fail(msg.request_id, msg.error)
        elif isinstance(msg, m.AbortDone):
            waiter = worker.abort_waiters.pop(msg.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(True)
        elif isinstance(msg, m.Ready):
            if not worker.ready.done():
                worker.ready.set_result(None)
        elif isinstance(msg, m.StartFailed):
            worker.fatal_error = msg.error
            if not worker.ready.done():
                worker.ready.set_exception(StageStartError(msg.error))
        elif isinstance(msg, m.Fatal):
            worker.fatal_error = msg.error

    def _on_exit(self, worker: WorkerProcess) -> None:
        worker.alive = False
        worker.close()
        self.ledger.release(self._reservation(self.slots[worker.stage_id], worker.key[1]).owner)
        detail = f"{worker.label}: worker pid {worker.pid} {worker.exit_description()}"
        if not worker.ready.done():
            worker.ready.set_exception(StageStartError(f"{detail} before it was ready"))
        slot = self.slots[worker.stage_id]
        if not worker.stopping:
            if slot.active is worker:
                slot.active, slot.state, slot.detail = None, "dead", detail
            for request_id in sorted(worker.inflight):
                self._fail(request_id, f"{detail} while this request was in it")
        if worker in slot.draining:
            slot.draining.remove(worker)
        for producer, seq in list(worker.holding):
            self._acknowledge(producer, seq, worker)
        # Segments it produced that consumers still read are unlinked on their last ack.
        keep = {d.ref.segment for d in self.deliveries.values() if d.producer is worker and d.ref.segment}
        sweep_segments(worker.spec.segment_prefix, keep)
        for waiter in worker.abort_waiters.values():
            if not waiter.done():
                waiter.set_result(False)
        for fut in (worker.exited, worker.drained):
            if fut is not None and not fut.done():
                fut.set_result(None)

    # --- requests ------------------------------------------------------------

    def submit(self, request_id: str, prompt: Payload, params: dict[int, dict[str, Any]]) -> RequestStream[OmniOutput]:
        if self.closed:
            raise RuntimeError("the pipeline is shut down; create a new one")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight; use a unique id")
        stream: RequestStream[OmniOutput] = RequestStream(request_id)
        down = [s for s in self.slots.values() if s.active is None or s.state == "unresponsive"]
        if down:
            reasons = "; ".join(f"{s.stage.label} is {s.state} ({s.detail})" for s in down)
            stream.push(OmniOutput(request_id, "error", finished=True, error=f"{reasons}; replace the worker with retire_worker({down[0].stage.stage_id}) or restart the pipeline"))
            return stream
        workers = {sid: slot.active for sid, slot in self.slots.items()}
        req = _Request(request_id, stream, workers, {sid: len(self.config.upstream(sid)) for sid in workers})  # type: ignore[arg-type]
        self.requests[request_id] = req
        for sid, worker in workers.items():
            worker.inflight.add(request_id)
            worker.send(m.Open(request_id, params.get(sid, {})))
        now = time.monotonic()
        for sid in self.sources:
            workers[sid].send(m.Input(request_id, inline_ref(prompt), None, now))
            workers[sid].send(m.EndInput(request_id))
        return stream

    def _on_output(self, worker: WorkerProcess, msg: m.Output) -> None:
        req = self.requests.get(msg.request_id)
        ref, sid = msg.ref, worker.stage_id
        if req is None or req.workers.get(sid) is not worker:
            if ref is not None:
                worker.send(m.Release([ref.seq]))  # aborted or failed: nobody wants it
            return
        req.metrics[sid] = msg.metrics
        if ref is not None:
            if sid in self.final:
                try:
                    payload = receive(ref)
                except TransportError as exc:
                    worker.send(m.Release([ref.seq]))
                    self._fail(req.request_id, f"{worker.label}: {exc}")
                    return
                req.stream.push(OmniOutput(req.request_id, "output", sid, payload, msg.finished, dict(req.metrics)))
            self._forward(req, worker, ref)
        elif msg.finished and sid in self.final:
            req.stream.push(OmniOutput(req.request_id, "output", sid, None, True, dict(req.metrics)))
        if msg.finished:
            self._stage_finished(req, worker)

    def _forward(self, req: _Request, producer: WorkerProcess, ref: PayloadRef) -> None:
        routes = self.config.routes_from(producer.stage_id)
        consumers = [req.workers[r.to_stage] for r in routes if r.contract == ref.contract and req.workers[r.to_stage].alive]
        if not consumers:
            producer.send(m.Release([ref.seq]))
            return
        self.deliveries[(producer.key, ref.seq)] = _Delivery(ref, producer, {c.key for c in consumers})
        producer.unreleased += 1
        now = time.monotonic()
        for consumer in consumers:
            consumer.holding.add((producer.key, ref.seq))
            consumer.send(m.Input(req.request_id, ref, producer.key, now))

    def _stage_finished(self, req: _Request, worker: WorkerProcess) -> None:
        sid = worker.stage_id
        req.done.add(sid)
        worker.inflight.discard(req.request_id)
        for nxt in self.config.downstream(sid):
            req.waiting_upstream[nxt] -= 1
            if req.waiting_upstream[nxt] == 0:
                req.workers[nxt].send(m.EndInput(req.request_id))
        if len(req.done) == len(self.slots):
            del self.requests[req.request_id]
            req.stream.push(OmniOutput(req.request_id, "finished", finished=True, metrics=dict(req.metrics)))
        self._check_drained(worker)

    def _acknowledge(self, producer_key: m.WorkerKey, seq: int, consumer: WorkerProcess) -> None:
        consumer.holding.discard((producer_key, seq))
        delivery = self.deliveries.get((producer_key, seq))
        if delivery is None:
            return
        delivery.waiting.discard(consumer.key)
        if delivery.waiting:
            return
        del self.deliveries[(producer_key, seq)]
        producer = delivery.producer
        producer.unreleased -= 1
        if producer.alive:
            producer.send(m.Release([seq]))
        elif delivery.ref.segment:
            unlink_segment(delivery.ref.segment)  # its producer is gone: the orchestrator releases it
        self._check_drained(producer)

    def _fail(self, request_id: str, error: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        req.stream.push(OmniOutput(request_id, "error", finished=True, metrics=dict(req.metrics), error=error))
        for worker in req.workers.values():
            if request_id in worker.inflight:
                worker.inflight.discard(request_id)
                worker.send(m.Abort(request_id))
                self._check_drained(worker)

    async def abort(self, request_id: str) -> AbortReport:
        """Stop a request everywhere. When this returns, its stream holds only the aborted event."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return AbortReport(request_id, found=False)
        req.stream.cancel(OmniOutput(request_id, "aborted", finished=True, metrics=dict(req.metrics)))
        loop = asyncio.get_running_loop()
        waiting: dict[int, asyncio.Future[bool]] = {}
        for sid, worker in req.workers.items():
            if request_id not in worker.inflight:
                continue  # this stage already finished it
            worker.inflight.discard(request_id)
            if worker.alive:
                waiting[sid] = worker.abort_waiters[request_id] = loop.create_future()
                worker.send(m.Abort(request_id))
            self._check_drained(worker)
        if waiting:
            await asyncio.wait(waiting.values(), timeout=self.config.pipeline.abort_timeout_s)
        confirmed = tuple(sorted(sid for sid, f in waiting.items() if f.done() and f.result()))
        return AbortReport(request_id, True, confirmed, tuple(sorted(set(waiting) - set(confirmed))))

    # --- retirement ----------------------------------------------------------

    def _check_drained(self, worker: WorkerProcess) -> None:
        if worker.drained is not None and not worker.drained.done() and not worker.inflight and worker.unreleased == 0:
            worker.drained.set_result(None)

    async def retire_worker(self, stage_id: int, replace: bool = True, drain_timeout_s: float | None = None) -> RetirementReport:
        """Drain a stage's worker and replace it with a new process (or stop the stage).

        New requests go to the replacement as soon as it is ready (with
        ``replace=False`` they are refused); requests already on the old worker
        finish there, then it exits. Replacing a dead worker restarts the stage.
        """
        if stage_id not in self.slots:
            raise KeyError(f"no stage {stage_id}; stages: {sorted(self.slots)}")
        slot = self.slots[stage_id]
        old, new = slot.active, None
        if replace:
            reservation = self._reservation(slot, slot.generation)
            try:
                self.ledger.reserve(reservation)  # old and new coexist while the old one drains
            except LedgerRefusal as exc:
                raise RuntimeError(f"cannot replace {slot.stage.label} while its worker drains: {exc}; retire it with replace=False first") from None
            new = self._spawn(slot)
            try:
                await self._await_ready([new])
            except BaseException:
                new.stopping = True
                new.kill()
                raise
            slot.active, slot.state, slot.detail = new, "running", ""
        else:
            slot.active, slot.state, slot.detail = None, "stopped", f"{slot.stage.label} was retired"
        drained = 0
        if old is not None:
            drained = len(old.inflight)
            slot.draining.append(old)
            old.drained = asyncio.get_running_loop().create_future()
            self._check_drained(old)
            try:
                await asyncio.wait_for(asyncio.shield(old.drained), drain_timeout_s)
            except asyncio.TimeoutError:
                task = asyncio.ensure_future(self._stop_when_drained(old))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                raise TimeoutError(
                    f"{slot.stage.label}: the old worker (pid {old.pid}) still has {len(old.inflight)} requests "
                    f"after drain_timeout_s={drain_timeout_s:g}; it keeps draining and stops when they finish "
                    "(abort them to stop it sooner)"
                ) from None
            await self._stop(old)
        return RetirementReport(stage_id, old.pid if old else None, new.pid if new else None, drained)

    async def _stop_when_drained(self, worker: WorkerProcess) -> None:
        await asyncio.shield(worker.drained)
        await self._stop(worker)

    async def _stop(self, worker: WorkerProcess) -> None:
        if worker.alive:
            worker.stopping = True
            worker.send(m.Shutdown())
        try:
            await asyncio.wait_for(asyncio.shield(worker.exited), self.config.pipeline.shutdown_timeout_s)
        except asyncio.TimeoutError:
            worker.kill()
            await asyncio.shield(worker.exited)

    # --- state and shutdown -------------------------------------------------

    def health(self) -> PipelineHealth:
        stages = []
        now = time.monotonic()
        for sid, slot in self.slots.items():
            active = slot.active
            stages.append(StageHealth(
                sid, slot.stage.label, slot.state, active.pid if active else None,
                len(active.inflight) if active else 0,
                tuple(w.pid for w in slot.draining if w.pid is not None), slot.detail,
                now - active.last_heard if active else 0.0,
            ))
        return PipelineHealth(tuple(stages))

    def workers(self) -> list[WorkerProcess]:
        out = []
        for slot in self.slots.values():
            out.extend([slot.active] if slot.active else [])
            out.extend(slot.draining)
        return out

    async def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        for request_id in list(self.requests):
            self._fail(request_id, "the pipeline shut down before this request finished")
        workers = [w for slot in self.slots.values() for w in ([slot.active] if slot.active else []) + slot.draining]
        await asyncio.gather(*(self._stop(w) for w in workers if w.exited is not None), return_exceptions=True)
        for slot in self.slots.values():
            slot.active, slot.state = None, "stopped"
        sweep_segments(self.prefix)
