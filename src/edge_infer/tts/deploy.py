"""A speech pipeline: which stage takes the voice, which one speaks.

``SpeechPipeline.for_checkpoint(DIR)`` loads the bundled ``qwen3_tts``
deploy config with ``model: DIR`` on both stages, under any user stage
overrides; ``SpeechPipeline.from_config`` takes a deploy config of one's
own. Either way it finds the Talker (the stage whose executor is
``qwen3_tts_talker``: it takes the request's voice and sampling) and the
audio stage (the final output emitting ``pcm_audio/1``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from edge_infer.runtime.config import DeployConfig, load_deploy_config, parse_stage_overrides
from edge_infer.runtime.executors import executor_target, load_executor

BUNDLED = "qwen3_tts"
BUNDLED_STAGES = (0, 1)  # talker, code2wav
TALKER_EXECUTOR = "qwen3_tts_talker"


def is_qwen3_tts_checkpoint(model_dir: str | os.PathLike[str]) -> bool:
    """True for a directory whose config.json is a Qwen3-TTS model (model_type qwen3_tts)."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("model_type") == "qwen3_tts"
    except (OSError, ValueError, AttributeError):
        return False


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``, mappings merged key by key."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


@dataclass(frozen=True)
class EngineFlags:
    """The engine flags of ``serve``/``bench tts`` as stage settings of the bundled pipeline.

    ``dtype``, ``max_num_seqs`` and ``num_threads`` apply to both stages;
    the others to the Talker (the KV cache and the weights to quantize are its own).
    """

    dtype: str | None = None
    max_num_seqs: int | None = None
    num_threads: int | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    quantization: str | None = None

    def overrides(self) -> dict[int, dict[str, Any]]:
        both: dict[str, Any] = {}
        if self.dtype not in (None, "auto"):
            both["engine"] = {"dtype": self.dtype}
        if self.max_num_seqs is not None:
            both = merge(both, {"engine": {"max_num_seqs": self.max_num_seqs}})
        if self.num_threads is not None:
            both["executor_options"] = {"num_threads": self.num_threads}
        talker = {k: getattr(self, k) for k in ("max_model_len", "max_num_batched_tokens", "kv_cache_memory_bytes", "quantization")
                  if getattr(self, k) is not None}
        return {0: merge(both, {"engine": talker}) if talker else both, 1: both}


@dataclass(frozen=True)
class SpeechPipeline:
    config: DeployConfig
    talker_stage: int
    audio_stage: int

    @classmethod
    def for_checkpoint(cls, model_dir: str | os.PathLike[str], stage_overrides: str | Mapping[Any, Any] | None = None,
                       engine: EngineFlags | None = None) -> "SpeechPipeline":
        """The bundled two-stage config with ``model: model_dir`` on both stages.

        ``engine`` flags come first, ``stage_overrides`` over them (an override may set ``model`` too).
        """
        user = parse_stage_overrides(stage_overrides)
        flags = (engine or EngineFlags()).overrides()
        model = str(Path(model_dir).resolve())
        merged = {sid: merge(merge({"model": model}, flags[sid]), user.pop(sid, {})) for sid in BUNDLED_STAGES}
        merged.update(user)  # stage ids the bundled config lacks: its loader names them
        return cls.from_config(load_deploy_config(BUNDLED, {str(k): v for k, v in merged.items()}))

    @classmethod
    def from_config(cls, config: DeployConfig) -> "SpeechPipeline":
        talkers = [s.stage_id for s in config.stages if s.executor == TALKER_EXECUTOR]
        audio = [sid for sid in config.final_outputs
                 if "pcm_audio/1" in load_executor(executor_target(config.stage(sid).executor)).output_contracts]
        if len(talkers) != 1 or len(audio) != 1:
            raise ValueError(
                f"{config.source} is not a speech pipeline: it needs one stage with executor {TALKER_EXECUTOR} "
                f"(found {len(talkers)}) and one final output emitting pcm_audio/1 (found {len(audio)})"
            )
        return cls(config, talkers[0], audio[0])

    @property
    def model(self) -> str | None:
        return self.config.stage(self.talker_stage).model

    def params_list(self, speech: Mapping[str, Any]) -> list[dict[str, Any]]:
        """``sampling_params_list`` giving the Talker the request's parameters (stage_id order)."""
        return [dict(speech) if s.stage_id == self.talker_stage else {} for s in self.config.stages]
