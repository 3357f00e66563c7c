"""The Talker engine: several TTS requests batched on the text engine's machinery.

A request is a sequence of Talker positions: its prompt (prefill embeddings
from ``build_prompt``), then one position per frame fed back. That is the
text engine's picture with embeddings in place of token ids, so the engine's
``Scheduler`` (continuous batching, chunked prefill, preempt-and-recompute),
its ``KVCache`` (one allocation from an exact byte budget) and
``prepare_step`` run it unchanged. Each step:

1. the scheduler picks the batch; ``prepare_step`` gives positions, cache
   slots and attention metadata; each span's input embeddings come from the
   prompt (positions < prompt length) or the request's frames so far;
2. the Talker's decoder runs over the paged cache; for every request whose
   last position was computed, the codec head gives the first code (the
   reference's rules: ``FrameSampler``), eos ends the request;
3. the code predictor fills the residual codes of all those frames in one
   batched pass.

A preempted request loses its blocks and is recomputed from its prompt and
its frames (their input embeddings are kept), so its codes do not change.
"""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field

import torch

from edge_infer.config import EngineConfig
from edge_infer.models.layers.kv_cache import KVCache, KVLayout
from edge_infer.engine.runner import prepare_step
from edge_infer.engine.sampling_params import SamplingParams as EngineSamplingParams
from edge_infer.engine.scheduler import Scheduler
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import InvalidRequestError
from edge_infer.models.qwen3_tts.config import Qwen3TTSConfig, SamplingParams
from edge_infer.models.qwen3_tts.prompt import TalkerPrompt, VoiceRequest, build_prompt
from edge_infer.models.qwen3_tts.talker import Talker
from edge_infer.tts.predictor import BatchedCodePredictor
from edge_infer.tts.sampler import FrameSampler

log = logging.getLogger(__name__)

# The scheduler carries text sampling settings on each sequence; the Talker samples with its own.
_SCHEDULER_ONLY = EngineSamplingParams(max_tokens=None)


@dataclass
class FrameEvent:
    """One request's progress in a step: a frame, its end, or both."""

    request_id: str
    frame: torch.Tensor | None  # LongTensor [num_code_groups]
    finished: bool = False
    finish_reason: str | None = None  # stop (eos) | length | error
    error: str | None = None


@dataclass
class _Request:
    seq: Sequence
    prompt: TalkerPrompt
    sampler: FrameSampler
    max_frames: int
    frame_inputs: list[torch.Tensor] = field(default_factory=list)  # Talker input of each frame fed back

    @property
    def prompt_len(self) -> int:
        return self.prompt.prefill.shape[0]


class TalkerEngine:
    def __init__(self, config: Qwen3TTSConfig, engine_config: EngineConfig, talker: Talker):
        self.config = config
        self.engine_config = engine_config
        self.talker = talker
        shape = config.talker.shape
        self.layout = KVLayout(shape.num_layers, shape.num_kv_heads, shape.head_dim, talker.dtype.itemsize, engine_config.block_size)
        self.cache = KVCache(self.layout, self.layout.blocks_for_budget(engine_config.kv_cache_memory_bytes), talker.dtype)
        self.scheduler = Scheduler(self.layout, self.cache.num_blocks, engine_config.max_num_seqs,
                                   engine_config.max_num_batched_tokens)
        self.predictor = BatchedCodePredictor(talker.predictor, engine_config.max_num_seqs, config.talker.num_code_groups)
        self.group = shape.num_heads // shape.num_kv_heads
        self.eos = config.talker.codec.eos
        self.requests: dict[str, _Request] = {}
        # Threads for steps with prompt tokens, and for steps that only generate frames (set_threads).
        self.prefill_threads = self.decode_threads = torch.get_num_threads()
        if self.capacity_tokens < engine_config.max_model_len:
            raise ValueError(
                f"kv_cache_memory_bytes={engine_config.kv_cache_memory_bytes} holds {self.capacity_tokens} Talker positions, "
                f"fewer than one max_model_len={engine_config.max_model_len} request; raise the budget to at least "
                f"{self.layout.blocks_for_tokens(engine_config.max_model_len) * self.layout.bytes_per_block} bytes or lower max_model_len"
            )

    def set_threads(self, prefill: int, decode: int) -> None:
        """A prompt is a matrix product worth every core; a frame step is a chain of matrix-vector
        products that mostly wait on memory and per-layer work, and shares the cores with Code2Wav."""
        self.prefill_threads, self.decode_threads = prefill, decode

    @property
    def capacity_tokens(self) -> int:
        return self.cache.num_blocks * self.layout.block_size

    # -- requests -------------------------------------------------------------

    def add(self, request_id: str, voice: VoiceRequest, params: SamplingParams,
            generator: torch.Generator | None = None) -> None:
        """Queue a request; a prompt that cannot be served raises ``InvalidRequestError``."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        try:
            with torch.inference_mode():
                prompt = build_prompt(self.talker, self.config, voice)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        length = prompt.prefill.shape[0]
        limit = self.engine_config.max_model_len
        if length >= limit:
            raise InvalidRequestError(
                f"the prompt takes {length} Talker positions, max_model_len is {limit}; shorten the text or raise max_model_len"
            )
        # A request ends with finish reason "length" at max_frames or at max_model_len, whichever comes first.
        max_frames = min(params.max_frames, limit - length)
        seq = Sequence(request_id=request_id, prompt_token_ids=[0] * length, params=_SCHEDULER_ONLY)
        self.requests[request_id] = _Request(seq, prompt, FrameSampler(self.config.talker, params, generator), max_frames)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.finish(req.seq, "abort")
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_schedulable()

    # -- the loop ------------------------------------------------------------

    def _inputs(self, req: _Request, start: int, end: int) -> torch.Tensor:
        """Input embeddings of positions ``start .. end - 1``: prompt rows, then fed-back frames."""
        length = req.prompt_len
        parts = []
        if start < length:
            parts.append(req.prompt.prefill[start:min(end, length)])
        if end > length:
            parts.append(torch.stack(req.frame_inputs[max(start, length) - length:end - length]))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    @torch.inference_mode()
    def step(self) -> list[FrameEvent]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        try:
            return self._run(batch)
        except Exception as exc:  # keep serving: fail this batch's requests, not the engine
            log.error("Talker step failed:\n%s", traceback.format_exc())
            return [self._fail(item.seq.request_id, f"Talker step failed: {type(exc).__name__}: {exc}") for item in batch]

    def _run(self, batch: list) -> list[FrameEvent]:
        step = prepare_step(batch, self.layout.block_size, self.group, None)
        prefill = any(start < self.requests[item.seq.request_id].prompt_len for item, start, _ in step.spans)
        threads = self.prefill_threads if prefill else self.decode_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        x = torch.cat([self._inputs(self.requests[item.seq.request_id], start, end) for item, start, end in step.spans])
        hidden = self.talker.decoder.run_layers(x, step.positions, step.meta, self.cache)
        for item in batch:
            item.seq.num_computed += item.num_new
        if not step.sampling:
            return []
        normed, logits = self.talker.decoder.head(hidden.index_select(0, step.output_rows))
        events: list[FrameEvent] = []
        going: list[tuple[_Request, int, int]] = []  # (request, row, first code)
        for row, item in enumerate(step.sampling):
            req = self.requests[item.seq.request_id]
            first = req.sampler.first_code(logits[row])
            if first == self.eos:
                events.append(self._finish(req, None, "stop"))
            else:
                going.append((req, row, first))
        if going:
            rows = torch.tensor([row for _, row, _ in going], dtype=torch.long)
            firsts = torch.tensor([first for _, _, first in going], dtype=torch.long)
            residual = self.predictor.predict(
                normed.index_select(0, rows), self.talker.embed_codec(firsts),
                [req.sampler.residual_code for req, _, _ in going],
            )
            for (req, _, first), codes in zip(going, residual):
                events.append(self._append(req, torch.tensor([first] + codes, dtype=torch.long)))
        return events

    def _append(self, req: _Request, frame: torch.Tensor) -> FrameEvent:
        index = len(req.frame_inputs)
        req.frame_inputs.append(self.talker.embed_frame(frame) + req.prompt.text_for_step(index))
        req.seq.output_token_ids.append(int(frame[0]))
        if len(req.frame_inputs) >= req.max_frames:
            return self._finish(req, frame, "length")
        return FrameEvent(req.seq.request_id, frame)

    def _finish(self, req: _Request, frame: torch.Tensor | None, reason: str) -> FrameEvent:
        self.scheduler.finish(req.seq, reason)
        del self.requests[req.seq.request_id]
        return FrameEvent(req.seq.request_id, frame, finished=True, finish_reason=reason)

    def _fail(self, request_id: str, message: str) -> FrameEvent:
        req = self.requests.pop(request_id, None)
        if req is not None:
            self.scheduler.finish(req.seq, "error")
        return FrameEvent(request_id, None, finished=True, finish_reason="error", error=message)


def load_talker(engine_config: EngineConfig, config: Qwen3TTSConfig) -> Talker:
    """Build and fill the Talker's decoders (through the engine's loader and weight kernels) and its text side."""
    from edge_infer.engine.core import linear_installer
    from edge_infer.memory.measure import malloc_trim
    from edge_infer.models.checkpoint import read_tensor_index
    from edge_infer.models.loader import TORCH_DTYPES, load_module, load_weights
    from edge_infer.models.qwen3_tts.talker import PredictorDecoder, TalkerDecoder, TextSide
    from edge_infer.models.qwen3_tts.talker_weights import predictor_decoder_config, talker_decoder_config, text_side_shapes

    e, talker = engine_config, config.talker
    dtype = TORCH_DTYPES[e.dtype]
    decoder = TalkerDecoder(talker_decoder_config(config, e.max_model_len, e.dtype), e.max_model_len)
    predictor = PredictorDecoder(predictor_decoder_config(config, e.dtype), talker.shape.hidden_size, talker.num_code_groups)
    for model in (decoder, predictor):
        load_weights(model, e.model, dtype, linear_installer(e), release=malloc_trim)
        if e.quant is not None:
            from edge_infer.quant.fused_decode import offer

            offer(model, e.quant)
    # Everything else in model.safetensors belongs to the decoders (or to voice cloning's speaker encoder).
    text_side = text_side_shapes(config)
    others = tuple(name for name in read_tensor_index(e.model) if name not in text_side)
    text = load_module(lambda: TextSide(config), e.model, dtype, prefix="talker.", ignore=others)
    return Talker(config, decoder.eval(), predictor.eval(), text)


def load_talker_engine(engine_config: EngineConfig) -> TalkerEngine:
    """Load ``engine_config.model``'s Talker and build the engine."""
    from edge_infer.models.qwen3_tts.config import load_config

    config = load_config(engine_config.model)
    return TalkerEngine(config, engine_config, load_talker(engine_config, config))
