"""The two Qwen3-TTS stage executors.

``qwen3_tts_talker`` (kind ``ar``): text in (``text/1``, the request's
``voice``/``language``/sampling in its stage params), codec frames out as
``codec_codes/1`` chunks ([frames, 16] int64): the first chunk after
``first_chunk_frames`` frames (time to first audio), then every
``chunk_frames``, the remainder at the end. Its requests are batched by
``TalkerEngine`` on the engine's scheduler and paged KV cache.

``qwen3_tts_code2wav`` (kind ``generation``): ``codec_codes/1`` in,
``pcm_audio/1`` out (24 kHz mono float32), decoding the frames that have
arrived per request and step, in pieces of a few lengths (powers of two up
to ``max_chunk_frames``: planning.decode_lengths). By default each
stream carries its decoder state, so every frame is decoded once and the
chunks join exactly as one whole-utterance decode; ``left_context_frames: N``
instead re-decodes the last N frames before each chunk (the reference's
method: cheaper state, approximate joins).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from pydantic import Field

from edge_infer.memory.measure import malloc_trim, rss_anon_bytes
from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.executors import ExecutorOptions, FrameQueue, ReservationPlan, StageExecutor, StageRequestError, StepOutput
from edge_infer.tts.params import SpeechParams
from edge_infer.tts.planning import (
    code2wav_reservation, code2wav_settings, decode_piece, stage_threads, talker_engine_config, talker_reservation,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from edge_infer.runtime.config import StageConfig


class TalkerOptions(ExecutorOptions):
    chunk_frames: int = Field(default=4, ge=1)
    first_chunk_frames: int = Field(default=1, ge=1)
    num_threads: int | None = Field(default=None, ge=1)
    # Threads of steps without prompt tokens; unset: half the cores, at most num_threads.
    decode_threads: int | None = Field(default=None, ge=1)


@dataclass
class _TalkerRequest:
    params: dict[str, Any]
    text: list[str] = field(default_factory=list)
    frames: list["torch.Tensor"] = field(default_factory=list)  # produced, not yet sent
    sent: int = 0  # frames sent so far


class TalkerExecutor(StageExecutor):
    kinds = frozenset({"ar"})
    input_contracts = frozenset({"text/1"})
    output_contracts = frozenset({"codec_codes/1"})
    Options = TalkerOptions
    requires_model = True
    param_names = frozenset(SpeechParams.model_fields)

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        opts = cls.options(stage)
        return talker_reservation(stage, max(opts.chunk_frames, opts.first_chunk_frames))

    def start(self, stage: StageConfig) -> None:
        import torch

        from edge_infer.models.qwen3_tts.config import load_code2wav_config, load_generation_defaults
        from edge_infer.models.qwen3_tts.tokenizer import TextTokenizer
        from edge_infer.tts.talker_engine import load_talker_engine

        self.torch = torch
        self.opts: TalkerOptions = self.options(stage)
        # Prompts (and loading) on every core; frame steps on half of them, beside Code2Wav on the other half.
        prefill = stage_threads(self.opts.num_threads, share=1)
        torch.set_num_threads(prefill)
        engine_config = talker_engine_config(stage)
        self.engine = load_talker_engine(engine_config)
        self.engine.set_threads(prefill, self.opts.decode_threads or min(prefill, stage_threads(None, share=2)))
        self.tokenizer = TextTokenizer.from_dir(engine_config.model)
        self.defaults = load_generation_defaults(engine_config.model)
        talker = self.engine.config.talker
        codec = load_code2wav_config(engine_config.model)
        self.metadata = {"num_codebooks": talker.num_code_groups, "frame_rate_hz": codec.frame_rate,
                         "codebook_size": talker.code_predictor.codebook_size}
        self.requests: dict[str, _TalkerRequest] = {}

    def submit(self, request_id: str, params: dict[str, Any]) -> None:
        self.requests[request_id] = _TalkerRequest(params)

    def feed(self, request_id: str, payload: Payload) -> None:
        self.requests[request_id].text.append(str(payload.data))

    def end_input(self, request_id: str) -> None:
        from edge_infer.errors import InvalidRequestError
        from edge_infer.models.qwen3_tts.prompt import VoiceRequest

        req = self.requests[request_id]
        text = "".join(req.text)
        try:
            params = SpeechParams.parse(req.params)
            if not text.strip():
                raise ValueError("the text to speak is empty")
            voice = params.voice or ""
            if voice.lower() not in self.engine.config.talker.speakers:
                raise ValueError(f"unknown voice {voice!r}; this checkpoint has: {', '.join(sorted(self.engine.config.talker.speakers))}")
            if params.instruct and self.engine.config.model_size == "0b6":
                raise ValueError("the 0.6B CustomVoice checkpoints do not take style instructions; drop instruct")
            request = VoiceRequest(
                input_ids=self.tokenizer.assistant_ids(text), speaker=voice, language=params.language,
                instruct_ids=self.tokenizer.instruct_ids(params.instruct) if params.instruct else None,
            )
            generator = self.torch.Generator().manual_seed(params.seed) if params.seed is not None else None
            self.engine.add(request_id, request, params.sampling(self.defaults), generator)
        except (ValueError, InvalidRequestError) as exc:
            raise StageRequestError(request_id, str(exc)) from None

    def has_work(self) -> bool:
        return self.engine.has_work()

    def _chunk(self, req: _TalkerRequest) -> Payload:
        frames = self.torch.stack(req.frames).numpy()
        req.sent += len(req.frames)
        req.frames = []
        return Payload("codec_codes/1", frames, dict(self.metadata))

    def step(self) -> list[StepOutput]:
        out = []
        for event in self.engine.step():
            req = self.requests.get(event.request_id)
            if req is None:
                continue
            if event.error is not None:
                del self.requests[event.request_id]
                out.append(StepOutput(event.request_id, None, finished=True, error=event.error))
                continue
            if event.frame is not None:
                req.frames.append(event.frame)
            target = self.opts.first_chunk_frames if req.sent == 0 else self.opts.chunk_frames
            if event.finished:
                del self.requests[event.request_id]
                out.append(StepOutput(event.request_id, self._chunk(req) if req.frames else None, finished=True))
            elif len(req.frames) >= target:
                out.append(StepOutput(event.request_id, self._chunk(req)))
        return out

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.engine.abort(request_id)


class Code2WavOptions(ExecutorOptions):
    max_chunk_frames: int = Field(default=8, ge=1)
    left_context_frames: int | None = Field(default=None, ge=0)
    num_threads: int | None = Field(default=None, ge=1)


@dataclass
class _Stream:
    decode: Callable[["torch.Tensor"], "torch.Tensor"]  # frames [n, Q] -> PCM, continuing this stream
    frames: FrameQueue = field(default_factory=FrameQueue)


class Code2WavExecutor(StageExecutor):
    kinds = frozenset({"generation"})
    input_contracts = frozenset({"codec_codes/1"})
    output_contracts = frozenset({"pcm_audio/1"})
    Options = Code2WavOptions
    requires_model = True

    @classmethod
    def plan(cls, stage: StageConfig) -> ReservationPlan:
        opts = cls.options(stage)
        return code2wav_reservation(stage, opts.max_chunk_frames, opts.left_context_frames)

    def start(self, stage: StageConfig) -> None:
        import torch

        from edge_infer.models.loader import TORCH_DTYPES
        from edge_infer.models.qwen3_tts.code2wav import StreamingDecoder, load_code2wav
        from edge_infer.models.qwen3_tts.config import load_code2wav_config
        from edge_infer.quant.native import vector_variant

        self.torch = torch
        self.opts: Code2WavOptions = self.options(stage)
        torch.set_num_threads(stage_threads(self.opts.num_threads, share=2))
        settings = code2wav_settings(stage)
        self.config = load_code2wav_config(settings.model)
        self.model = load_code2wav(settings.model, self.config, TORCH_DTYPES[settings.dtype], vector_variant())
        self.StreamingDecoder = StreamingDecoder
        self.metadata = {"sample_rate": self.config.sample_rate, "channels": 1}
        self.streams: dict[str, _Stream] = {}
        # A busy stage never idles, so the worker's trim never comes: glibc's freed blocks of past decodes'
        # sizes then took a 0.6B-shape fp32 Code2Wav 22-69 MiB past its plan. Trim once another decode's
        # activations might not fit under the plan any more.
        plan = self.plan(stage)
        self.trim_above = plan.weights_bytes + plan.kv_bytes + plan.runtime_bytes

    def submit(self, request_id: str, params: dict[str, Any]) -> None:
        context = self.opts.left_context_frames
        if context is None:
            decode = functools.partial(self.model, state=self.model.new_state())
        else:
            decode = self.StreamingDecoder(self.model, context).push
        self.streams[request_id] = _Stream(decode)

    def feed(self, request_id: str, payload: Payload) -> None:
        codes = np.asarray(payload.data).astype(np.int64, copy=False)
        expected = self.config.num_quantizers
        if codes.shape[1] != expected:
            raise StageRequestError(request_id, f"codes have {codes.shape[1]} codebooks, this Code2Wav decodes {expected}")
        if codes.size and int(codes.max()) >= self.config.codebook_size:
            raise StageRequestError(request_id, f"code {int(codes.max())} is outside the codebooks' {self.config.codebook_size} entries")
        if len(codes):
            stream = self.streams[request_id]
            stream.frames.put(codes)

    def end_input(self, request_id: str) -> None:
        self.streams[request_id].frames.ended = True

    def has_work(self) -> bool:
        return any(s.frames.count or s.frames.ended for s in self.streams.values())

    def step(self) -> list[StepOutput]:
        out = []
        for rid, stream in list(self.streams.items()):
            if not (stream.frames.count or stream.frames.ended):
                continue
            payload = None
            if stream.frames.count:
                frames = stream.frames.take(decode_piece(stream.frames.count, self.opts.max_chunk_frames))
                pcm = stream.decode(self.torch.from_numpy(frames))
                payload = Payload("pcm_audio/1", pcm.float().numpy(), dict(self.metadata))
            finished = stream.frames.ended and stream.frames.count == 0
            out.append(StepOutput(rid, payload, finished=finished))
            if finished:
                del self.streams[rid]
        if rss_anon_bytes() > self.trim_above:
            malloc_trim()
        return out

    def abort(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
