"""What a TTS request may ask of the Talker stage (its entry of ``sampling_params_list``).

Unset sampling values come from the checkpoint's generation_config.json.
A temperature of 0 means greedy decoding (for the first codebook with
``temperature``, for the residual codebooks with ``subtalker_temperature``).
``max_tokens`` counts frames (80 ms of audio each); with ``ignore_eos`` a
request speaks exactly that many (for benchmarks on random weights).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_infer.models.qwen3_tts.config import SamplingParams


class SpeechParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voice: str | None = None  # a speaker of the checkpoint's table
    language: str = "auto"
    instruct: str | None = None  # a style instruction (1.7B checkpoints)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    subtalker_temperature: float | None = Field(default=None, ge=0)
    subtalker_top_k: int | None = Field(default=None, ge=0)
    subtalker_top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    ignore_eos: bool = False  # speak max_tokens frames whatever the model says (benchmarks)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> "SpeechParams":
        """Validate a request's parameters; ``ValueError`` names every bad key."""
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'params'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"invalid speech parameters: {problems} (known: {', '.join(cls.model_fields)})") from None

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        overrides: dict[str, Any] = {}
        for ours, theirs in (("top_k", "top_k"), ("top_p", "top_p"), ("repetition_penalty", "repetition_penalty"),
                             ("subtalker_top_k", "subtalker_top_k"), ("subtalker_top_p", "subtalker_top_p"),
                             ("max_tokens", "max_frames")):
            if getattr(self, ours) is not None:
                overrides[theirs] = getattr(self, ours)
        for temperature, sample, name in (("temperature", "do_sample", "temperature"),
                                          ("subtalker_temperature", "subtalker_do_sample", "subtalker_temperature")):
            value = getattr(self, temperature)
            if value == 0:
                overrides[sample] = False
            elif value is not None:
                overrides[name] = value
        return replace(defaults, ignore_eos=self.ignore_eos, **overrides)
