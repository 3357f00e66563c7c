"""A stage's process: the loop that drives one executor, and the parent's handle on it.

The stage process is a child (``engine/child.py``: a fresh interpreter, so
no main guard is needed) holding one end of a duplex pipe, over which its
``WorkerSpec`` comes first. It reads orchestrator messages, feeds its
executor, steps it while it has work and sends outputs as long as its
unacknowledged-payload budget allows (otherwise it waits for releases:
back-pressure). It dies with its parent: PR_SET_PDEATHSIG (Linux) turns the
parent's death into SIGTERM, and a closed pipe ends the loop anywhere; either
way it unlinks the segments it still owns on the way out. The signal handler
does that itself and exits on the spot rather than raising: a killed
multi-threaded parent sends one death signal per exiting thread, and an
exception from a late one would cut short the clean-up it lands in. A SIGTERM
while the parent lives (a service manager or `timeout` signalling the whole
process group) is the parent's to handle: it drains its requests, then shuts
the stage down.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any, Callable

from edge_infer.engine.child import Child
from edge_infer.memory.measure import malloc_trim
from edge_infer.runtime import messages as m
from edge_infer.runtime.config import StageConfig
from edge_infer.runtime.contracts import Payload, validate
from edge_infer.runtime.executors import StageExecutor, StageRequestError, StepOutput, load_executor
from edge_infer.runtime.transport import OutboundBuffers, TransportError, receive, sweep_segments

_PR_SET_PDEATHSIG = 1
_MAX_MESSAGES_PER_TURN = 256  # then step once, so a flood of inputs cannot starve the executor


@dataclass(frozen=True)
class WorkerSpec:
    stage: StageConfig
    executor_target: str
    key: m.WorkerKey
    segment_prefix: str
    inline_threshold_bytes: int
    max_unacked: int
    max_payload_bytes: int


# --- inside the stage process -------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def run_worker(fd: int) -> None:
    """Entry point of the stage process (engine/child.py has SIGINT ignored: Ctrl-C is the parent's to handle)."""
    parent_pid = os.getppid()
    segment_prefix: str | None = None  # known once the spec arrives

    def on_sigterm(signum: int, frame: Any) -> None:
        if os.getppid() != parent_pid:  # the parent is gone (PR_SET_PDEATHSIG)
            if segment_prefix is not None:
                sweep_segments(segment_prefix)  # also one created but not yet recorded where the signal struck
            os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    _die_with_parent(parent_pid)
    conn = Connection(fd)
    try:
        spec = conn.recv()
    except (EOFError, OSError):
        return  # the parent is gone already
    segment_prefix = spec.segment_prefix
    worker = _StageLoop(spec, conn)
    try:
        worker.serve()
    except (EOFError, OSError):
        pass  # the parent's end of the pipe closed: nobody to serve
    finally:
        worker.buffers.release_all()


@dataclass
class _RequestTrack:
    metrics: m.StageMetrics
    first_input_at: float | None = None
    last_output_at: float | None = None

    def snapshot(self) -> m.StageMetrics:
        if self.first_input_at is not None:
            end = self.last_output_at or time.monotonic()
            self.metrics.time_in_stage_s = max(0.0, end - self.first_input_at)
        return m.StageMetrics(**self.metrics.__dict__)


_TOKEN_CONTRACTS = ("token_ids/1", "codec_codes/1")


class _StageLoop:
    def __init__(self, spec: WorkerSpec, conn: Connection):
        self.spec = spec
        self.stage = spec.stage
        self.conn = conn
        self.buffers = OutboundBuffers(spec.segment_prefix, spec.inline_threshold_bytes, spec.max_unacked)
        self.executor: StageExecutor | None = None
        self.requests: dict[str, _RequestTrack] = {}
        self.outbox: deque[StepOutput] = deque()
        self.acks: list[tuple[m.WorkerKey, int]] = []
        self.stopping = False
        self._send_lock = threading.Lock()  # the loop and the heartbeat thread share the pipe

    def _send(self, msg: Any) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def _beat(self) -> None:
        """Liveness for the orchestrator: a stopped or wedged process goes silent, a long step does not."""
        while True:
            time.sleep(m.HEARTBEAT_INTERVAL_S)
            try:
                self._send(m.Heartbeat())
            except (OSError, ValueError):
                return  # the pipe is closed: the process is ending

    def serve(self) -> None:
        try:
            if self.stage.nice:
                os.nice(self.stage.nice)
            self.executor = load_executor(self.spec.executor_target)()
            self.executor.start(self.stage)
        except Exception as exc:  # noqa: BLE001 - any start failure is reported, not raised
            self._send(m.StartFailed(f"{self.stage.label} failed to start: {type(exc).__name__}: {exc}"))
            return
        self._send(m.Ready(os.getpid()))
        threading.Thread(target=self._beat, name="stage-heartbeat", daemon=True).start()
        executor = self.executor
        stepped = False
        while not self.stopping:
            runnable = executor.has_work() and not self.outbox
            if not runnable and stepped:
                # What the steps freed goes back to the OS before waiting: glibc keeps freed blocks of the
                # sizes the steps allocated (Code2Wav at the 0.6B shapes in fp32: 136-190 MiB after decodes of
                # 1-8 frames, whose live activations are 34 MiB).
                malloc_trim()
                stepped = False
            if self.conn.poll(0 if runnable else None):
                self._read_messages()
            self._flush_acks()
            self._flush_outbox()
            if not self.stopping and not self.outbox and executor.has_work():
                self._step()
                stepped = True
                self._flush_outbox()
        executor.shutdown()

    # messages in

    def _read_messages(self) -> None:
        for _ in range(_MAX_MESSAGES_PER_TURN):
            self._handle(self.conn.recv())
            if self.stopping or not self.conn.poll(0):
                return

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, m.Input):
            self._on_input(msg)
        elif isinstance(msg, m.Open):
            self.requests[msg.request_id] = _RequestTrack(m.StageMetrics(self.stage.stage_id))
            self._guard(msg.request_id, self.executor.submit, msg.request_id, msg.params)
        elif isinstance(msg, m.EndInput):
            if msg.request_id in self.requests:
                self._guard(msg.request_id, self.executor.end_input, msg.request_id)
        elif isinstance(msg, m.Release):
            self.buffers.release(msg.seqs)
        elif isinstance(msg, m.Abort):
            self._forget(msg.request_id)
            self._send(m.AbortDone(msg.request_id))
        elif isinstance(msg, m.Shutdown):
            self.stopping = True

    def _on_input(self, msg: m.Input) -> None:
        now = time.monotonic()
        try:
            payload = receive(msg.ref)
            error = None
        except TransportError as exc:
            payload, error = None, str(exc)
        if msg.producer is not None:
            self.acks.append((msg.producer, msg.ref.seq))  # copied out (or gone): the buffer may go
        track = self.requests.get(msg.request_id)
        if track is None:
            return  # aborted or failed here already
        if error is not None:
            self._fail(msg.request_id, error)
            return
        if track.first_input_at is None:
            track.first_input_at = now
            track.metrics.queue_wait_s = max(0.0, now - msg.sent_at)
        track.metrics.chunks_in += 1
        if payload.contract in _TOKEN_CONTRACTS:
            track.metrics.tokens_in += payload.items
        self._guard(msg.request_id, self.executor.feed, msg.request_id, payload)

    def _guard(self, request_id: str, fn: Callable[..., None], *args: Any) -> None:
        """Run an executor call for one request; its failure fails that request only."""
        try:
            fn(*args)
        except StageRequestError as exc:
            self._fail(exc.request_id, str(exc))
        except Exception as exc:  # noqa: BLE001 - attributable to this request
            self._fail(request_id, f"{type(exc).__name__}: {exc}")

    # work and messages out

    def _step(self) -> None:
        try:
            outputs = self.executor.step()
        except Exception as exc:  # noqa: BLE001 - a step failure is not attributable: the stage is broken
            self._send(m.Fatal(f"{self.stage.label} step failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"))
            raise SystemExit(1) from None
        for out in outputs:
            if out.request_id not in self.requests:
                continue
            problem = out.error or (self._check_output(out.payload) if out.payload is not None else None)
            if problem:
                self._fail(out.request_id, problem)
            else:
                self.outbox.append(out)

    def _check_output(self, payload: Payload) -> str | None:
        declared = self.executor.output_contracts
        if payload.contract not in declared:
            return f"emitted {payload.contract}, but its executor declares {', '.join(sorted(declared))}"
        verdict = validate(payload)
        if not verdict.valid:
            return f"emitted an invalid {payload.contract} payload: {'; '.join(verdict.reasons)}"
        if payload.nbytes > self.spec.max_payload_bytes:
            return (
                f"emitted a {payload.nbytes}-byte payload, over its reservation's max_payload_bytes "
                f"({self.spec.max_payload_bytes}); raise reservation.max_payload_bytes or emit smaller chunks"
            )
        return None

    def _flush_outbox(self) -> None:
        while self.outbox:
            out = self.outbox[0]
            if out.payload is not None and not self.buffers.can_send:
                return  # wait for releases: back-pressure
            self.outbox.popleft()
            track = self.requests.get(out.request_id)
            if track is None:
                continue
            ref = self.buffers.export(out.payload) if out.payload is not None else None
            if out.payload is not None:
                track.last_output_at = time.monotonic()
                track.metrics.chunks_out += 1
                if out.payload.contract in _TOKEN_CONTRACTS:
                    track.metrics.tokens_out += out.payload.items
            self._send(m.Output(out.request_id, ref, out.finished, track.snapshot()))
            if out.finished:
                del self.requests[out.request_id]

    def _flush_acks(self) -> None:
        if self.acks:
            self._send(m.Acked(self.acks))
            self.acks = []

    def _fail(self, request_id: str, error: str) -> None:
        track = self.requests.get(request_id)
        self._forget(request_id)
        metrics = track.snapshot() if track else m.StageMetrics(self.stage.stage_id)
        self._send(m.RequestFailed(request_id, f"{self.stage.label}: {error}", metrics))

    def _forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.executor.abort(request_id)
        if any(o.request_id == request_id for o in self.outbox):
            self.outbox = deque(o for o in self.outbox if o.request_id != request_id)


# --- the parent's handle ------------------------------------------------------

_STOP = object()


class WorkerProcess:
    """A stage process seen from the orchestrator's event loop.

    A reader thread turns pipe messages (and the process's end: its pidfd,
    or the pipe's end) into callbacks on the loop; a writer thread sends, so
    the loop never blocks on a full pipe.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        on_message: Callable[["WorkerProcess", Any], None],
        on_exit: Callable[["WorkerProcess"], None],
    ):
        self.spec = spec
        self.key = spec.key
        self.stage_id = spec.key[0]
        self.label = spec.stage.label
        self._on_message = on_message
        self._on_exit = on_exit
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.child: Child | None = None
        self.alive = False
        self.stopping = False  # the orchestrator asked it to stop: its exit is no failure
        self.fatal_error: str | None = None
        # Bookkeeping owned by the orchestrator (loop thread only).
        self.inflight: set[str] = set()
        self.holding: set[tuple[m.WorkerKey, int]] = set()  # payloads delivered here, not yet acknowledged
        self.unreleased = 0  # payloads it produced that consumers still hold
        self.abort_waiters: dict[str, asyncio.Future[bool]] = {}
        self.ready: asyncio.Future[None] | None = None
        self.exited: asyncio.Future[None] | None = None
        self.last_heard = time.monotonic()  # any message, heartbeats included (set by the reader thread)
        self.drained: asyncio.Future[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child is not None else None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.ready, self.exited = loop.create_future(), loop.create_future()
        # A start failure may be set after the caller stopped waiting: mark it retrieved.
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.conn, child_conn = Pipe(duplex=True)
        self.child = Child(f"{__name__}:run_worker", [child_conn.fileno()])
        child_conn.close()  # only the child holds its end: its death reads as EOF here
        self._outbox.put(self.spec)  # its first message
        self.alive = True
        threading.Thread(target=self._read, args=(loop,), name=f"stage{self.stage_id}-reader", daemon=True).start()
        threading.Thread(target=self._write, name=f"stage{self.stage_id}-writer", daemon=True).start()

    def send(self, msg: Any) -> None:
        if self.alive:
            self._outbox.put(msg)

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                if not self.conn.poll(0) and self.conn not in wait([self.conn, self.child.pidfd]):
                    break  # the process exited and left nothing unread
                msg = self.conn.recv()
                self.last_heard = time.monotonic()
            except (EOFError, OSError):
                break
            except Exception as exc:  # noqa: BLE001 - an unreadable message: the stage cannot be trusted
                self.fatal_error = f"sent an unreadable message ({type(exc).__name__}: {exc}); stopped"
                self.kill()
                break
            if isinstance(msg, m.Heartbeat):
                continue
            try:
                loop.call_soon_threadsafe(self._on_message, self, msg)
            except RuntimeError:
                break  # the loop is closed: nobody listens any more
        self.child.wait(5)
        self._outbox.put(_STOP)
        try:
            loop.call_soon_threadsafe(self._on_exit, self)
        except RuntimeError:
            pass

    def _write(self) -> None:
        while True:
            msg = self._outbox.get()
            if msg is _STOP:
                return
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                return  # the process is gone; the reader reports it

    def exit_description(self) -> str:
        reason = self.child.describe_exit()
        return f"{reason}: {self.fatal_error}" if self.fatal_error else reason

    def kill(self) -> None:
        self.child.kill()

    def close(self) -> None:
        self._outbox.put(_STOP)
        try:
            self.conn.close()
        except OSError:
            pass
        self.child.close()
