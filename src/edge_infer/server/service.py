"""A served model: its phase, admission, draining and health, whatever kind it is.

Phases: ``loading`` (HTTP is up, the model is not: 503), ``ready``,
``failed`` (the model did not come up, or its engine is gone for good: 503,
and the CLI exits), and ``draining`` (SIGTERM: in-flight requests may finish
within the grace period, new ones get 503, the rest are cancelled at its end).

A ready model is supervised: a worker (text) or stage worker (speech) that
dies is replaced, with a growing back-off, at most ``RestartPolicy.max_restarts``
times within ``window_s``; when the policy is spent, or restarts are off, the
server stops with ``EXIT_ENGINE_DEAD`` so that its own supervisor (systemd,
Docker, Kubernetes) notices.

``text_service.TextService`` and ``speech_service.SpeechService`` subclass
``Service``; ``app.build_app`` serves one or several of them behind one set
of shared routes (health, metrics, models).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from edge_infer.engine.media_gate import MediaSlots
from edge_infer.server.errors import APIError
from edge_infer.server.exit_codes import EXIT_ENGINE_DEAD
from edge_infer.server.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BODY_ITEMS
from edge_infer.server.protocol import ModelCard

# Seconds a client is told to wait after a 429 (a hint: one short request's time on an edge box).
RETRY_AFTER_S = 1
_POLL_S = 0.05
_SUPERVISE_INTERVAL_S = 0.2
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    enabled: bool = True
    max_restarts: int = 3  # within window_s; one more death stops the server
    window_s: float = 600.0
    backoff_s: float = 0.5  # before the first restart of a window; doubled for each further one
    kill_unresponsive_s: float = 60.0  # an unresponsive worker is killed (then restarted) after this long



@dataclass(frozen=True)
class ServeSettings:
    served_model_name: str
    api_key: str | None = None
    max_queue: int = 32
    shutdown_grace_s: float = 10.0
    tool_call_parser: str = "hermes"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_body_bytes_in_flight: int | None = None  # bodies the requests in flight hold (the plan's item); None: 2x
    max_body_items: int = DEFAULT_MAX_BODY_ITEMS  # JSON items per body (http.BodyCost.of), counted before parsing
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # from the request's head to its body's end
    # Special-token text in chat messages and tools tokenized as control tokens (off: as plain text).
    special_tokens_in_content: bool = False

    @property
    def bodies_in_flight(self) -> int:
        """The budget of bodies in flight: the flag, else twice the largest body."""
        return self.max_body_bytes_in_flight or 2 * self.max_body_bytes


class LiveRequest(Protocol):
    def cancel(self, reason: str) -> None: ...


class Admission:
    """Sequences held by one request until its response ends, and the media slots it acquired for them (those
    its engine requests did not take); release is idempotent."""

    def __init__(self, state: "Service", n: int):
        self.state = state
        self.n = n
        self.media: MediaSlots | None = None
        state.in_flight += n

    def release(self) -> None:
        if self.n:
            self.state.in_flight -= self.n
            self.n = 0
        if self.media is not None:
            self.media.release()


class Service:
    """Phase, admission and live requests of one served model; subclasses own the model."""

    kind = "abstract"  # which route set serves it: "text" or "speech"
    unit = "sequences"  # what admission counts, in messages

    def __init__(self, settings: ServeSettings, metrics: Any, max_num_seqs: int, restart: RestartPolicy = RestartPolicy()):
        self.settings = settings
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.created = int(time.time())
        self.phase = "loading"
        self.load_error: str | None = None
        self.in_flight = 0
        self.live: set[LiveRequest] = set()
        # Set by the CLI: stop the server with an exit code (the model cannot serve any more).
        self.on_fatal: Callable[[int, str], None] | None = None
        # Set by build_app: the other models this server serves, by name: (their kind, the route to send them to).
        self.neighbours: dict[str, tuple[str, str]] = {}
        self.restart_policy = restart
        self.restarting = False
        self._restarts: deque[float] = deque()  # monotonic times of restarts in the current window
        self._supervisor: asyncio.Task | None = None

    @property
    def capacity(self) -> int:
        """Admitted at once: what the model runs together plus the queue."""
        return self.max_num_seqs + self.settings.max_queue

    # -- what subclasses provide ---------------------------------------------------

    async def _start(self, progress: Callable[[int, int], None] | None) -> None:
        raise NotImplementedError

    def down_reason(self) -> str | None:
        """Why the model cannot serve right now (a dead worker or stage), or None."""
        raise NotImplementedError

    def model_card(self) -> ModelCard:
        raise NotImplementedError

    async def refresh_metrics(self) -> None:
        """Set the gauges read at scrape time."""
        raise NotImplementedError

    def dead_reason(self) -> str | None:
        """What died (a worker or a stage's worker) and how, while it is dead; None otherwise."""
        raise NotImplementedError

    async def revive(self) -> None:
        """Replace what died; raises when that fails (counted against the restart policy)."""
        raise NotImplementedError

    def kill_if_unresponsive(self) -> bool:
        """Kill a worker silent past RestartPolicy.kill_unresponsive_s (it is then dead and revived); True if one was."""
        return False

    def health(self) -> tuple[str, str | None, dict[str, Any]]:
        """(status, detail, extra fields) for /health: ``ok``, or a phase or the engine's trouble and why."""
        if self.phase != "ready":
            return self.phase, self.load_error, {}
        return self.health_status, self.down_reason(), {}

    @property
    def health_status(self) -> str:
        """``ok``, or the engine's trouble as /health and error codes name it."""
        return "ok" if self.down_reason() is None else "engine_dead"

    def engine_failed(self, what: str) -> APIError:
        """The 503 for a request that a failing engine (or pipeline stage) ended: coded as /health names the trouble
        (dead, unresponsive, restarting), saying what happens next."""
        status = self.health_status
        then = ("the server restarts it: retry shortly" if self.restart_policy.enabled
                else "restarts are off (--no-restart): the server stops")
        return APIError(503, f"{what}; {then}", code=status if status != "ok" else "engine_dead",
                        headers={"Retry-After": str(RETRY_AFTER_S)})

    async def close(self) -> None:
        raise NotImplementedError

    # -- checks made before a request touches the model ---------------------------

    def check_ready(self) -> None:
        if self.phase == "loading":
            raise APIError(503, "the model is still loading; retry when GET /health answers 200", code="loading",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        if self.phase == "draining":
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if self.phase == "failed":
            raise APIError(503, f"the model failed to load: {self.load_error}", code="engine_dead")
        down = self.down_reason()
        if down is not None:
            raise APIError(503, down, code=self.health_status, headers={"Retry-After": str(RETRY_AFTER_S)})

    def check_model(self, name: str | None) -> None:
        if name is not None and name in self.neighbours:  # another model of this server, of another kind
            kind, path = self.neighbours[name]
            raise APIError(404, f"model {name!r} is this server's {kind} model: send it to {path}; this route serves "
                                f"{self.settings.served_model_name!r}", param="model", code=f"not_a_{self.kind}_model")
        if name is not None and name != self.settings.served_model_name:
            raise APIError(
                404, f"model {name!r} is not served here; this server serves {self.settings.served_model_name!r} (GET /v1/models)",
                param="model", code="model_not_found",
            )

    def admit(self, n: int = 1) -> Admission:
        if n > self.capacity:
            raise APIError(
                400, f"the request asks for {n} {self.unit} (n x prompts) but this server admits at most {self.capacity} "
                f"at once; lower n or send fewer prompts per request", param="n", code="too_many_sequences",
            )
        if self.in_flight + n > self.capacity:
            self.metrics.rejected.inc()
            raise APIError(
                429,
                f"the admission queue is full ({self.in_flight} of {self.capacity} {self.unit} in flight: "
                f"--max-num-seqs {self.max_num_seqs} + --max-queue {self.settings.max_queue}); retry after {RETRY_AFTER_S} s",
                code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return Admission(self, n)

    # -- life cycle ------------------------------------------------------------------

    def stop(self, exit_code: int, reason: str) -> None:
        """Stop serving for good: requests in flight end, the server exits with ``exit_code``."""
        self.phase = "failed"
        self.load_error = reason
        for run in list(self.live):
            run.cancel(reason)
        if self.on_fatal is not None:
            self.on_fatal(exit_code, reason)

    async def load(self, progress: Callable[[int, int], None] | None = None) -> None:
        try:
            await self._start(progress)
        except Exception as exc:
            self.phase = "failed"
            self.load_error = f"{type(exc).__name__}: {exc}"
            raise
        if self.phase == "loading":
            self.phase = "ready"
            self._supervisor = asyncio.ensure_future(self._supervise())

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(_SUPERVISE_INTERVAL_S)
            if self.phase != "ready" or self.kill_if_unresponsive():
                continue
            reason = self.dead_reason()
            if reason is not None:
                await self._restart_or_stop(reason)

    async def _restart_or_stop(self, reason: str) -> None:
        policy = self.restart_policy
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > policy.window_s:
            self._restarts.popleft()
        if not policy.enabled or len(self._restarts) >= policy.max_restarts:
            why = "restarts are off (--no-restart)" if not policy.enabled else (
                f"it died {len(self._restarts) + 1} times within {policy.window_s:g} s (--max-restarts {policy.max_restarts})")
            self.stop(EXIT_ENGINE_DEAD, f"{reason}; not restarting: {why}")
            await asyncio.sleep(3600)  # the server is shutting down around this task
            return
        delay = policy.backoff_s * 2 ** len(self._restarts)
        self._restarts.append(now)
        self.restarting = True
        log.error("%s; restarting it in %.1f s (restart %d of at most %d within %g s)",
                  reason, delay, len(self._restarts), policy.max_restarts, policy.window_s)
        try:
            await asyncio.sleep(delay)
            await self.revive()
        except Exception as exc:  # counted against the policy; the next tick tries again or stops
            log.error("restarting failed: %s", exc)
        finally:
            self.restarting = False

    def stop_supervising(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()

    async def drain(self) -> None:
        """Let in-flight requests finish within the grace period, then cancel the rest."""
        grace = self.settings.shutdown_grace_s
        self.phase = "draining"
        deadline = time.monotonic() + grace
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        for run in list(self.live):
            run.cancel(f"the server is shutting down and the request did not finish within the {grace:g} s grace period")
