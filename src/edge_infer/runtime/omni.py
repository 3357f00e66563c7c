"""``Omni`` and ``AsyncOmni``: the Python API of a multi-stage pipeline.

    speech = {"0": {"model": "path/to/qwen3-tts"}, "1": {"model": "path/to/qwen3-tts"}}
    async with AsyncOmni(deploy_config="qwen3_tts", stage_overrides=speech) as omni:
        async for out in omni.generate("hello", request_id="r1"):
            ...  # out.kind, out.stage_id, out.contract, out.payload, out.finished, out.metrics

    with Omni(deploy_config="text", stage_overrides={"0": {"model": "path/to/checkpoint"}}) as omni:
        results = omni.generate(["hello", "world"])

The deploy config is loaded and checked, and its memory plan admitted, in
the constructor, before any process starts. Stage processes are fresh
interpreters that never import the caller's ``__main__`` (``engine/child.py``),
so a script needs no ``if __name__ == "__main__":`` guard.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import secrets
import threading
import weakref
from typing import Any, AsyncIterator, Sequence

import numpy as np

from edge_infer.engine.media_gate import MediaGate
from edge_infer.engine.media_prompt import has_media_parts
from edge_infer.errors import StaleSessionError
from edge_infer.memory.device import MachineProfile
from edge_infer.memory.ledger import Reservation
from edge_infer.runtime.config import DeployConfig, load_deploy_config
from edge_infer.runtime.contracts import Payload, validate
from edge_infer.runtime.deploy_plan import DeployPlan, plan_deploy
from edge_infer.runtime.executors import executor_target, load_executor
from edge_infer.runtime.orchestrator import AbortReport, Orchestrator, PipelineHealth, RetirementReport
from edge_infer.runtime.outputs import OmniOutput, OmniRequestOutput

# str | token ids | np.ndarray | Payload | {"prompt": ...} | {"prompt_token_ids": [...]} | chat messages, as a list
# or {"messages": [...], "mm_processor_kwargs": {...}} (content parts may carry images, audio and video)
Prompt = Any


class DeployRefused(RuntimeError):
    """The deploy plan does not fit (or cannot be made); nothing was started."""

    def __init__(self, plan: DeployPlan):
        self.plan = plan
        super().__init__("deploy refused:\n" + "\n".join(f"  - {r}" for r in plan.reasons))


def is_messages(prompt: Any) -> bool:
    """Whether ``prompt`` is one conversation: a list of {role, content} messages."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) and "role" in m for m in prompt)


def prompt_payload(prompt: Prompt) -> Payload:
    """A prompt as a payload: text -> text/1, token ids -> token_ids/1, chat messages -> chat/1, a Payload as is."""
    if isinstance(prompt, Payload):
        payload = prompt
    elif isinstance(prompt, dict) and "messages" in prompt:
        options = {"mm_processor_kwargs": prompt["mm_processor_kwargs"]} if prompt.get("mm_processor_kwargs") else {}
        payload = Payload("chat/1", json.dumps(prompt["messages"]), options)
    elif is_messages(prompt):
        payload = Payload("chat/1", json.dumps(prompt))
    elif isinstance(prompt, str):
        payload = Payload("text/1", prompt)
    elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        payload = Payload("token_ids/1", np.asarray(prompt["prompt_token_ids"], dtype=np.int64).reshape(-1))
    elif isinstance(prompt, dict) and "prompt" in prompt:
        payload = Payload("text/1", prompt["prompt"])
    elif isinstance(prompt, (list, tuple, np.ndarray)) and np.asarray(prompt).dtype.kind in "iu":
        payload = Payload("token_ids/1", np.asarray(prompt, dtype=np.int64).reshape(-1))
    else:
        raise TypeError(f"cannot use a {type(prompt).__name__} as a prompt; pass text, token ids, {{'prompt_token_ids': [...]}}, "
                        "chat messages or a Payload")
    verdict = validate(payload)
    if not verdict.valid:
        raise ValueError(f"the prompt is not a valid {payload.contract} payload: {'; '.join(verdict.reasons)}")
    return payload


def _media_gate(config: DeployConfig) -> MediaGate | None:
    """Room for prompts with media (engine/media_gate.py): a text-engine stage plans media for its max_num_seqs
    sequences and prepares a chat prompt's media as it arrives, so a prompt with media enters the pipeline only
    when fewer than the smallest such stage's max_num_seqs are in it. None without a text-engine stage."""
    from edge_infer.runtime.text_executor import TextEngineExecutor

    seqs = [s.engine.max_num_seqs for s in config.stages
            if issubclass(load_executor(executor_target(s.executor)), TextEngineExecutor)]
    return MediaGate(min(seqs)) if seqs else None


def _carries_media(payload: Payload) -> bool:
    return payload.contract == "chat/1" and has_media_parts(json.loads(str(payload.data)))


def _params_dict(params: Any, names: frozenset[str] | None) -> dict[str, Any]:
    """One stage's entry of sampling_params_list as the dict its executor takes. A dict goes whole (the stage names a
    key it does not take). Of a parameter object (ours, vLLM's, a pydantic model) only what the caller set goes:
    the fields that differ from its class's defaults (pydantic's set fields), cut to the stage's ``names``, so the
    deploy config's default_sampling still holds for the rest (a SamplingParams' max_tokens of 16 used to cut the
    Talker's speech to 1.3 s)."""
    if params is None:
        return {}
    if isinstance(params, dict):
        return {k: v for k, v in params.items() if v is not None}
    if hasattr(params, "model_dump"):
        raw = params.model_dump(exclude_unset=True)
    else:
        raw = _object_fields(params, names)
        blank = _default_instance(type(params))
        raw = {k: v for k, v in raw.items() if not (hasattr(blank, k) and _same(getattr(blank, k), v))}
    return {k: v for k, v in raw.items() if v is not None and (names is None or k in names)}


def _object_fields(params: Any, names: frozenset[str] | None) -> dict[str, Any]:
    """A parameter object's fields as they are (not converted: a nested structured-output spec stays an object)."""
    if names is not None:
        return {k: getattr(params, k) for k in names if hasattr(params, k)}
    if dataclasses.is_dataclass(params):
        return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    if hasattr(params, "__struct_fields__"):  # msgspec structs (vLLM's SamplingParams)
        return {k: getattr(params, k) for k in params.__struct_fields__}
    return dict(vars(params))


def _default_instance(cls: type) -> Any:
    try:
        return cls()
    except Exception:  # a class whose construction needs arguments: every field counts as set
        return None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # arrays compare elementwise
        return False


class AsyncOmni:
    def __init__(
        self,
        deploy_config: str | os.PathLike[str] | DeployConfig,
        *,
        stage_overrides: str | dict[str, Any] | None = None,
        profile: str | os.PathLike[str] | MachineProfile | None = None,
        body_bytes_in_flight: int = 0,
        beside: Sequence[Reservation] = (),
    ):
        """``body_bytes_in_flight``: served over HTTP, the server's --max-body-bytes-in-flight, booked in the plan;
        ``beside``: what else this process holds (serve's text model beside a speech pipeline), booked too."""
        if isinstance(deploy_config, DeployConfig):
            if stage_overrides:
                raise ValueError("stage_overrides apply while loading a file; pass the deploy config as a path")
            self.config = deploy_config
        else:
            self.config = load_deploy_config(deploy_config, stage_overrides)
        self.plan = plan_deploy(self.config, profile, body_bytes_in_flight, beside)
        if not self.plan.admitted:
            raise DeployRefused(self.plan)
        self._sources = {sid: load_executor(executor_target(self.config.stage(sid).executor)).input_contracts for sid in self.config.source_stages}
        self._param_names = {s.stage_id: load_executor(executor_target(s.executor)).param_names for s in self.config.stages}
        self._media_gate = _media_gate(self.config)
        self._orchestrator: Orchestrator | None = None
        self._start_lock: asyncio.Lock | None = None
        self._shuts_down: weakref.finalize | None = None
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(3)

    @property
    def default_sampling_params_list(self) -> list[dict[str, Any]]:
        return [s.default_sampling.as_params() for s in self.config.stages]

    async def start(self) -> None:
        if self._orchestrator is not None:
            return
        self._start_lock = self._start_lock or asyncio.Lock()
        async with self._start_lock:
            if self._orchestrator is None:
                orchestrator = Orchestrator(self.config, self.plan)
                await orchestrator.start()
                self._orchestrator = orchestrator
                # one collected unshut shuts its pipeline down on its loop (its stages ran on until the program
                # ended); at exit they go with their parent at once, as they always did
                self._shuts_down = weakref.finalize(self, _shut_down_on, asyncio.get_running_loop(), orchestrator)
                self._shuts_down.atexit = False

    def _stage_params(self, sampling_params_list: Sequence[Any] | None) -> dict[int, dict[str, Any]]:
        stages = self.config.stages
        if sampling_params_list is not None and len(sampling_params_list) != len(stages):
            raise ValueError(f"sampling_params_list has {len(sampling_params_list)} entries; give one per stage ({len(stages)}, in stage_id order) or None")
        given = list(sampling_params_list) if sampling_params_list is not None else [None] * len(stages)
        return {s.stage_id: {**s.default_sampling.as_params(), **_params_dict(p, self._param_names[s.stage_id])}
                for s, p in zip(stages, given)}

    async def generate(
        self, prompt: Prompt, request_id: str | None = None, sampling_params_list: Sequence[Any] | None = None
    ) -> AsyncIterator[OmniOutput]:
        """Stream a request's outputs; the last event is ``finished``, ``aborted`` or ``error``.

        Leaving the loop early (``break``, cancellation) aborts the request.
        """
        payload = prompt_payload(prompt)
        for sid, accepted in self._sources.items():
            if payload.contract not in accepted:
                raise ValueError(f"stage {sid} takes the prompt and accepts {', '.join(sorted(accepted))}; the prompt is {payload.contract}")
        params = self._stage_params(sampling_params_list)
        await self.start()
        assert self._orchestrator is not None
        request_id = request_id or f"omni-{self._id_prefix}-{next(self._ids)}"
        room = await self._media_gate.acquire(1) if self._media_gate and _carries_media(payload) else None
        try:
            stream = self._orchestrator.submit(request_id, payload, params)
            try:
                async for event in stream:
                    yield event
            finally:
                if not stream.ended and not self._orchestrator.closed:
                    await self._orchestrator.abort(request_id)
        finally:
            if room is not None:
                room.release()

    async def abort(self, request_id: str) -> AbortReport:
        if self._orchestrator is None:
            return AbortReport(request_id, found=False)
        return await self._orchestrator.abort(request_id)

    async def retire_worker(self, stage_id: int, replace: bool = True, drain_timeout_s: float | None = None) -> RetirementReport:
        await self.start()
        assert self._orchestrator is not None
        return await self._orchestrator.retire_worker(stage_id, replace, drain_timeout_s)

    def health(self) -> PipelineHealth:
        if self._orchestrator is None:
            raise RuntimeError("the pipeline has not started; await start() or generate() first")
        return self._orchestrator.health()

    def worker_pids(self) -> dict[int, int | None]:
        """The process id of each stage's current worker (None when it has none)."""
        return {s.stage_id: s.pid for s in self.health().stages}

    async def shutdown(self) -> None:
        if self._orchestrator is not None:
            self._shuts_down.detach()
            await self._orchestrator.shutdown()

    async def __aenter__(self) -> "AsyncOmni":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()


class Omni:
    """The synchronous API: an ``AsyncOmni`` driven by a private event-loop thread.

    The stage processes are children of that thread (their parent-death
    signal is tied to it), so it lives until ``shutdown``, or until the Omni is
    collected unshut (it used to live, stages and all, until the program ended).
    """

    def __init__(
        self,
        deploy_config: str | os.PathLike[str] | DeployConfig,
        *,
        stage_overrides: str | dict[str, Any] | None = None,
        profile: str | os.PathLike[str] | MachineProfile | None = None,
    ):
        self._omni = AsyncOmni(deploy_config, stage_overrides=stage_overrides, profile=profile)
        self.config, self.plan = self._omni.config, self._omni.plan
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edge-infer-omni", daemon=True)
        self._thread.start()
        self._shuts_down = weakref.finalize(self, _shut_down, self._omni, self._loop, self._thread)
        self._shuts_down.atexit = False  # at exit the stages go with their parent thread, at once, as they always did
        try:
            self._call(self._omni.start())
        except BaseException:
            self._shuts_down.detach()
            self._close_loop()
            raise

    def _call(self, coro: Any) -> Any:
        if self._loop.is_closed():
            coro.close()
            raise StaleSessionError("this Omni is shut down; create a new one")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupt (Ctrl-C) here cancels the work on the loop: its requests are aborted
            raise

    @property
    def default_sampling_params_list(self) -> list[dict[str, Any]]:
        return self._omni.default_sampling_params_list

    def generate(self, prompts: Prompt | Sequence[Prompt], sampling_params_list: Sequence[Any] | None = None) -> list[OmniRequestOutput]:
        """Run prompts concurrently through the pipeline and collect each one's outputs."""
        many = (isinstance(prompts, (list, tuple)) and not all(isinstance(p, (int, np.integer)) for p in prompts)
                and not is_messages(prompts))
        batch = list(prompts) if many else [prompts]

        async def collect(prompt: Prompt) -> OmniRequestOutput:
            events = [e async for e in self._omni.generate(prompt, sampling_params_list=sampling_params_list)]
            last = events[-1]
            return OmniRequestOutput(last.request_id, last.kind, [e for e in events if e.kind == "output"], last.metrics, last.error)  # type: ignore[arg-type]

        async def run() -> list[OmniRequestOutput]:
            return list(await asyncio.gather(*(collect(p) for p in batch)))

        return self._call(run())

    def retire_worker(self, stage_id: int, replace: bool = True, drain_timeout_s: float | None = None) -> RetirementReport:
        return self._call(self._omni.retire_worker(stage_id, replace, drain_timeout_s))

    def health(self) -> PipelineHealth:
        return self._call(self._on_loop(self._omni.health))

    def worker_pids(self) -> dict[int, int | None]:
        return self._call(self._on_loop(self._omni.worker_pids))

    @staticmethod
    async def _on_loop(fn: Any) -> Any:
        return fn()  # read the orchestrator's state on its own thread

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def shutdown(self) -> None:
        if self._loop.is_closed():
            return
        self._shuts_down.detach()
        try:
            self._call(self._omni.shutdown())
        finally:
            self._close_loop()

    def __enter__(self) -> "Omni":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _shut_down_on(loop: asyncio.AbstractEventLoop, orchestrator: Orchestrator) -> None:
    """An AsyncOmni collected unshut: its orchestrator's shutdown, scheduled on its loop (from any thread)."""
    try:
        loop.call_soon_threadsafe(lambda: loop.create_task(orchestrator.shutdown()))
    except RuntimeError:  # the loop is closed: the stages went with it or go with their parent
        pass


def _shut_down(omni: AsyncOmni, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """An Omni collected unshut: its pipeline shut down on its loop, then the loop stopped."""
    if loop.is_closed():
        return
    if threading.current_thread() is thread:  # collected on its own loop, which cannot wait for itself
        asyncio.ensure_future(omni.shutdown(), loop=loop).add_done_callback(lambda _: loop.stop())
        return
    try:
        asyncio.run_coroutine_threadsafe(omni.shutdown(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()
