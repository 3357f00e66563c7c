"""The text engine as an ``ar`` stage: a real checkpoint behind the stage protocol.

The stage process runs an ``EngineCore`` in-process (one process per stage,
no engine worker beside it) and steps it from ``step()``. Input is
``text/1`` (tokenized, or rendered as a user message with the chat template
when ``chat: true``), ``token_ids/1``, or ``chat/1``: a whole conversation,
prepared as every frontend prepares one (``Frontend.prepare_chat``: a
multimodal thinker's image, audio and video parts read under the stage's
media options, decoded and placed). A thinker fed by an encoder stage
(runtime/encoder_executor.py) gets the prepared prompt as ``token_ids/1``,
its M-RoPE positions as ``mrope_positions/1`` and each media item's
embeddings as ``hidden_states/1`` (runtime/media_io.py); it then loads no
towers (``load_encoders``, false by default when a ``hidden_states/1`` route
comes in) and its reservation holds none. Output is one ``token_ids/1`` chunk
per generated token and, with ``emit_text``, the matching ``text/1`` chunk
(stop strings held back as in the text API). The reservation comes from the
same memory plan as ``edge-infer plan``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.errors import EdgeInferError, InvalidRequestError
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import ReservationPlan, StageExecutor, StageRequestError, StepOutput
from edge_infer.runtime.media_io import MediaSourceOptions, media_from_payload

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.engine.request_fold import RequestFold
    from edge_infer.memory.plan import TextPlan
    from edge_infer.runtime.config import StageConfig

# Text chunks are split to at most this many characters (4 UTF-8 bytes each at most).
MAX_TEXT_CHUNK_CHARS = 256


class TextEngineOptions(MediaSourceOptions):
    emit_text: bool = True
    chat: bool = False  # render text input as a user message with the checkpoint's chat template
    # A thinker's media towers: None (unset) loads them, unless a hidden_states/1 route comes in (an encoder
    # stage sends the embeddings), which sets it false when the deploy config is loaded.
    load_encoders: bool | None = None


@dataclass
class _Request:
    params: dict[str, Any]
    prompt_ids: list[int] = field(default_factory=list)
    media: list[Any] = field(default_factory=list)  # MediaInputs of a chat/1 prompt, or from an encoder stage
    mrope: tuple[np.ndarray, int] | None = None  # M-RoPE positions and delta an encoder stage sent
    fold: "RequestFold | None" = None


def _plan(stage: StageConfig) -> TextPlan:
    from edge_infer.memory.plan import plan_text_session

    e = stage.engine
    plan = plan_text_session(
        stage.model,
        max_model_len=e.max_model_len,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        kv_cache_memory_bytes=e.kv_cache_memory_bytes,
        quantization=e.quantization,
        priority=e.priority,
        dtype=e.dtype,
        encoder_quantization=e.encoder_quantization,
        media_limits=e.media_limits,
    )
    if TextEngineExecutor.options(stage).load_encoders is False and plan.engine_config is not None:
        plan.engine_config = replace(plan.engine_config, load_encoders=False, block_cache_bytes=0)
    return plan


class TextEngineExecutor(StageExecutor):
    kinds = frozenset({"ar"})
    input_contracts = frozenset({"text/1", "token_ids/1", "chat/1", "hidden_states/1", "mrope_positions/1"})
    output_contracts = frozenset({"token_ids/1", "text/1"})
    Options = TextEngineOptions
    requires_model = True
    param_names = frozenset(SamplingParams.field_names())

    @classmethod
    def pipeline_options(cls, stage: StageConfig, inputs: frozenset[str]) -> dict[str, Any]:
        # Media embeddings routed in: an encoder stage runs the towers, so this stage loads none.
        return {"load_encoders": False} if "hidden_states/1" in inputs else {}

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        from edge_infer.memory.plan import TOWER_ITEMS, WEIGHT_ITEMS

        plan = _plan(stage)
        items = plan.ledger_items()
        engine = plan.engine_config
        if engine is not None and not engine.load_encoders:  # an encoder stage runs the towers: none of theirs here
            items["weights_bytes"] -= plan.items_bytes(TOWER_ITEMS & WEIGHT_ITEMS)
            items["buffers_bytes"] -= plan.items_bytes(TOWER_ITEMS - WEIGHT_ITEMS)
        return ReservationPlan(**items, max_payload_bytes=4 * MAX_TEXT_CHUNK_CHARS)

    def start(self, stage: StageConfig) -> None:
        from edge_infer.engine.core import EngineCore
        from edge_infer.engine.frontend import Frontend

        self.opts: TextEngineOptions = self.options(stage)
        self.frontend = Frontend.from_plan(_plan(stage))  # raises PlanRefusedError when it does not fit
        self.frontend.media_policy = self.opts.media_policy()
        self.core = EngineCore(self.frontend.engine_config)
        self.requests: dict[str, _Request] = {}

    def submit(self, request_id: str, params: dict[str, Any]) -> None:
        self.requests[request_id] = _Request(params)

    def feed(self, request_id: str, payload: Payload) -> None:
        req = self.requests[request_id]
        try:
            if payload.contract == "chat/1":
                if req.prompt_ids:
                    raise StageRequestError(request_id, "a chat/1 prompt is a whole conversation; send it alone")
                prepared = self.frontend.prepare_chat(json.loads(str(payload.data)),
                                                      payload.metadata.get("mm_processor_kwargs"))
                req.prompt_ids, req.media = prepared.token_ids, prepared.media
            elif payload.contract == "text/1":
                text = str(payload.data)
                prepared = (
                    self.frontend.prepare_chat([{"role": "user", "content": text}])
                    if self.opts.chat and not req.prompt_ids
                    else self.frontend.prepare(text)
                )
                req.prompt_ids += prepared.token_ids
            elif payload.contract == "hidden_states/1":
                req.media.append(media_from_payload(payload))
            elif payload.contract == "mrope_positions/1":
                req.mrope = (np.asarray(payload.data, dtype=np.int64), int(payload.metadata["delta"]))
            else:
                req.prompt_ids += [int(t) for t in np.asarray(payload.data)]
        except EdgeInferError as exc:
            raise StageRequestError(request_id, str(exc)) from exc

    def end_input(self, request_id: str) -> None:
        from edge_infer.engine.frontend import PreparedPrompt
        from edge_infer.engine.request_fold import RequestFold

        req = self.requests[request_id]
        try:
            if unknown := sorted(set(req.params) - self.param_names):
                raise InvalidRequestError(f"unknown sampling parameter(s) {', '.join(unknown)} for a text stage; it "
                                          f"takes {', '.join(sorted(self.param_names))}")
            params = self.frontend.default_params(**req.params)
            if params.n != 1:  # a stage request is one sample (it silently gave one)
                raise InvalidRequestError(f"a text stage runs one sample per request, not n={params.n}: send the "
                                          "prompt once per sample (with seed, seed + 1, ... for reproducible ones)")
            engine_request = self.frontend.request(request_id, PreparedPrompt(None, req.prompt_ids, req.media), params)
        except EdgeInferError as exc:
            raise StageRequestError(request_id, str(exc)) from exc
        if req.mrope is not None and not _same_positions(req.mrope, engine_request):
            raise StageRequestError(request_id, "the M-RoPE positions sent with the prompt differ from those its media "
                                                "give here: do the encoder stage and this one hold the same checkpoint?")
        req.fold = RequestFold.start(self.frontend.tokenizer, engine_request.params)
        req.media = []  # the core holds them until it encodes them (then their embeddings only)
        problem = self.core.add_request(engine_request)
        if problem is not None:
            raise StageRequestError(request_id, problem.error)

    def has_work(self) -> bool:
        return self.core.has_work()

    def step(self) -> list[StepOutput]:
        out: list[StepOutput] = []
        for delta in self.core.step():
            req = self.requests.get(delta.request_id)
            if req is None or req.fold is None:
                continue
            step = req.fold.apply(delta)
            if step.error:
                del self.requests[delta.request_id]
                out.append(StepOutput(delta.request_id, None, finished=True, error=step.error))
                continue
            chunks = []
            if step.token_ids:
                chunks.append(Payload("token_ids/1", np.asarray(step.token_ids, dtype=np.int64)))
            if self.opts.emit_text:
                text = step.text
                chunks += [Payload("text/1", text[i : i + MAX_TEXT_CHUNK_CHARS]) for i in range(0, len(text), MAX_TEXT_CHUNK_CHARS)]
            if step.finished:
                if step.abort_in_core:
                    self.core.abort([delta.request_id])
                del self.requests[delta.request_id]
            for i, chunk in enumerate(chunks):
                out.append(StepOutput(delta.request_id, chunk, finished=step.finished and i == len(chunks) - 1))
            if step.finished and not chunks:
                out.append(StepOutput(delta.request_id, None, finished=True))
        return out

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.core.abort([request_id])


def _same_positions(sent: tuple[np.ndarray, int], request: Any) -> bool:
    """Whether the positions an encoder stage sent are those this stage derives from the items' placement."""
    positions, delta = sent
    return (request.mrope_positions is not None and delta == request.mrope_delta
            and np.array_equal(positions, request.mrope_positions))
