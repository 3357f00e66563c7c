"""``Qwen3TTS``: a loaded checkpoint (tokenizer, Talker, Code2Wav) and text -> PCM.

This is the single-process path; the omni runtime runs the Talker and
Code2Wav as separate stages with the same pieces (``build_prompt``,
``generate_frames``, ``StreamingDecoder``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from edge_infer.models.loader import load_module
from edge_infer.models.qwen3_tts.code2wav import Code2Wav, StreamingDecoder, load_code2wav
from edge_infer.models.qwen3_tts.config import (
    Code2WavConfig, GenerationDefaults, Qwen3TTSConfig, load_code2wav_config, load_config, load_generation_defaults,
)
from edge_infer.models.qwen3_tts.generate import SamplingParams, generate_frames
from edge_infer.models.qwen3_tts.prompt import TalkerPrompt, VoiceRequest, build_prompt
from edge_infer.models.qwen3_tts.talker import Qwen3TTSTalkerCheckpoint, Talker
from edge_infer.models.qwen3_tts.tokenizer import TextTokenizer

# The reference decodes long utterances in 300-frame chunks with 25 frames of left context.
DEFAULT_LEFT_CONTEXT = 25


def load_talker(model_dir: str | Path, config: Qwen3TTSConfig, dtype: torch.dtype = torch.float32) -> Talker:
    return load_module(lambda: Qwen3TTSTalkerCheckpoint(config), model_dir, dtype, ignore=("speaker_encoder.",)).talker


@dataclass
class Qwen3TTS:
    config: Qwen3TTSConfig
    code2wav_config: Code2WavConfig
    defaults: GenerationDefaults
    tokenizer: TextTokenizer
    talker: Talker
    code2wav: Code2Wav

    @classmethod
    def load(cls, model_dir: str | Path, dtype: torch.dtype = torch.float32) -> "Qwen3TTS":
        config = load_config(model_dir)
        code2wav_config = load_code2wav_config(model_dir)
        if code2wav_config.num_quantizers != config.talker.num_code_groups:
            raise ValueError(
                f"{model_dir}: the Talker emits {config.talker.num_code_groups} codebooks per frame but "
                f"speech_tokenizer decodes {code2wav_config.num_quantizers}"
            )
        return cls(
            config=config, code2wav_config=code2wav_config, defaults=load_generation_defaults(model_dir),
            tokenizer=TextTokenizer.from_dir(model_dir), talker=load_talker(model_dir, config, dtype),
            code2wav=load_code2wav(model_dir, code2wav_config, dtype),
        )

    @property
    def sample_rate(self) -> int:
        return self.code2wav_config.sample_rate

    @property
    def speakers(self) -> list[str]:
        """The speaker table's names (lower case)."""
        return sorted(self.config.talker.speakers)

    @property
    def languages(self) -> list[str]:
        """Accepted ``language`` values; dialects are chosen through their speakers."""
        return ["auto"] + sorted(n for n in self.config.talker.languages if "dialect" not in n)

    def request(self, text: str, speaker: str, language: str = "auto", instruct: str | None = None,
                non_streaming_text: bool = True) -> VoiceRequest:
        if instruct and self.config.model_size == "0b6":
            raise ValueError("the 0.6B CustomVoice checkpoints do not take style instructions; drop `instruct`")
        return VoiceRequest(
            input_ids=self.tokenizer.assistant_ids(text), speaker=speaker, language=language,
            instruct_ids=self.tokenizer.instruct_ids(instruct) if instruct else None,
            non_streaming_text=non_streaming_text,
        )

    def prompt(self, request: VoiceRequest) -> TalkerPrompt:
        with torch.inference_mode():
            return build_prompt(self.talker, self.config, request)

    def sampling(self, **overrides: object) -> SamplingParams:
        return SamplingParams.from_defaults(self.defaults, **overrides)

    def frames(self, request: VoiceRequest, params: SamplingParams | None = None,
               generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        return generate_frames(self.talker, self.prompt(request), params or self.sampling(), generator=generator)

    def stream(self, request: VoiceRequest, params: SamplingParams | None = None, chunk_frames: int = 4,
               left_context: int = DEFAULT_LEFT_CONTEXT, generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """PCM chunks of ``chunk_frames`` frames as the Talker produces them."""
        decoder = StreamingDecoder(self.code2wav, left_context)
        pending: list[torch.Tensor] = []
        for frame in self.frames(request, params, generator):
            pending.append(frame)
            if len(pending) == chunk_frames:
                yield decoder.push(torch.stack(pending))
                pending = []
        if pending:
            yield decoder.push(torch.stack(pending))

    def synthesize(self, request: VoiceRequest, params: SamplingParams | None = None,
                   generator: torch.Generator | None = None) -> torch.Tensor:
        """The whole utterance: all frames, then one decode."""
        frames = list(self.frames(request, params, generator))
        if not frames:
            return torch.empty(0)
        return self.code2wav(torch.stack(frames))
