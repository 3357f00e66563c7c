"""Parsed Qwen3-TTS configuration: config.json, generation_config.json, speech_tokenizer/config.json.

Only the keys the model needs are read; defaults follow the reference
package where a released config may omit a key. A wrong or missing key
raises ``ConfigError`` naming the file and the key.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edge_infer.models.qwen3_tts.layout import SPEECH_TOKENIZER_DIR
from edge_infer.models.qwen3_tts.presets import CONTROL_TOKEN_SPAN


class ConfigError(ValueError):
    """A checkpoint's configuration cannot be used; the message names the file and key."""


class _Reader:
    """Typed access to one JSON object, with errors that name where the value lives."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a JSON object")
        self.data = data
        self.where = where

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise ConfigError(f"{self.where}: missing required key {key!r}")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{self.where}: {key!r} must be {kind.__name__}, got {value!r}")
        return value

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.get(key, dict), f"{self.where}.{key}")


@dataclass(frozen=True)
class TransformerShape:
    """A pre-norm decoder stack: RMSNorm, GQA attention with RoPE, SwiGLU MLP."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def read(cls, r: _Reader, *, eps: float, theta: float) -> "TransformerShape":
        hidden = r.get("hidden_size", int)
        heads = r.get("num_attention_heads", int)
        act = r.get("hidden_act", str, "silu")
        if act != "silu":
            raise ConfigError(f"{r.where}: hidden_act {act!r} is not supported (only 'silu')")
        if r.get("attention_bias", bool, False):
            raise ConfigError(f"{r.where}: attention_bias=true is not supported")
        shape = cls(
            hidden_size=hidden,
            intermediate_size=r.get("intermediate_size", int),
            num_layers=r.get("num_hidden_layers", int),
            num_heads=heads,
            num_kv_heads=r.get("num_key_value_heads", int, heads),
            head_dim=r.get("head_dim", int, hidden // heads),
            rms_norm_eps=r.get("rms_norm_eps", float, eps),
            rope_theta=r.get("rope_theta", float, theta),
        )
        if shape.num_heads % shape.num_kv_heads:
            raise ConfigError(f"{r.where}: num_attention_heads must be a multiple of num_key_value_heads")
        return shape


@dataclass(frozen=True)
class CodecSpecialIds:
    """Control tokens of the talker's codec vocabulary."""

    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int


@dataclass(frozen=True)
class CodePredictorConfig:
    shape: TransformerShape
    codebook_size: int       # vocab_size: entries of each residual codebook
    num_code_groups: int


@dataclass(frozen=True)
class TalkerConfig:
    shape: TransformerShape
    vocab_size: int          # codec vocabulary: codebook entries + control tokens
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int     # codebooks per frame (first + residuals)
    codec: CodecSpecialIds
    languages: dict[str, int]            # lower-case name -> codec id
    speakers: dict[str, int]             # lower-case name -> codec id (the speaker table)
    speaker_dialects: dict[str, str]     # speaker -> dialect language name, only for dialect speakers
    code_predictor: CodePredictorConfig

    @property
    def suppressed_ids(self) -> range:
        """Ids the first codebook may never emit (eos excepted): the control-token span."""
        return range(self.vocab_size - CONTROL_TOKEN_SPAN, self.vocab_size)


@dataclass(frozen=True)
class TextSpecialIds:
    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: TalkerConfig
    text: TextSpecialIds
    model_type: str          # tts_model_type: custom_voice (base / voice_design are refused)
    model_size: str          # tts_model_size, e.g. "0b6" or "1b7"


@dataclass(frozen=True)
class Code2WavConfig:
    """speech_tokenizer/config.json's decoder_config (the 12 Hz codec decoder)."""

    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    latent_dim: int
    decoder_dim: int
    upsample_rates: tuple[int, ...]      # the SnakeBeta conv blocks
    upsampling_ratios: tuple[int, ...]   # the ConvNeXt stages right after the transformer
    transformer: TransformerShape
    sliding_window: int
    sample_rate: int

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.samples_per_frame


@dataclass(frozen=True)
class SamplingParams:
    """How the Talker samples a frame; a checkpoint's generation_config.json gives the defaults.

    ``max_frames`` counts complete frames: the reference's ``max_new_tokens``
    counts first-codebook tokens and its last token never gets residual codes,
    so ``max_new_tokens = N`` yields at most ``N - 1`` frames.
    """

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_frames: int = 2047
    ignore_eos: bool = False  # run to max_frames (benchmarks: lengths independent of random weights)

    def greedy(self) -> "SamplingParams":
        return replace(self, do_sample=False, subtalker_do_sample=False)

    def __post_init__(self) -> None:
        for name in ("temperature", "subtalker_temperature", "repetition_penalty"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("top_p", "subtalker_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {self.max_frames}")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path} not found: is this a Qwen3-TTS checkpoint directory?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc


def _name_map(r: _Reader, key: str) -> dict[str, int]:
    table = r.get(key, dict)
    out: dict[str, int] = {}
    for name, value in table.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{r.where}.{key}[{name!r}] must be an integer codec id, got {value!r}")
        out[name.lower()] = value
    return out


def parse_config(data: dict[str, Any], where: str = "config.json") -> Qwen3TTSConfig:
    r = _Reader(data, where)
    model_type = r.get("tts_model_type", str, "custom_voice")
    if model_type != "custom_voice":
        raise ConfigError(
            f"{where}: tts_model_type {model_type!r} is not supported; only CustomVoice checkpoints "
            "(a speaker table, no speaker encoder) are implemented"
        )
    tokenizer_type = r.get("tokenizer_type", str, "qwen3_tts_tokenizer_12hz")
    if tokenizer_type != "qwen3_tts_tokenizer_12hz":
        raise ConfigError(f"{where}: tokenizer_type {tokenizer_type!r} is not supported (only the 12 Hz codec)")

    t = r.sub("talker_config")
    rope = t.get("rope_scaling", dict, {})
    shape = TransformerShape.read(t, eps=1e-6, theta=10000.0)
    sections = rope.get("mrope_section")
    if sections is not None and sum(sections) != shape.head_dim // 2:
        raise ConfigError(f"{t.where}.rope_scaling.mrope_section must sum to head_dim/2 = {shape.head_dim // 2}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"{t.where}.rope_scaling: rope_type {rope_type!r} is not supported (only 'default')")

    cp = t.sub("code_predictor_config")
    groups = t.get("num_code_groups", int)
    predictor = CodePredictorConfig(
        shape=TransformerShape.read(cp, eps=1e-6, theta=10000.0),
        codebook_size=cp.get("vocab_size", int),
        num_code_groups=cp.get("num_code_groups", int, groups),
    )
    if predictor.num_code_groups != groups:
        raise ConfigError(f"{cp.where}.num_code_groups ({predictor.num_code_groups}) differs from the talker's ({groups})")

    speakers = _name_map(t, "spk_id")
    dialect_table = t.get("spk_is_dialect", dict, {})
    dialects = {name.lower(): value for name, value in dialect_table.items() if value}
    languages = _name_map(t, "codec_language_id")
    for speaker, dialect in dialects.items():
        if dialect not in languages:
            raise ConfigError(f"{t.where}.spk_is_dialect[{speaker!r}] names {dialect!r}, which is not in codec_language_id")

    talker = TalkerConfig(
        shape=shape,
        vocab_size=t.get("vocab_size", int),
        text_vocab_size=t.get("text_vocab_size", int),
        text_hidden_size=t.get("text_hidden_size", int),
        num_code_groups=groups,
        codec=CodecSpecialIds(
            pad=t.get("codec_pad_id", int), bos=t.get("codec_bos_id", int), eos=t.get("codec_eos_token_id", int),
            think=t.get("codec_think_id", int), nothink=t.get("codec_nothink_id", int),
            think_bos=t.get("codec_think_bos_id", int), think_eos=t.get("codec_think_eos_id", int),
        ),
        languages=languages,
        speakers=speakers,
        speaker_dialects=dialects,
        code_predictor=predictor,
    )
    if talker.vocab_size <= CONTROL_TOKEN_SPAN or predictor.codebook_size > talker.vocab_size - CONTROL_TOKEN_SPAN:
        raise ConfigError(
            f"{t.where}: vocab_size {talker.vocab_size} must leave the codebook ({predictor.codebook_size} ids) "
            f"below the top {CONTROL_TOKEN_SPAN} control-token ids"
        )
    text = TextSpecialIds(
        im_start=r.get("im_start_token_id", int, 151644),
        im_end=r.get("im_end_token_id", int, 151645),
        tts_pad=r.get("tts_pad_token_id", int, 151671),
        tts_bos=r.get("tts_bos_token_id", int, 151672),
        tts_eos=r.get("tts_eos_token_id", int, 151673),
    )
    return Qwen3TTSConfig(talker=talker, text=text, model_type=model_type, model_size=r.get("tts_model_size", str, ""))


def parse_code2wav_config(data: dict[str, Any], where: str = "speech_tokenizer/config.json") -> Code2WavConfig:
    r = _Reader(data, where)
    model_type = r.get("model_type", str, "qwen3_tts_tokenizer_12hz")
    if model_type != "qwen3_tts_tokenizer_12hz":
        raise ConfigError(f"{where}: model_type {model_type!r} is not supported (only the 12 Hz codec)")
    d = r.sub("decoder_config")
    semantic = d.get("num_semantic_quantizers", int, 1)
    if semantic != 1:
        raise ConfigError(f"{d.where}.num_semantic_quantizers must be 1 (the decoder splits off one semantic codebook)")
    config = Code2WavConfig(
        codebook_size=d.get("codebook_size", int),
        codebook_dim=d.get("codebook_dim", int),
        num_quantizers=d.get("num_quantizers", int),
        latent_dim=d.get("latent_dim", int),
        decoder_dim=d.get("decoder_dim", int),
        upsample_rates=tuple(d.get("upsample_rates", list)),
        upsampling_ratios=tuple(d.get("upsampling_ratios", list)),
        transformer=TransformerShape.read(d, eps=1e-5, theta=10000.0),
        sliding_window=d.get("sliding_window", int),
        sample_rate=r.get("output_sample_rate", int, 24000),
    )
    declared = r.get("decode_upsample_rate", int, config.samples_per_frame)
    if declared != config.samples_per_frame:
        raise ConfigError(
            f"{where}: decode_upsample_rate {declared} differs from the decoder's upsampling "
            f"({config.samples_per_frame} = product of upsample_rates and upsampling_ratios)"
        )
    if config.decoder_dim % (2 ** len(config.upsample_rates)):
        raise ConfigError(f"{d.where}.decoder_dim must be divisible by 2**len(upsample_rates)")
    return config


def parse_generation_defaults(data: dict[str, Any], where: str = "generation_config.json") -> SamplingParams:
    r = _Reader(data, where)
    base = SamplingParams()
    known = {
        "do_sample": ("do_sample", bool), "temperature": ("temperature", float), "top_k": ("top_k", int),
        "top_p": ("top_p", float), "repetition_penalty": ("repetition_penalty", float),
        "subtalker_dosample": ("subtalker_do_sample", bool), "subtalker_temperature": ("subtalker_temperature", float),
        "subtalker_top_k": ("subtalker_top_k", int), "subtalker_top_p": ("subtalker_top_p", float),
    }
    values = {attr: r.get(key, kind, getattr(base, attr)) for key, (attr, kind) in known.items()}
    max_new_tokens = r.get("max_new_tokens", int, base.max_frames + 1)
    try:
        return SamplingParams(**values, max_frames=max(max_new_tokens - 1, 1))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(model_dir: str | Path) -> Qwen3TTSConfig:
    path = Path(model_dir) / "config.json"
    return parse_config(_read_json(path), str(path))


def load_code2wav_config(model_dir: str | Path) -> Code2WavConfig:
    path = Path(model_dir) / SPEECH_TOKENIZER_DIR / "config.json"
    return parse_code2wav_config(_read_json(path), str(path))


def load_generation_defaults(model_dir: str | Path) -> SamplingParams:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return SamplingParams()
    return parse_generation_defaults(_read_json(path), str(path))
