"""A thinker's media towers as a stage of their own: chat/1 prompts in, a prepared prompt and embeddings out.

The stage takes a thinker checkpoint (``model:``, Qwen2.5-VL or Qwen2.5-Omni)
and loads its towers alone (models/encoders.py), without the decoder. Each
``chat/1`` prompt is prepared as every frontend prepares one
(``Frontend.prepare_chat`` and ``Frontend.request``: the media policy of the
stage's options, the request limits, placeholders repeated per embedding row,
the checks, the M-RoPE positions), then sent on in production order:

    token_ids/1        the prompt, placeholders expanded
    mrope_positions/1  its positions [3, tokens] and delta (only when it has media)
    hidden_states/1    one per media item, in prompt order: float32 [tokens, hidden], placed by its metadata
                       (runtime/media_io.py)

A thinker stage (``executor: text``) downstream places the embeddings as its
own towers' would have been placed, so the tokens are those of the thinker
in one process. One request is worked on at a time, one step per
preparation and per item, so aborts and new requests are read in between. A
request whose media cannot be read or encoded fails with the reason; the
stage keeps serving. ``engine.quantization`` is the towers' weight path
(none, cpu_int4, cpu_w4a16, cpu_w4a8, cpu_w8a8: ``--encoder-quantization``), and
``engine.max_model_len`` should be the thinker stage's: the request limits
and the prompt check follow it.
"""
from __future__ import annotations

import json
import logging
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from pydantic import Field

from edge_infer.errors import CheckpointError, EdgeInferError, PlanRefusedError
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import ReservationPlan, StageExecutor, StageRequestError, StepOutput
from edge_infer.runtime.media_io import MediaSourceOptions, media_payload

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.engine.protocol import MediaInput
    from edge_infer.memory.plan import TextPlan
    from edge_infer.runtime.config import StageConfig

log = logging.getLogger(__name__)

# The preparation path's plan resolves settings (dtype, context, limits, kernels) for this stage; what the stage
# holds is booked by plan() in the deploy plan's ledger, so memory does not refuse it here.
_SETTINGS_ONLY_BYTES = 1 << 62


class MediaEncoderOptions(MediaSourceOptions):
    num_threads: int | None = Field(None, ge=1)  # the towers' threads; default every core this process may use


@dataclass
class _Request:
    prompt: Payload | None = None  # the chat/1 prompt
    ended: bool = False
    prepared: bool = False
    pending: deque["MediaInput"] = field(default_factory=deque)  # items still to encode, in prompt order


def _plan(stage: StageConfig) -> TextPlan:
    """The thinker's plan for this stage's settings, with the towers' weight path (engine.quantization)."""
    from edge_infer.memory.plan import plan_text_session

    e = stage.engine
    plan = plan_text_session(stage.model, max_model_len=e.max_model_len, max_num_seqs=1, dtype=e.dtype,
                             available_bytes=_SETTINGS_ONLY_BYTES, encoder_quantization=e.quantization,
                             media_limits=e.media_limits)
    if plan.model_config.multimodal is None:
        raise CheckpointError(f"{stage.model} holds a text model ({plan.model_config.architecture}): it has no media "
                              "encoders; the media_encoder stage takes a Qwen2.5-VL or Qwen2.5-Omni thinker")
    if not plan.admitted:
        raise PlanRefusedError("; ".join(plan.reasons), plan)
    return plan


class MediaEncoderExecutor(StageExecutor):
    kinds = frozenset({"generation"})
    input_contracts = frozenset({"chat/1"})
    output_contracts = frozenset({"token_ids/1", "mrope_positions/1", "hidden_states/1"})
    Options = MediaEncoderOptions
    requires_model = True

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        from edge_infer.memory.plan import TOWER_ITEMS, WEIGHT_ITEMS

        plan = _plan(stage)  # one sequence: "sequence media" is one request's inputs and embeddings
        hidden = plan.model_config.hidden_size
        return ReservationPlan(
            weights_bytes=plan.items_bytes(TOWER_ITEMS & WEIGHT_ITEMS),
            buffers_bytes=plan.items_bytes(TOWER_ITEMS - WEIGHT_ITEMS) + plan.item("sequence media"),
            runtime_bytes=plan.item("runtime overhead"),
            # An item's rows are placeholders of a prompt shorter than max_model_len (float32); the prompt's ids
            # and positions are smaller.
            max_payload_bytes=plan.engine_config.max_model_len * max(4 * hidden, 3 * 8),
        )

    def start(self, stage: StageConfig) -> None:
        from edge_infer.engine.core import configure_threads, tower_installer
        from edge_infer.engine.frontend import Frontend
        from edge_infer.memory.measure import malloc_trim
        from edge_infer.models.encoders import load_encoders
        from edge_infer.models.loader import TORCH_DTYPES
        from edge_infer.models.multimodal import encode_item, tower_encoders
        from edge_infer.quant.native import enable_native_ops

        opts: MediaEncoderOptions = self.options(stage)
        self.frontend = Frontend.from_plan(_plan(stage))
        self.frontend.media_policy = opts.media_policy()
        config, cfg = self.frontend.engine_config, self.frontend.plan.model_config
        configure_threads(opts.num_threads)
        dtype = TORCH_DTYPES[config.dtype]
        enable_native_ops(dtype)
        encoders = tower_encoders(*load_encoders(config.model, dtype, tower_installer(config), release=malloc_trim))
        self.encode: Callable[[str, Any], Any] = lambda kind, features: encode_item(
            encoders, kind, features, cfg.hidden_size, dtype, cfg.architecture)
        self.requests: dict[str, _Request] = {}

    def submit(self, request_id: str, params: dict[str, Any]) -> None:
        self.requests[request_id] = _Request()

    def feed(self, request_id: str, payload: Payload) -> None:
        req = self.requests[request_id]
        if req.prompt is not None:
            raise StageRequestError(request_id, "a chat/1 prompt is a whole conversation; send it alone")
        req.prompt = payload

    def end_input(self, request_id: str) -> None:
        req = self.requests[request_id]
        if req.prompt is None:
            raise StageRequestError(request_id, "no chat/1 prompt reached the encoder stage")
        req.ended = True

    def has_work(self) -> bool:
        return any(req.ended for req in self.requests.values())

    def step(self) -> list[StepOutput]:
        request_id, req = next((rid, r) for rid, r in self.requests.items() if r.ended)
        try:
            out = self._advance(request_id, req)
        except Exception as exc:  # noqa: BLE001 - bad media or a failing encode ends this request, not the stage
            if not isinstance(exc, EdgeInferError):
                log.error("encoder stage: %s failed:\n%s", request_id, traceback.format_exc())
            del self.requests[request_id]
            return [StepOutput(request_id, None, finished=True, error=str(exc) if isinstance(exc, EdgeInferError)
                               else f"encoding its media failed: {type(exc).__name__}: {exc}")]
        if out[-1].finished:
            del self.requests[request_id]
        return out

    def _advance(self, request_id: str, req: _Request) -> list[StepOutput]:
        """The request's next piece of work: its preparation, or its next item's encoding."""
        if not req.prepared:
            return self._prepare(request_id, req)
        item = req.pending.popleft()
        rows = self.encode(item.kind, item.features)
        payload = media_payload(item, np.ascontiguousarray(rows.float().numpy()))
        return [StepOutput(request_id, payload, finished=not req.pending)]

    def _prepare(self, request_id: str, req: _Request) -> list[StepOutput]:
        """Read, decode and place the media (the frontends' path); the prompt and its positions go out at once."""
        prompt = req.prompt
        prepared = self.frontend.prepare_chat(json.loads(str(prompt.data)), prompt.metadata.get("mm_processor_kwargs"))
        # One token to generate: the prompt must leave room for it (the thinker checks its own parameters).
        request = self.frontend.request(request_id, prepared, self.frontend.default_params(max_tokens=1))
        req.prepared, req.pending = True, deque(request.media)
        out = [Payload("token_ids/1", np.asarray(request.prompt_token_ids, dtype=np.int64),
                       {"vocab_size": self.frontend.vocab_size})]
        if request.media:
            out.append(Payload("mrope_positions/1", np.asarray(request.mrope_positions, dtype=np.int64),
                               {"delta": int(request.mrope_delta)}))
        return [StepOutput(request_id, p, finished=not req.pending and i == len(out) - 1) for i, p in enumerate(out)]

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
