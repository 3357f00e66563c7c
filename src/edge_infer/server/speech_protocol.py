"""Request and response shapes of the speech endpoints (OpenAI's ``/v1/audio/speech`` and a voice list).

OpenAI's fields: ``model``, ``input``, ``voice``, ``instructions``,
``response_format``, ``speed``, ``stream_format``. ``speed`` is accepted
only at 1.0: the Talker has no speaking-rate control, and resampling would
change the pitch (a 400 says so). Formats: wav, pcm (16-bit little-endian
24 kHz mono, no header), flac, mp3, opus (in Ogg); OpenAI's aac is refused
by name.
Qwen3-TTS extensions: ``language``, ``seed``, sampling (``temperature``,
``top_k``, ``top_p``, ``repetition_penalty``), ``max_tokens`` (frames,
80 ms each) and ``ignore_eos``.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from edge_infer.engine.sampling_params import SEED_MAX, SEED_MIN
from edge_infer.server.protocol import _Response, _TopRequest


class SpeechRequest(_TopRequest):
    model: str | None = None
    input: str
    voice: str
    instructions: str | None = None
    response_format: str = "wav"
    speed: float = Field(default=1.0, gt=0)
    stream_format: Literal["audio", "sse"] = "audio"
    language: str = "auto"
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2)
    # the residual codebooks (the code predictor): without them temperature 0 left these sampling
    subtalker_temperature: float | None = Field(default=None, ge=0, le=2)
    subtalker_top_k: int | None = Field(default=None, ge=0)
    subtalker_top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    ignore_eos: bool = False

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_id(cls, value: object) -> object:
        # OpenAI also accepts a voice object {"id": ...}.
        return value.get("id") if isinstance(value, dict) else value


class VoiceCard(_Response):
    id: str
    object: Literal["voice"] = "voice"
    dialect: str | None = None  # the dialect this speaker uses for Chinese (or auto) text


class VoiceList(_Response):
    object: Literal["list"] = "list"
    data: list[VoiceCard]
    languages: list[str]


class SpeechUsage(BaseModel):
    input_tokens: int
    output_tokens: int  # codec frames
    total_tokens: int
    audio_seconds: float


class SpeechAudioDelta(BaseModel):
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str  # base64 of the chunk in response_format


class SpeechAudioDone(BaseModel):
    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: SpeechUsage
