"""A served text model: its engine and frontend, on top of the shared ``Service``.

The engine worker is supervised (``Service``): a worker that dies is restarted,
one that stops responding for ``RestartPolicy.kill_unresponsive_s`` is killed first.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from edge_infer.engine.async_engine import AsyncEngine
from edge_infer.engine.frontend import Frontend
from edge_infer.media.limits import MEDIA_PREP_THREADS
from edge_infer.server.metrics import SharedMetrics, TextMetrics
from edge_infer.server.protocol import ModelCard
from edge_infer.server.service import RestartPolicy, ServeSettings, Service

log = logging.getLogger(__name__)
T = TypeVar("T")


class TextService(Service):
    kind = "text"

    def __init__(self, frontend: Frontend, settings: ServeSettings, worker: str = "process",
                 restart: RestartPolicy = RestartPolicy(), heartbeat_timeout_s: float | None = None,
                 shared: SharedMetrics | None = None):
        metrics = TextMetrics(shared or SharedMetrics(), frontend.plan)
        super().__init__(settings, metrics, frontend.engine_config.max_num_seqs, restart)
        self.frontend = frontend
        extra = {} if heartbeat_timeout_s is None else {"heartbeat_timeout_s": heartbeat_timeout_s}
        self.engine = AsyncEngine(frontend, worker=worker, **extra)
        frontend.specials_in_content = settings.special_tokens_in_content
        frontend.model_name = settings.served_model_name
        if frontend.tokenizer is not None:
            frontend.tokenizer.max_token_chars  # noqa: B018 - computed now, not in the first request
        # Tokenizing and rendering run here, off the event loop: one large prompt must not stall the others.
        self._prep = ThreadPoolExecutor(1, thread_name_prefix="edge-infer-prep")
        # Requests with media are prepared on their own threads: decoding a large image or video takes seconds,
        # and text requests must not queue behind it.
        self._media_prep = ThreadPoolExecutor(MEDIA_PREP_THREADS, thread_name_prefix="edge-infer-media")

    async def _start(self, progress: Callable[[int, int], None] | None) -> None:
        await self.engine.start(progress)
        await self._warm()

    async def _warm(self) -> None:
        """A chat's first-use work (jinja2's import, the template's compiling, the preparation thread) now, not in
        the first request: its latency is then every request's, and a server short of file descriptors at that
        moment can still serve it (importing opens files)."""
        tokenizer = self.frontend.tokenizer
        if tokenizer is None or not tokenizer.chat_template:
            return
        try:
            await self.off_loop(self.frontend.render_chat, [{"role": "user", "content": "Hello"}])
        except Exception as exc:  # noqa: BLE001 - a template that fails here fails its requests, with the reason
            log.warning("rendering a one-message chat at start failed: %s", exc)

    def down_reason(self) -> str | None:
        if self.restarting:
            return "the engine worker died and is restarting"
        reason = self.engine.down_reason
        return None if reason is None and self.engine.healthy else f"the engine worker is down ({reason or 'not running'})"

    @property
    def health_status(self) -> str:
        """``ok``, or what is wrong with the engine: engine_restarting, engine_unresponsive or engine_dead."""
        if self.restarting:
            return "engine_restarting"
        if self.engine.healthy:
            return "ok"
        return "engine_unresponsive" if self.engine.hung_reason and not self.engine.dead_reason else "engine_dead"

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.settings.served_model_name, created=self.created,
                         max_model_len=self.frontend.max_model_len, runtime=self.frontend.runtime_summary())

    async def refresh_metrics(self) -> None:
        stats = await self.engine.refresh_stats() if self.engine.healthy else None
        self.metrics.refresh(stats, self.in_flight, self.engine.media_gate.waiting)

    async def off_loop(self, fn: Callable[..., T], *args: Any, media: bool = False) -> T:
        """``fn(*args)`` on the preparation thread (tokenizing, template rendering), or with ``media`` on one of
        the media threads (reading and decoding images, audio, video besides)."""
        pool = self._media_prep if media else self._prep
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def close(self) -> None:
        self.stop_supervising()
        await self.engine.close()
        self._prep.shutdown(wait=False)
        self._media_prep.shutdown(wait=False, cancel_futures=True)

    # -- supervision (Service) ---------------------------------------------------------

    def dead_reason(self) -> str | None:
        return self.engine.dead_reason

    def kill_if_unresponsive(self) -> bool:
        engine = self.engine
        if engine.hung_reason and not engine.dead_reason and engine.silent_s() > self.restart_policy.kill_unresponsive_s:
            log.error("killing the engine worker: %s", engine.hung_reason)
            engine.kill_worker()
            return True
        return False

    async def revive(self) -> None:
        try:
            await self.engine.restart()
        except Exception as exc:
            self.engine.dead_reason = f"restarting the engine worker failed: {exc}"
            raise
        self.metrics.engine_restarts.inc()
        log.warning("the engine worker is back (pid %s)", self.engine.worker_pid)
