"""``LocalTextEngine``: local text mode for applications embedding the engine.

    plan = plan_text_session(model, max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=512)
    engine = LocalTextEngine(plan)
    await engine.start()
    session = engine.open_session()
    rid, stream = await engine.submit(session, "Hello", max_tokens=64, max_chunks=8)
    # or chat messages, with image_url / input_audio / audio_url / video_url parts for a multimodal model
    async for event in stream:
        ...
    await engine.close()

Sessions group requests; a closed session's handle (or any copy of it) is
rejected by ``submit``. ``cancel`` is a fence. Records of every request stay
in ``engine.records`` for inspection.
"""
from __future__ import annotations

import asyncio
import itertools
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from edge_infer.engine.async_engine import AsyncEngine, RequestRecord
from edge_infer.engine.frontend import Frontend
from edge_infer.engine.protocol import ReadyInfo
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.engine.streams import RequestStream
from edge_infer.errors import InvalidRequestError, PlanRefusedError, StaleSessionError
from edge_infer.media.limits import MEDIA_PREP_THREADS
from edge_infer.media.sources import MediaPolicy
from edge_infer.memory.plan import TextPlan, plan_text_session


@dataclass(frozen=True)
class Session:
    session_id: str
    engine_id: str


class LocalTextEngine:
    def __init__(self, plan: TextPlan | str, *, worker: str = "process", skip_tokenizer_init: bool = False,
                 media_policy: MediaPolicy | None = None, **plan_kwargs: Any):
        """``media_policy``: where chat media parts may be read from (default: data: URLs only)."""
        if not isinstance(plan, TextPlan):
            plan = plan_text_session(plan, **plan_kwargs)
        if not plan.admitted:
            raise PlanRefusedError("memory plan refused: " + "; ".join(plan.reasons), plan)
        self.plan = plan
        self._engine = AsyncEngine(Frontend.from_plan(plan, skip_tokenizer_init), worker=worker)
        if media_policy is not None:
            self._engine.frontend.media_policy = media_policy
        # Chat prompts are rendered (and their media decoded, which can take seconds) here, off the event loop.
        self._prep = ThreadPoolExecutor(MEDIA_PREP_THREADS, thread_name_prefix="edge-infer-prep")
        self._engine_id = uuid.uuid4().hex
        self._sessions: dict[str, set[str]] = {}
        self._session_ids = itertools.count()

    # -- life cycle ----------------------------------------------------------

    async def start(self, progress: Callable[[int, int], None] | None = None) -> ReadyInfo:
        return await self._engine.start(progress)

    async def close(self) -> None:
        self._sessions.clear()
        await self._engine.close()
        self._prep.shutdown(wait=False)

    async def restart(self) -> ReadyInfo:
        return await self._engine.restart()

    @property
    def healthy(self) -> bool:
        return self._engine.healthy

    @property
    def worker_pid(self) -> int | None:
        return self._engine.worker_pid

    @property
    def ready_info(self) -> ReadyInfo | None:
        return self._engine.ready_info

    @property
    def records(self) -> dict[str, RequestRecord]:
        return self._engine.records

    @property
    def tokenizer(self):
        return self._engine.frontend.tokenizer

    # -- sessions ------------------------------------------------------------

    def open_session(self) -> Session:
        session = Session(f"s{next(self._session_ids)}", self._engine_id)
        self._sessions[session.session_id] = set()
        return session

    def close_session(self, session_id: str) -> list[str]:
        """Close a session; its unfinished requests are cancelled. Returns their ids."""
        rids = self._sessions.pop(session_id, None)
        if rids is None:
            raise StaleSessionError(f"session {session_id!r} is not open on this engine")
        unfinished = [r for r in rids if not self._engine.records[r].finished]
        for rid in unfinished:
            self._engine.cancel_nowait(rid)
        return unfinished

    def _check_session(self, session: Session) -> None:
        if not isinstance(session, Session) or session.engine_id != self._engine_id:
            raise StaleSessionError("this session handle belongs to another engine; open a session on this one")
        if session.session_id not in self._sessions:
            raise StaleSessionError(
                f"session {session.session_id!r} is closed (a stale handle or a copy of a closed one); "
                f"call open_session() for a new one"
            )

    # -- requests ------------------------------------------------------------

    async def submit(
        self,
        session: Session,
        prompt: str | list[int] | list[dict[str, Any]],
        max_tokens: int | None = 128,
        temperature: float = 0.0,
        ignore_eos: bool = False,
        max_chunks: int | None = None,
        request_id: str | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> tuple[str, RequestStream]:
        """Start a request; returns its id and its event stream.

        ``prompt`` is text, token ids, or chat messages (rendered with the
        model's chat template; a multimodal model's may hold media parts,
        prepared on a thread so that other requests keep streaming). At most
        ``max_chunks`` undelivered events are buffered; generation of this
        request waits for its consumer beyond that. A stream let go unfinished
        (a consumer task cancelled, a loop broken off) cancels its request.
        """
        self._check_session(session)
        frontend = self._engine.frontend
        slots = None
        try:
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
                loop = asyncio.get_running_loop()
                chat = await loop.run_in_executor(self._prep, lambda: frontend.render_chat(prompt, mm_processor_kwargs))
                if chat.parts:  # room in the worker before the media are decoded (engine/media_gate.py)
                    slots = await self._engine.media_gate.acquire(1)
                    self._check_session(session)  # closed while it waited
                load = frontend.load_media
                prepared = await loop.run_in_executor(self._prep, load, chat) if chat.parts else load(chat)
                self._check_session(session)  # closed while the prompt was prepared
            elif isinstance(prompt, (str, list)):
                prepared = frontend.prepare(prompt)
            else:
                raise InvalidRequestError(f"prompt must be text, token ids or chat messages, not {type(prompt).__name__}")
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos, **sampling)
            if params.n != 1:
                raise InvalidRequestError(f"submit runs one sample (a stream is one sample), not n={params.n}: submit "
                                          "once per sample, with seed, seed + 1, ... for distinct reproducible ones")
            stream = self._engine.add_request(prepared, params, request_id, max_chunks, session.session_id, slots)
        finally:
            if slots is not None:
                slots.release()  # the one not taken by a request that failed to start
        self._sessions[session.session_id].add(stream.request_id)
        return stream.request_id, stream

    async def cancel(self, request_id: str) -> dict[str, Any]:
        """Cancel a request. After this returns, no further token event is delivered for it."""
        return await self._engine.abort(request_id)
