"""A served speech model: its pipeline, the checkpoint's voices, on top of the shared ``Service``.

Requests are checked here before they reach the pipeline (voice, language,
format, speed, input length in characters and in Talker positions), so a
request the pipeline would refuse is a 400 naming the field. Phases,
admission and draining are the shared ``service.Service``.
"""
from __future__ import annotations

import logging
import os
import signal
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from edge_infer.memory.ledger import Reservation
from edge_infer.models.qwen3_tts.config import load_config
from edge_infer.models.qwen3_tts.prompt import VoiceRequest, prompt_length, resolve_language
from edge_infer.models.qwen3_tts.tokenizer import TextTokenizer
from edge_infer.runtime.omni import AsyncOmni
from edge_infer.server.errors import APIError
from edge_infer.server.metrics import SharedMetrics
from edge_infer.server.protocol import ModelCard
from edge_infer.server.service import RestartPolicy, ServeSettings, Service
from edge_infer.server.speech_metrics import SpeechMetrics
from edge_infer.server.speech_protocol import SpeechRequest, VoiceCard, VoiceList
from edge_infer.tts.audio import STREAMABLE, formats
from edge_infer.tts.deploy import SpeechPipeline
from edge_infer.tts.params import SpeechParams
from edge_infer.tts.planning import DEFAULT_MAX_MODEL_LEN

log = logging.getLogger(__name__)
# OpenAI's limit for /v1/audio/speech.
DEFAULT_MAX_INPUT_CHARS = 4096
_SAMPLING_FIELDS = ("seed", "temperature", "top_k", "top_p", "repetition_penalty", "subtalker_temperature",
                    "subtalker_top_k", "subtalker_top_p", "max_tokens")


@dataclass(frozen=True)
class SpeechJob:
    text: str
    params: dict[str, Any]  # the Talker stage's parameters (SpeechParams)
    response_format: str
    stream_format: str
    input_tokens: int


def _silent(ch: str) -> bool:
    """Nothing to speak: whitespace, control and format (zero-width) characters, and combining marks (alone, with
    nothing to combine with). Unassigned ones are not: they may be newer than this Python's Unicode tables."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me") or ch.isspace()


class SpeechService(Service):
    kind = "speech"
    unit = "requests"

    def __init__(self, pipeline: SpeechPipeline, settings: ServeSettings, max_input_chars: int = DEFAULT_MAX_INPUT_CHARS,
                 shared: SharedMetrics | None = None, beside: Sequence[Reservation] = (),
                 restart: RestartPolicy = RestartPolicy()):
        """``beside``: what the process holds besides this pipeline (a text model served on the same port, whose plan
        holds the request bodies in flight too), booked in the same ledger."""
        # Plans the deploy: raises DeployRefused before anything starts.
        omni = AsyncOmni(pipeline.config, body_bytes_in_flight=0 if beside else settings.bodies_in_flight,
                         beside=beside)
        talker = pipeline.config.stage(pipeline.talker_stage)
        names = {s.stage_id: s.name or f"stage{s.stage_id}" for s in pipeline.config.stages}
        super().__init__(settings, SpeechMetrics(shared or SharedMetrics(), omni.plan, names), talker.engine.max_num_seqs,
                         restart)
        self.pipeline = pipeline
        self.omni = omni
        self.max_input_chars = max_input_chars
        self.config = load_config(pipeline.model)
        self.tokenizer = TextTokenizer.from_dir(pipeline.model)
        self.max_model_len = talker.engine.max_model_len or DEFAULT_MAX_MODEL_LEN

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

    def down_reason(self) -> str | None:
        if self.restarting:
            return "a pipeline stage died and is restarting"
        down = [f"{s.label} is {s.state} ({s.detail})" for s in self.omni.health().stages if s.state != "running"]
        return f"a pipeline stage is down: {'; '.join(down)}" if down else None

    @property
    def health_status(self) -> str:
        if self.restarting:
            return "engine_restarting"
        states = {s.state for s in self.omni.health().stages}
        return "engine_unresponsive" if "unresponsive" in states and "dead" not in states else super().health_status

    # -- supervision (Service) ---------------------------------------------------------

    def dead_reason(self) -> str | None:
        dead = [f"{s.label} died ({s.detail})" for s in self.omni.health().stages if s.state == "dead"]
        return "; ".join(dead) or None

    def kill_if_unresponsive(self) -> bool:
        for stage in self.omni.health().stages:
            if stage.state == "unresponsive" and stage.silent_s > self.restart_policy.kill_unresponsive_s and stage.pid:
                log.error("killing %s", stage.detail)
                os.kill(stage.pid, signal.SIGKILL)  # then dead, and revived
                return True
        return False

    async def revive(self) -> None:
        for stage in self.omni.health().stages:
            if stage.state == "dead":  # a dead worker replaced restarts its stage
                await self.omni.retire_worker(stage.stage_id)
                self.metrics.stage_restarts.labels(self.metrics.stage_names[stage.stage_id]).inc()
                log.warning("%s is back (pid %s)", stage.label, self.omni.worker_pids()[stage.stage_id])

    def health(self) -> tuple[str, str | None, dict[str, Any]]:
        status, detail, _ = super().health()
        stages = [st.to_dict() for st in self.omni.health().stages] if self.phase not in ("loading", "failed") else []
        return status, detail, {"stages": stages} if stages else {}

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.settings.served_model_name, created=self.created, max_model_len=self.max_model_len)

    async def refresh_metrics(self) -> None:
        health = self.omni.health() if self.phase not in ("loading", "failed") else None
        self.metrics.refresh(health, self.in_flight)

    # -- checks made before a request touches the pipeline ----------------------------

    def prepare(self, body: SpeechRequest) -> SpeechJob:
        if body.speed != 1.0:
            raise APIError(400, f"speed {body.speed:g} is not supported: Qwen3-TTS has no speaking-rate control and "
                           "resampling would shift the pitch; send speed 1.0 (or leave it out)", param="speed", code="unsupported_speed")
        fmt = body.response_format.lower()
        if fmt not in formats():
            raise APIError(400, f"response_format {body.response_format!r} is not supported; use one of {', '.join(formats())}",
                           param="response_format", code="unsupported_format")
        if body.stream_format == "sse" and fmt not in STREAMABLE:
            raise APIError(400, f"stream_format sse carries {' or '.join(STREAMABLE)} chunks, not {fmt}; "
                           f"use stream_format audio for {fmt}", param="stream_format", code="unsupported_format")
        text = body.input
        for field, value in (("input", text), ("instructions", body.instructions or "")):
            # before anything is read character by character or tokenized: that runs on the event loop (megabytes
            # of it froze the server)
            if len(value) > self.max_input_chars:
                raise APIError(400, f"{field} has {len(value)} characters; this server takes at most "
                               f"{self.max_input_chars} (--max-input-chars); shorten it", param=field,
                               code="input_too_long")
        if all(_silent(ch) for ch in text):
            raise APIError(400, "input is empty: give the text to speak (it has no letter, digit, punctuation or "
                           "symbol)", param="input", code="empty_input")
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
                           param="instructions", code="unsupported_instructions")
        ids = self.tokenizer.assistant_ids(text)
        instruct_ids = self.tokenizer.instruct_ids(body.instructions) if body.instructions else None
        positions = prompt_length(self.config, VoiceRequest(ids, voice, body.language, instruct_ids))
        if positions >= self.max_model_len:
            what = "input and instructions take" if instruct_ids else "input takes"
            raise APIError(400, f"{what} {positions} Talker positions and max_model_len is {self.max_model_len}, "
                           "which must also hold the audio (one position per 80 ms frame); shorten them",
                           param="input", code="input_too_long")
        params: dict[str, Any] = {"voice": voice, "language": body.language, "ignore_eos": body.ignore_eos}
        params.update({k: getattr(body, k) for k in _SAMPLING_FIELDS if getattr(body, k) is not None})
        if body.instructions:
            params["instruct"] = body.instructions
        try:
            SpeechParams.parse(params)
        except ValueError as exc:
            raise APIError(400, str(exc), code="invalid_parameter") from None
        return SpeechJob(text, params, fmt, body.stream_format, input_tokens=len(ids))

    # -- life cycle ------------------------------------------------------------------

    async def _start(self, progress: Callable[[int, int], None] | None) -> None:
        await self.omni.start()

    async def close(self) -> None:
        self.stop_supervising()
        await self.omni.shutdown()
