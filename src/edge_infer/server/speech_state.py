"""What a speech server knows: its pipeline, the checkpoint's voices, settings, phase and live requests.

Requests are checked here before they reach the pipeline (voice, language,
format, speed, input length in characters and in Talker positions), so a
request the pipeline would refuse is a 400 naming the field. Phases as in
the text server: ``loading`` (503), ``ready``, ``failed``, ``draining``.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from edge_infer.models.qwen3_tts.config import load_config
from edge_infer.models.qwen3_tts.prompt import VoiceRequest, prompt_length, resolve_language
from edge_infer.models.qwen3_tts.tokenizer import TextTokenizer
from edge_infer.runtime.omni import AsyncOmni
from edge_infer.server.errors import APIError
from edge_infer.server.speech_metrics import SpeechMetrics
from edge_infer.server.speech_protocol import SpeechRequest, VoiceCard, VoiceList
from edge_infer.server.state import RETRY_AFTER_S, Admission, ServeSettings
from edge_infer.tts.audio import FORMATS, STREAMABLE
from edge_infer.tts.deploy import SpeechPipeline
from edge_infer.tts.params import SpeechParams
from edge_infer.tts.planning import DEFAULT_MAX_MODEL_LEN

if TYPE_CHECKING:
    from edge_infer.server.serving_speech import SpeechRun

# OpenAI's limit for /v1/audio/speech.
DEFAULT_MAX_INPUT_CHARS = 4096
_POLL_S = 0.05
_SAMPLING_FIELDS = ("seed", "temperature", "top_k", "top_p", "repetition_penalty", "max_tokens")


@dataclass(frozen=True)
class SpeechJob:
    text: str
    params: dict[str, Any]  # the Talker stage's parameters (SpeechParams)
    response_format: str
    stream_format: str
    input_tokens: int


class SpeechServerState:
    def __init__(self, pipeline: SpeechPipeline, settings: ServeSettings, max_input_chars: int = DEFAULT_MAX_INPUT_CHARS):
        self.pipeline = pipeline
        self.settings = settings
        self.max_input_chars = max_input_chars
        self.omni = AsyncOmni(pipeline.config)  # plans the deploy: raises DeployRefused before anything starts
        talker = pipeline.config.stage(pipeline.talker_stage)
        self.config = load_config(pipeline.model)
        self.tokenizer = TextTokenizer.from_dir(pipeline.model)
        self.max_model_len = talker.engine.max_model_len or DEFAULT_MAX_MODEL_LEN
        self.max_num_seqs = talker.engine.max_num_seqs
        names = {s.stage_id: s.name or f"stage{s.stage_id}" for s in pipeline.config.stages}
        self.metrics = SpeechMetrics(self.omni.plan, names)
        self.created = int(time.time())
        self.phase = "loading"
        self.load_error: str | None = None
        self.in_flight = 0
        self.live: set["SpeechRun"] = set()

    @property
    def capacity(self) -> int:
        return self.max_num_seqs + self.settings.max_queue

    @property
    def voices(self) -> list[str]:
        return sorted(self.config.talker.speakers)

    def voice_list(self) -> VoiceList:
        talker = self.config.talker
        return VoiceList(
            data=[VoiceCard(id=v, dialect=talker.speaker_dialects.get(v)) for v in self.voices],
            languages=["auto"] + sorted(n for n in talker.languages if "dialect" not in n),
        )

    def healthy(self) -> bool:
        return self.omni.health().healthy

    # -- checks made before a request touches the pipeline ----------------------------

    def check_ready(self) -> None:
        if self.phase == "loading":
            raise APIError(503, "the model is still loading; retry when GET /health answers 200", code="loading",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        if self.phase == "draining":
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if self.phase == "failed":
            raise APIError(503, f"the model failed to load: {self.load_error}", code="engine_dead")
        down = [f"{s.label} is {s.state} ({s.detail})" for s in self.omni.health().stages if s.state != "running"]
        if down:
            raise APIError(503, f"a pipeline stage is down: {'; '.join(down)}; restart the server", code="engine_dead")

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.settings.served_model_name:
            raise APIError(400, f"model {name!r} is not served here; this server serves {self.settings.served_model_name!r} "
                           "(GET /v1/models)", param="model", code="model_not_found")

    def prepare(self, body: SpeechRequest) -> SpeechJob:
        if body.speed != 1.0:
            raise APIError(400, f"speed {body.speed:g} is not supported: Qwen3-TTS has no speaking-rate control and "
                           "resampling would shift the pitch; send speed 1.0 (or leave it out)", param="speed", code="unsupported_speed")
        fmt = body.response_format.lower()
        if fmt not in FORMATS:
            raise APIError(400, f"response_format {body.response_format!r} is not supported; use one of {', '.join(FORMATS)}",
                           param="response_format", code="unsupported_format")
        if body.stream_format == "sse" and fmt not in STREAMABLE:
            raise APIError(400, f"stream_format sse carries {' or '.join(STREAMABLE)} chunks, not {fmt}; "
                           "use stream_format audio for flac", param="stream_format")
        text = body.input
        if not text.strip():
            raise APIError(400, "input is empty: give the text to speak", param="input", code="empty_input")
        if len(text) > self.max_input_chars:
            raise APIError(400, f"input has {len(text)} characters; this server takes at most {self.max_input_chars} "
                           "(--max-input-chars); split the text", param="input", code="input_too_long")
        voice = body.voice.lower()
        if voice not in self.config.talker.speakers:
            raise APIError(400, f"unknown voice {body.voice!r}; this model's voices: {', '.join(self.voices)} "
                           "(GET /v1/audio/voices)", param="voice", code="unknown_voice")
        try:
            resolve_language(self.config, voice, body.language)
        except ValueError as exc:
            raise APIError(400, str(exc), param="language", code="unknown_language") from None
        if body.instructions and self.config.model_size == "0b6":
            raise APIError(400, "the 0.6B CustomVoice checkpoints do not take style instructions; leave instructions out",
                           param="instructions")
        ids = self.tokenizer.assistant_ids(text)
        instruct_ids = self.tokenizer.instruct_ids(body.instructions) if body.instructions else None
        positions = prompt_length(self.config, VoiceRequest(ids, voice, body.language, instruct_ids))
        if positions >= self.max_model_len:
            raise APIError(400, f"input takes {positions} Talker positions and max_model_len is {self.max_model_len}, "
                           "which must also hold the audio (one position per 80 ms frame); shorten the input",
                           param="input", code="input_too_long")
        params: dict[str, Any] = {"voice": voice, "language": body.language, "ignore_eos": body.ignore_eos}
        params.update({k: getattr(body, k) for k in _SAMPLING_FIELDS if getattr(body, k) is not None})
        if body.instructions:
            params["instruct"] = body.instructions
        try:
            SpeechParams.parse(params)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        return SpeechJob(text, params, fmt, body.stream_format, input_tokens=len(ids))

    def admit(self) -> Admission:
        if self.in_flight + 1 > self.capacity:
            self.metrics.rejected.inc()
            raise APIError(429, f"the admission queue is full ({self.in_flight} of {self.capacity} requests in flight); "
                           f"retry after {RETRY_AFTER_S} s", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)})
        return Admission(self, 1)  # type: ignore[arg-type] - counts on in_flight only

    # -- life cycle ------------------------------------------------------------------

    async def load(self, progress: Callable[[int, int], None] | None = None) -> None:
        try:
            await self.omni.start()
        except Exception as exc:
            self.phase = "failed"
            self.load_error = f"{type(exc).__name__}: {exc}"
            raise
        if self.phase == "loading":
            self.phase = "ready"

    async def drain(self) -> None:
        grace = self.settings.shutdown_grace_s
        self.phase = "draining"
        deadline = time.monotonic() + grace
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        for run in list(self.live):
            run.cancel()

    async def close(self) -> None:
        await self.omni.shutdown()
