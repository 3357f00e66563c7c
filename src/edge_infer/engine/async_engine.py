"""``AsyncEngine``: the asyncio frontend shared by LocalTextEngine and the server.

A reader thread waits on the core's output pipe and on the worker's pidfd and
hands messages to the event loop. Each request has a ``RequestStream`` (what
the consumer reads), a ``RequestFold`` (the request's output: text, stop strings, logprobs) and
a ``RequestRecord`` (what happened, kept after the end for inspection).

If the worker dies, every unfinished stream ends with an ``error`` event at
once, the engine reports itself unhealthy, and ``restart()`` starts a new
worker. If it stops responding (no message, heartbeats included, for
``heartbeat_timeout_s``; or one step running past ``step_timeout_s``), the
same happens to its streams and the engine is unhealthy until it speaks
again (a stopped process that is continued) or is restarted.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from edge_infer.engine.frontend import Frontend, PreparedPrompt
from edge_infer.engine.media_gate import MediaGate, MediaSlot, MediaSlots
from edge_infer.engine.protocol import (
    AbortRequests, AddRequest, CoreStats, Deltas, GrantCredits, ReadyInfo, Report, Stats, StatsQuery, TokenDelta,
)
from edge_infer.engine.request_fold import RequestFold
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.engine.streams import RequestStream, StreamEvent
from edge_infer.engine.worker import CoreClient
from edge_infer.errors import EngineDeadError, InvalidRequestError

log = logging.getLogger(__name__)

# How long cancel() waits for the core to confirm that a request's blocks are free.
ABORT_ACK_TIMEOUT_S = 5.0
# A worker that says nothing for this long is unresponsive (it sends a heartbeat every 0.5 s).
HEARTBEAT_TIMEOUT_S = 3.0
# One step running longer than this is treated as wedged (a 512-token prefill of a 3B model on a slow CPU
# takes well under a minute).
STEP_TIMEOUT_S = 300.0
_WATCH_INTERVAL_S = 0.25


@dataclass
class RequestRecord:
    request_id: str
    session_id: str | None
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    cancelled: bool = False
    num_preemptions: int = 0
    encode_s: float = 0.0  # seconds the core spent encoding its media
    late_events: int = 0  # core deltas that arrived after the request was cancelled
    submitted_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def output_tokens(self) -> int:
        return len(self.output_token_ids)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["output_tokens"] = self.output_tokens
        d["prompt_tokens"] = len(self.prompt_token_ids)
        d["ttft_s"] = None if self.first_token_at is None else self.first_token_at - self.submitted_at
        d["e2e_s"] = None if self.finished_at is None else self.finished_at - self.submitted_at
        return d


@dataclass
class _Active:
    # Weak: a stream its consumer dropped (a loop broken off, a task cancelled) is collected, and its request
    # cancelled (AsyncEngine._cancel_when_dropped); held strongly here, it kept generating, or held its slot, for nobody.
    stream_ref: weakref.ref[RequestStream]
    fold: RequestFold
    record: RequestRecord
    uses_credits: bool
    media_slot: MediaSlot | None = None  # given back when the request ends
    abort_ack: asyncio.Future | None = None

    @property
    def stream_ended(self) -> bool:
        stream = self.stream_ref()
        return stream is None or stream.ended


class AsyncEngine:
    def __init__(self, frontend: Frontend, worker: str = "process", max_records: int = 10000,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, step_timeout_s: float = STEP_TIMEOUT_S):
        self.frontend = frontend
        self.worker_mode = worker
        self.max_records = max_records
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.step_timeout_s = step_timeout_s
        self.hung_reason: str | None = None
        self._watchdog: asyncio.Task | None = None
        self.records: OrderedDict[str, RequestRecord] = OrderedDict()
        self.core_stats = CoreStats()
        self.ready_info: ReadyInfo | None = None
        self.dead_reason: str | None = None
        self._active: dict[str, _Active] = {}
        # Requests with media acquire room here before their media are decoded (engine/media_gate.py).
        self.media_gate = MediaGate(frontend.engine_config.max_num_seqs)
        self._client: CoreClient | None = None
        self._stops_worker: weakref.finalize | None = None
        self._reader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._closing = False
        self.on_event: Callable[[str, StreamEvent], None] | None = None  # metrics hook

    # -- life cycle ----------------------------------------------------------

    async def start(self, progress: Callable[[int, int], None] | None = None) -> ReadyInfo:
        self._loop = asyncio.get_running_loop()
        self._closing = False
        client = CoreClient(self.frontend.engine_config, mode=self.worker_mode)
        self.ready_info = await self._loop.run_in_executor(None, client.start, progress)
        self._client = client
        # The reader thread and the watchdog hold the engine weakly: one dropped unclosed is collected, and this
        # stops its worker (it kept running, weights and all, until the program ended).
        self._stops_worker = weakref.finalize(self, _close_aside, client)
        self._stops_worker.atexit = False  # at exit the worker goes with its parent, as it always did
        self.dead_reason = self.hung_reason = None
        ref = weakref.ref(self)
        self._reader = threading.Thread(target=_read_loop, args=(ref, client), name="edge-infer-reader", daemon=True)
        self._reader.start()
        self._watchdog = asyncio.ensure_future(_watch(ref, client))
        return self.ready_info

    @property
    def healthy(self) -> bool:
        return self._client is not None and self.down_reason is None and self._client.alive

    @property
    def down_reason(self) -> str | None:
        """Why the engine cannot serve: its worker died or stopped responding; None when it can."""
        return self.dead_reason or self.hung_reason

    @property
    def worker_pid(self) -> int | None:
        return self._client.pid if self._client is not None else None

    async def close(self) -> None:
        for rid in list(self._active):
            self.cancel_nowait(rid)
            self._drop(rid)  # no ack will be read: the reader stops now
        self.media_gate.close("the engine is closed")
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        client, self._client = self._client, None
        if client is not None:
            self._stops_worker.detach()
            await asyncio.get_running_loop().run_in_executor(None, client.close)
        if self._reader is not None:
            self._reader.join(2)

    async def restart(self, progress: Callable[[int, int], None] | None = None) -> ReadyInfo:
        """Replace the worker (dead or alive); unfinished requests end with an error."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._client is not None:
            self._fail_all("the engine is restarting")
            client, self._client = self._client, None
            self._stops_worker.detach()
            await asyncio.get_running_loop().run_in_executor(None, client.close, 1.0)
        return await self.start(progress)

    def silent_s(self) -> float:
        """Seconds since the worker last said anything (0 without a worker)."""
        return self._client.silent_s() if self._client is not None else 0.0

    def kill_worker(self) -> None:
        """SIGKILL the worker (a wedged one); the reader then reports it dead."""
        if self._client is not None:
            self._client.kill()

    # -- requests ------------------------------------------------------------

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(
        self,
        prompt: PreparedPrompt,
        params: SamplingParams,
        request_id: str | None = None,
        max_chunks: int | None = None,
        session_id: str | None = None,
        media_slots: MediaSlots | None = None,
    ) -> RequestStream:
        """Start one engine request. A prompt with media takes one of ``media_slots`` (from
        ``media_gate.acquire``, awaited before the media were decoded); it is given back when the request ends."""
        if prompt.media and media_slots is None:
            raise ValueError("a prompt with media needs a slot: acquire media_gate slots before decoding its media")
        if not self.healthy:
            raise EngineDeadError(f"{self.down_reason or 'the engine is not running'}; call restart()")
        if max_chunks is not None and max_chunks < 1:
            raise InvalidRequestError(f"max_chunks must be at least 1, got {max_chunks}")
        rid = request_id or self.new_request_id()
        if rid in self._active:
            raise InvalidRequestError(f"request id {rid!r} is already in use")
        request = self.frontend.request(rid, prompt, params, credits=max_chunks)
        stream = RequestStream(rid, max_chunks, lambda n, rid=rid: self._grant(rid, n))
        record = RequestRecord(rid, session_id, list(request.prompt_token_ids))
        self._remember(record)
        self._active[rid] = _Active(weakref.ref(stream), RequestFold.start(self.frontend.tokenizer, request.params),
                                    record, max_chunks is not None, media_slots.take() if prompt.media else None)
        self._client.send(AddRequest(request))
        self._cancel_when_dropped(stream, rid)
        return stream

    def _cancel_when_dropped(self, stream: RequestStream, request_id: str) -> None:
        """Cancel the request once its consumer lets its stream go unfinished (it may be collected in any thread)."""
        loop = self._loop

        def dropped() -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._cancel_if_dropped, request_id)

        weakref.finalize(stream, dropped)

    def _cancel_if_dropped(self, request_id: str) -> None:
        active = self._active.get(request_id)
        if active is not None and active.stream_ref() is None:  # not a later request of the same id
            self.cancel_nowait(request_id)

    def cancel_nowait(self, request_id: str) -> int | None:
        """The fence part of a cancel: end the stream now and tell the core.

        Returns the number of undelivered events discarded, or None when the
        request is unknown or already ended.
        """
        active = self._active.get(request_id)
        if active is None or active.record.cancelled:
            return None
        record = active.record
        record.cancelled = True
        record.finished, record.finish_reason, record.finished_at = True, "abort", time.time()
        stream = active.stream_ref()
        discarded = 0 if stream is None else stream.cancel(StreamEvent("cancelled", request_id, finish_reason="abort"))
        active.abort_ack = self._loop.create_future()
        try:
            self._client.send(AbortRequests([request_id]))
        except EngineDeadError:
            active.abort_ack.set_result(False)
        return discarded

    async def abort(self, request_id: str) -> dict[str, Any]:
        """Cancel a request as a fence: after this returns, no token event of it is delivered.

        Waits (bounded) for the core to confirm the request's KV blocks are free.
        """
        t0 = time.perf_counter()
        active = self._active.get(request_id)
        discarded = self.cancel_nowait(request_id)
        if discarded is None:
            record = self.records.get(request_id)
            reason = "unknown request" if record is None else f"already ended ({record.finish_reason})"
            return {"request_id": request_id, "cancelled": False, "reason": reason}
        try:
            acknowledged = await asyncio.wait_for(asyncio.shield(active.abort_ack), ABORT_ACK_TIMEOUT_S)
        except asyncio.TimeoutError:
            acknowledged = False
        self._drop(request_id)
        return {
            "request_id": request_id,
            "cancelled": True,
            "discarded_events": discarded,
            "output_tokens_at_cancel": active.record.output_tokens,
            "acknowledged": acknowledged,
            "ack_s": round(time.perf_counter() - t0, 4),
        }

    async def refresh_stats(self) -> CoreStats:
        if self.healthy:
            self._client.send(StatsQuery())
            await asyncio.sleep(0.05)
        return self.core_stats

    # -- core messages (event loop thread) -------------------------------------

    def _on_messages(self, reports: list[Report]) -> None:
        for report in reports:
            if isinstance(report, (Deltas, Stats)):
                self.core_stats = report.stats
            if isinstance(report, Deltas):
                for delta in report.deltas:
                    self._on_delta(delta)

    def _on_delta(self, delta: TokenDelta) -> None:
        active = self._active.get(delta.request_id)
        if active is None:
            return
        record = active.record
        if record.cancelled:
            if delta.finish_reason != "abort":
                record.late_events += 1
            # The core's ack, or the request finishing on its own before the abort reached the core (which then
            # has nothing to abort and sends no ack): either way it holds nothing now.
            if delta.finished:
                if active.abort_ack is not None and not active.abort_ack.done():
                    active.abort_ack.set_result(True)
                self._drop(delta.request_id)
            return
        # our own abort after a stop string (already reported): its ack, or the core's own finish before it
        if delta.finish_reason == "abort" or active.stream_ended:
            if delta.finished:
                self._drop(delta.request_id)
            return
        fold = active.fold
        step = fold.apply(delta)
        now = time.time()
        record.num_preemptions, record.output_token_ids, record.first_token_at, record.encode_s = (
            fold.num_preemptions, fold.token_ids, fold.first_token_at, fold.encode_s)
        prompt_logprobs = step.prompt_logprobs  # on the first event that goes out
        if step.token_ids:
            self._emit(active, StreamEvent("token", delta.request_id, step.text, step.token_ids, step.logprobs or None,
                                           prompt_logprobs, fold.num_cached_tokens, time=now))
            prompt_logprobs = None
        elif step.text:
            self._emit(active, StreamEvent("token", delta.request_id, step.text, time=now))
        record.text = fold.text.text
        if not step.finished:
            return
        record.finished, record.finish_reason, record.stop_reason, record.finished_at = True, step.finish_reason, step.stop_reason, now
        if step.error:
            record.error = step.error
            self._emit(active, StreamEvent("error", delta.request_id, error=step.error, finish_reason="error"))
        else:
            self._emit(active, StreamEvent("finished", delta.request_id, prompt_logprobs=prompt_logprobs,
                                           num_cached_tokens=fold.num_cached_tokens, finish_reason=step.finish_reason,
                                           stop_reason=step.stop_reason))
        if step.abort_in_core:
            self._client.send(AbortRequests([delta.request_id]))  # the core still runs it; its ack clears it
        else:
            self._drop(delta.request_id)

    def _drop(self, request_id: str) -> None:
        """Forget an ended request (the core has freed it): its media slot goes back."""
        active = self._active.pop(request_id, None)
        if active is not None and active.media_slot is not None:
            active.media_slot.release()

    def _emit(self, active: _Active, event: StreamEvent) -> None:
        if (stream := active.stream_ref()) is not None:
            stream.push(event)
        if self.on_event is not None:
            self.on_event(active.record.request_id, event)

    def _grant(self, request_id: str, n: int) -> None:
        active = self._active.get(request_id)
        if active is None or not active.uses_credits or active.stream_ended or not self.healthy:
            return
        try:
            self._client.send(GrantCredits(request_id, n))
        except EngineDeadError:
            pass

    def _check_liveness(self, client: CoreClient) -> None:
        """Mark the engine unresponsive while its worker is silent or wedged in a step, and responsive again
        when it speaks; the requests in flight when it went silent end with an error."""
        silent, busy = client.silent_s(), client.step_busy_s
        if silent > self.heartbeat_timeout_s:
            reason = f"the engine worker (pid {client.pid}) stopped responding: no heartbeat for {silent:.1f} s"
        elif busy > self.step_timeout_s:
            reason = f"the engine worker (pid {client.pid}) has been in one step for {busy:.0f} s"
        else:
            reason = None
        if reason is not None and self.hung_reason is None:
            self.hung_reason = reason
            log.error("%s", reason)
            stuck = list(self._active)
            self._fail_all(f"{reason}; the request was ended")
            try:
                client.send(AbortRequests(stuck))  # frees their KV blocks if the worker comes back
            except EngineDeadError:
                pass
        elif reason is None and self.hung_reason is not None:
            log.warning("the engine worker (pid %s) responds again", client.pid)
            self.hung_reason = None

    def _on_dead(self, client: CoreClient, reason: str) -> None:
        if client is not self._client:
            return
        self.dead_reason = reason
        log.error("%s", reason)
        self._fail_all(f"{reason}; the engine is unhealthy until restart()")

    def _fail_all(self, message: str) -> None:
        now = time.time()
        for rid, active in list(self._active.items()):
            record = active.record
            if not record.finished:
                record.error, record.finished, record.finish_reason, record.finished_at = message, True, "error", now
                self._emit(active, StreamEvent("error", rid, error=message, finish_reason="error"))
            if active.abort_ack is not None and not active.abort_ack.done():
                active.abort_ack.set_result(False)
            self._drop(rid)

    def _remember(self, record: RequestRecord) -> None:
        self.records[record.request_id] = record
        while len(self.records) > self.max_records:
            oldest = next(iter(self.records))
            if oldest in self._active:
                break
            self.records.pop(oldest)


def _read_loop(ref: weakref.ref[AsyncEngine], client: CoreClient) -> None:
    """The reader thread: hands the worker's reports to the engine's loop, holding the engine only while it does."""
    while True:
        engine = ref()
        if engine is None or engine._closing or client is not engine._client:
            return
        loop = engine._loop
        del engine
        try:
            msgs = client.receive(0.5)
        except EngineDeadError as exc:
            if (engine := ref()) is not None and not engine._closing:
                try:
                    loop.call_soon_threadsafe(engine._on_dead, client, str(exc))
                except RuntimeError:  # the loop is closed
                    pass
            return
        except (OSError, ValueError):
            return
        if msgs and (engine := ref()) is not None:
            try:
                loop.call_soon_threadsafe(engine._on_messages, msgs)
            except RuntimeError:  # the loop is closed: nobody is left to read
                return
            del engine


def _close_aside(client: CoreClient) -> None:
    """Stop a collected engine's worker on a thread of its own: the last reference often goes on the event loop,
    which must not wait for a worker to exit."""
    threading.Thread(target=client.close, args=(1.0,), name="edge-infer-close", daemon=True).start()


async def _watch(ref: weakref.ref[AsyncEngine], client: CoreClient) -> None:
    """The watchdog task: the engine's liveness checks, holding the engine only while it checks."""
    while True:
        await asyncio.sleep(_WATCH_INTERVAL_S)
        engine = ref()
        if engine is None or client is not engine._client or engine.dead_reason is not None:
            return
        engine._check_liveness(client)
        del engine
