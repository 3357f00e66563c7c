"""Run an ``EngineCore`` in a worker process (default) or a thread (tests).

Frontends talk to the core over two one-way pipes. The worker is a child
process (``engine/child.py``: a fresh interpreter, so no main guard is needed)
that inherits the two pipe ends. It exits as soon as its command pipe reaches
end-of-file, so a frontend that dies takes its worker with it. The frontend
waits on the worker's pidfd next to the output pipe, so a worker that dies is
noticed at once.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection, Pipe, wait
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

from edge_infer import errors
from edge_infer.config import EngineConfig
from edge_infer.engine import protocol as msg
from edge_infer.engine.child import Child
from edge_infer.engine.protocol import ReadyInfo

log = logging.getLogger(__name__)

# Progress messages during loading are rate-limited to this interval.
PROGRESS_INTERVAL_S = 0.1
# A running worker says it is alive this often, whatever its steps take (the frontend's liveness check).
HEARTBEAT_INTERVAL_S = 0.5
_STOP_SENDING = object()  # ends a CoreClient's sender thread


class _Outputs:
    """The output pipe, shared by the engine loop and the heartbeat thread (a Connection is not thread-safe)."""

    def __init__(self, conn: Connection):
        self._conn = conn
        self._lock = threading.Lock()
        self.step_started: float | None = None  # monotonic time the running step began, None between steps

    def send(self, report: msg.Report) -> None:
        with self._lock:
            self._conn.send(report)

    def beat(self, stop: threading.Event) -> None:
        """Until ``stop``: a Heartbeat with the seconds the current step has been running (0 between steps)."""
        while not stop.wait(HEARTBEAT_INTERVAL_S):
            started = self.step_started
            try:
                self.send(msg.Heartbeat(0.0 if started is None else time.monotonic() - started))
            except (OSError, ValueError):
                return


def core_loop(config: EngineConfig, commands: Connection, output_conn: Connection) -> None:
    """Load the model, then serve commands until told to stop or the pipe closes."""
    from edge_infer.engine.core import EngineCore

    outputs = _Outputs(output_conn)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= PROGRESS_INTERVAL_S:
            last[0] = now
            outputs.send(msg.LoadProgress(done, total))

    try:
        core = EngineCore(config, progress)
    except Exception as exc:
        import traceback

        outputs.send(msg.InitFailed(type(exc).__name__, str(exc), traceback.format_exc()))
        return
    outputs.send(msg.Ready(core.ready_info))
    stop = threading.Event()
    threading.Thread(target=outputs.beat, args=(stop,), name="edge-infer-heartbeat", daemon=True).start()
    try:
        _serve_commands(core, commands, outputs)
    finally:
        stop.set()


def _serve_commands(core: Any, commands: Connection, outputs: _Outputs) -> None:
    from edge_infer.memory.measure import malloc_trim

    stepped = False
    while True:
        try:
            if not core.has_work():
                if stepped:  # what the steps freed goes back to the OS while the engine waits
                    malloc_trim()
                    stepped = False
                commands.poll(None)  # idle: block until a command arrives (or EOF)
            while commands.poll(0):
                command = commands.recv()
                if isinstance(command, msg.AddRequest):
                    err = core.add_request(command.request)
                    if err is not None:
                        outputs.send(msg.Deltas([err], core.current_stats()))
                elif isinstance(command, msg.AbortRequests):
                    outputs.send(msg.Deltas(core.abort(command.request_ids), core.current_stats()))
                elif isinstance(command, msg.GrantCredits):
                    core.grant(command.request_id, command.credits)
                elif isinstance(command, msg.StatsQuery):
                    outputs.send(msg.Stats(core.current_stats()))
                elif isinstance(command, msg.Shutdown):
                    return
        except (EOFError, OSError):
            return  # the frontend is gone
        if core.has_work():
            outputs.step_started = time.monotonic()
            deltas = core.step()
            stepped = True
            outputs.step_started = None
            if deltas:
                outputs.send(msg.Deltas(deltas, core.current_stats()))


def worker_main(command_fd: int, output_fd: int) -> None:
    """Entry point of the worker process (engine/child.py has SIGINT ignored)."""
    # SIGTERM from `timeout` or a service manager stopping a control group reaches the whole
    # group too. The frontend decides when its worker stops (it drains, then closes the pipe),
    # so the worker must not die of it first. It still ends with its frontend: the pipe
    # closes, even when the frontend is SIGKILLed.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    commands = Connection(command_fd, writable=False)
    outputs = Connection(output_fd, readable=False)
    try:
        config = commands.recv()
        _pin_allocator_for_encoders(config)
        core_loop(config, commands, outputs)
    except (EOFError, BrokenPipeError):
        pass


def _pin_allocator_for_encoders(config: EngineConfig) -> None:
    """A thinker's worker has large blocks mapped directly from the start (memory.measure.pin_mmap_threshold),
    so what a media encode adds to RssAnon is the live tensors the plan sizes, and it is given back when the
    encode ends; PyTorch's large blocks are reused by size within the plan's "block cache" item
    (quant/native.cache_large_blocks), not faulted in afresh for every tensor. Text engines keep glibc's
    default: their activation calibration was measured with it."""
    from edge_infer.memory.measure import MMAP_THRESHOLD, RELEASE_HOOKS, pin_mmap_threshold
    from edge_infer.models.config import ModelConfig
    from edge_infer.quant import native

    try:
        thinker = ModelConfig.from_dir(config.model).multimodal is not None
    except (errors.EdgeInferError, OSError):
        return  # EngineCore reports an unreadable checkpoint
    if thinker:
        pin_mmap_threshold()
        if config.block_cache_bytes and native.cache_large_blocks(MMAP_THRESHOLD, config.block_cache_bytes):
            RELEASE_HOOKS.append(native.release_cached_blocks)  # given back with glibc's heap (malloc_trim)


_INIT_ERRORS = {
    "CheckpointError": errors.CheckpointError,
    "InvalidRequestError": errors.InvalidRequestError,
    "PlanRefusedError": errors.PlanRefusedError,
    "KernelUnavailableError": errors.KernelUnavailableError,
}


class CoreClient:
    """The frontend's handle on one engine core (process or thread)."""

    def __init__(self, config: EngineConfig, mode: str = "process"):
        if mode not in ("process", "thread"):
            raise ValueError(f"worker mode must be 'process' or 'thread', got {mode!r}")
        self.config = config
        self.mode = mode
        self.ready: ReadyInfo | None = None
        # Liveness: when the core last said anything (heartbeats included), and how long its current step runs.
        self.last_heard: float = time.monotonic()
        self.step_busy_s: float = 0.0
        self._proc: Child | None = None
        self._thread: threading.Thread | None = None
        self._cmd_recv, self._cmd_send = Pipe(duplex=False)
        self._out_recv, self._out_send = Pipe(duplex=False)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._send_error: Exception | None = None
        self._sender = threading.Thread(target=self._send_queued, name="edge-infer-sender", daemon=True)
        self._sender.start()

    # -- life cycle -----------------------------------------------------------

    def start(self, progress: Callable[[int, int], None] | None = None, timeout_s: float | None = None) -> ReadyInfo:
        if self.mode == "process":
            self._proc = Child(f"{__name__}:worker_main", (self._cmd_recv.fileno(), self._out_send.fileno()))
            # The child holds its own copies; closing ours lets EOF reach each side.
            self._cmd_recv.close()
            self._out_send.close()
            self.send(self.config)
        else:
            args = (self.config, self._cmd_recv, self._out_send)
            self._thread = threading.Thread(target=core_loop, args=args, name="edge-infer-core", daemon=True)
            self._thread.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            reports = self.receive(remaining)
            if not reports and deadline is not None and time.monotonic() >= deadline:
                self.close(0)
                raise errors.EngineDeadError(f"the engine worker did not become ready within {timeout_s:.0f} s")
            for report in reports:
                if isinstance(report, msg.LoadProgress) and progress is not None:
                    progress(report.done, report.total)
                elif isinstance(report, msg.InitFailed):
                    self.close()
                    log.debug("the engine core failed to load:\n%s", report.traceback)
                    if report.error_type in _INIT_ERRORS:
                        raise _INIT_ERRORS[report.error_type](report.message)
                    raise errors.EngineLoadError(
                        f"loading the model failed: {report.error_type}: {report.message} (log level debug shows where)")
                elif isinstance(report, msg.Ready):
                    self.ready = report.info
                    return self.ready

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else os.getpid()

    @property
    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.exitcode is None
        return self._thread is not None and self._thread.is_alive()

    def exit_description(self) -> str:
        if self._proc is None:
            return "the engine thread stopped"
        return f"the engine worker process (pid {self._proc.pid}) {self._proc.describe_exit()}"

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the core: ask politely, then kill (the worker ignores SIGTERM)."""
        try:
            self.send(msg.Shutdown())
        except errors.EngineDeadError:
            pass
        if self._proc is not None:
            if not self._proc.wait(timeout_s):
                self.kill()
            self._proc.close()
        elif self._thread is not None:
            self._thread.join(timeout_s)
        self._outbox.put(_STOP_SENDING)
        self._sender.join(1.0)  # a sender still writing to a killed worker gets EPIPE and ends
        if not self._sender.is_alive():  # else it is blocked writing to a wedged core thread: not under it
            self._cmd_send.close()
        self._out_recv.close()

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()

    # -- messages -------------------------------------------------------------

    def send(self, command: msg.Command | EngineConfig) -> None:
        """Queue ``command`` for the core without waiting: the core reads its pipe between steps, and a step can
        run for seconds (or the worker be stopped), so the pipe fills with a few requests' media; the sender
        thread waits for it then, never the caller (a server's event loop). Raises EngineDeadError once the core
        is gone."""
        if self._send_error is not None or not self.alive:
            raise errors.EngineDeadError(f"{self.exit_description()}; restart the engine") from self._send_error
        # Pickled here, as Connection.send would: what cannot be sent fails in the caller, and what is sent is
        # the command as it is now.
        self._outbox.put(ForkingPickler.dumps(command))

    def _send_queued(self) -> None:
        while (data := self._outbox.get()) is not _STOP_SENDING:
            try:
                self._cmd_send.send_bytes(data)
            except (OSError, ValueError) as exc:  # the core is gone; the reader reports it
                self._send_error = exc
                return

    def receive(self, timeout_s: float | None) -> list[msg.Report]:
        """Messages available within ``timeout_s`` (heartbeats are absorbed into ``last_heard``);
        raises EngineDeadError when the core is gone."""
        waitables: list[Any] = [self._out_recv]
        if self._proc is not None and self._proc.pidfd is not None:
            waitables.append(self._proc.pidfd)
        ready = wait(waitables, timeout=timeout_s if self._proc is not None else min(timeout_s or 0.5, 0.5))
        out = []
        heard = False
        try:
            while self._out_recv.poll(0):
                report = self._out_recv.recv()
                heard = True
                if isinstance(report, msg.Heartbeat):
                    self.step_busy_s = report.step_busy_s
                else:
                    out.append(report)
        except (EOFError, OSError):
            pass
        if heard:
            self.last_heard = time.monotonic()
        if not heard and not self.alive and (ready or self._proc is None):
            raise errors.EngineDeadError(f"{self.exit_description()}; restart the engine")
        return out

    def silent_s(self) -> float:
        """Seconds since the core last said anything."""
        return time.monotonic() - self.last_heard

    @property
    def output_fileno(self) -> int:
        return self._out_recv.fileno()

