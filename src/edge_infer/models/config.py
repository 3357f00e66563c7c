"""Model configuration read from a Hugging Face ``config.json``.

One decoder serves Llama, Qwen2, Qwen3 and Mistral; the differences are
flags here (q/k/v bias, q/k RMSNorm, explicit head_dim, RoPE scaling,
sliding window), never separate model classes.

The thinkers of Qwen2.5-VL and Qwen2.5-Omni are that decoder too (Qwen2 with
q/k/v bias) with multimodal RoPE (``mrope_section``); their media side
(placeholder token ids, TMRoPE timing, the vision and audio towers' configs,
parsed here once: ``models.encoder_config``) is ``MultimodalConfig``. Their text keys are nested (``text_config``, inside
``thinker_config`` for the full Omni model) or, in the hub's Qwen2.5-VL
configs, flat at the top level.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_infer.errors import CheckpointError
from edge_infer.models.encoder_config import AudioConfig, VisionConfig

# architecture name in config.json -> family
TEXT_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}
# Thinkers that take media in; the full Omni model is read as its thinker (the talker and token2wav are ignored).
MULTIMODAL_ARCHITECTURES = {
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen2_5OmniThinkerForConditionalGeneration": "qwen2_5_omni",
    "Qwen2_5OmniForConditionalGeneration": "qwen2_5_omni",
    "Qwen2_5OmniModel": "qwen2_5_omni",  # the name the hub's Qwen2.5-Omni configs carry
}
ARCHITECTURES = {**TEXT_ARCHITECTURES, **MULTIMODAL_ARCHITECTURES}
# The text families (what `edge-infer synth` writes).
FAMILIES = tuple(sorted(set(TEXT_ARCHITECTURES.values())))
MEDIA_KINDS = {"qwen2_5_vl": ("image", "video"), "qwen2_5_omni": ("image", "video", "audio")}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class MultimodalConfig:
    """What a thinker needs to place media in a prompt (defaults: transformers' for these models)."""

    family: str  # qwen2_5_vl | qwen2_5_omni
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    audio_token_id: int | None  # Omni only, as the audio start/end ids
    audio_start_token_id: int | None
    audio_end_token_id: int | None
    # Temporal positions per second of video (TMRoPE): the VL vision config's tokens_per_second, Omni's
    # position_id_per_seconds.
    position_id_per_seconds: float
    seconds_per_chunk: float  # Omni: audio and video interleave in chunks of this many seconds
    vision: VisionConfig  # the vision tower (q/k/v split in Omni's checkpoints, fused in VL's)
    audio: AudioConfig | None = None  # the audio tower (Omni)

    @property
    def spatial_merge_size(self) -> int:
        """Patches merged into one embedding row along each side (the vision tower's)."""
        return self.vision.spatial_merge_size

    @property
    def kinds(self) -> tuple[str, ...]:
        """The media kinds the model takes."""
        return MEDIA_KINDS[self.family]

    def placeholder_id(self, kind: str) -> int:
        """The token id that stands for one embedding row of ``kind`` in a prompt."""
        return {"image": self.image_token_id, "video": self.video_token_id, "audio": self.audio_token_id}[kind]


@dataclass(frozen=True)
class ModelConfig:
    family: str
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    sliding_window: int | None
    rope_scaling: RopeScaling | None
    torch_dtype: str
    quantization_config: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # M-RoPE: how many of the head's frequency pairs read the temporal, height and width positions (in turn).
    mrope_section: tuple[int, ...] | None = None
    multimodal: MultimodalConfig | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            raise CheckpointError(f"model directory {model_dir} does not exist; pass a Hugging Face checkpoint directory")
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: a checkpoint directory needs config.json next to its *.safetensors")
        return _parsed(path.read_text(), str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise CheckpointError(
                f"{source}: unsupported architecture {archs or raw.get('model_type')!r}; "
                f"edge-infer's text engine supports {', '.join(sorted(ARCHITECTURES))}"
            )
        family = ARCHITECTURES[arch]
        original = top = raw
        multimodal = None
        if family in MEDIA_KINDS:
            top, raw = _thinker_text(raw, family, source)
            multimodal = _multimodal(top, family, source)

        def need(key: str) -> Any:
            if key not in raw:
                raise CheckpointError(f"{source}: required key {key!r} is missing for a {arch} checkpoint")
            return raw[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if heads % kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        if multimodal is not None:
            _check_towers(multimodal, hidden, source)
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")

        mrope_section = None
        if multimodal is not None:
            rope_scaling, mrope_section = None, _parse_mrope(raw, head_dim, source)
        else:
            rope_scaling = _parse_rope_scaling(raw, source)
        qwen2_decoder = family == "qwen2" or multimodal is not None
        # Qwen2/2.5 (and the Qwen2.5 thinkers) always carry q/k/v bias; Llama/Mistral/Qwen3 only with attention_bias.
        attention_bias = qwen2_decoder or bool(raw.get("attention_bias", False))
        sliding_window = raw.get("sliding_window")
        if qwen2_decoder or family == "qwen3":
            # Qwen configs carry sliding_window but only use it with use_sliding_window.
            if not raw.get("use_sliding_window", False):
                sliding_window = None
        return cls(
            family=family,
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw, 1e6 if multimodal is not None else 10000.0),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=_tied(top, raw, family),
            attention_bias=attention_bias,
            qk_norm=family == "qwen3",
            sliding_window=int(sliding_window) if sliding_window else None,
            rope_scaling=rope_scaling,
            torch_dtype=next((str(d[k]) for d in (original, top, raw) for k in ("torch_dtype", "dtype") if d.get(k)),
                             "float32"),
            quantization_config=original.get("quantization_config"),
            raw=original,
            mrope_section=mrope_section,
            multimodal=multimodal,
        )


def _thinker_text(raw: dict[str, Any], family: str, source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the thinker's config, its text keys): the full Omni model's thinker is ``thinker_config``; the text keys
    are ``text_config``, with any flat top-level keys (the hub's Qwen2.5-VL configs) as defaults under them."""
    thinker = raw
    if family == "qwen2_5_omni" and "thinker_config" in raw:
        thinker = raw["thinker_config"]
        if not isinstance(thinker, dict):
            raise CheckpointError(f"{source}: thinker_config must be an object")
    text = thinker.get("text_config")
    if text is None:
        if family == "qwen2_5_omni":
            raise CheckpointError(f"{source}: the Qwen2.5-Omni thinker config has no text_config")
        return thinker, thinker
    if not isinstance(text, dict):
        raise CheckpointError(f"{source}: text_config must be an object")
    flat = {k: v for k, v in thinker.items() if k not in ("text_config", "vision_config", "audio_config", "architectures")}
    return thinker, {**flat, **text}


def _tied(top: dict[str, Any], text: dict[str, Any], family: str) -> bool:
    """Whether the output head is the embedding table, as transformers 5.24 decides it: for the Omni thinker by its
    own key (default False), for Qwen2.5-VL by either the top-level or the text config's."""
    if family == "qwen2_5_omni":
        return bool(top.get("tie_word_embeddings", False))
    if family == "qwen2_5_vl":
        return bool(top.get("tie_word_embeddings", False) or text.get("tie_word_embeddings", False))
    return bool(text.get("tie_word_embeddings", False))


def _rope_theta(raw: dict[str, Any], default: float) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    return float(raw.get("rope_theta", params.get("rope_theta", default)))


def _parse_mrope(raw: dict[str, Any], head_dim: int, source: str) -> tuple[int, ...]:
    """``mrope_section`` from ``rope_scaling`` (hub configs: type mrope or default) or ``rope_parameters`` (5.24)."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "mrope"):
        raise CheckpointError(f"{source}: rope type {kind!r} is not supported for a multimodal thinker "
                              "(supported: multimodal RoPE, rope_type default or mrope, with an mrope_section)")
    section = params.get("mrope_section", [16, 24, 24])  # transformers' default when the key is absent
    if (not isinstance(section, (list, tuple)) or len(section) != 3
            or not all(isinstance(s, int) and s >= 0 for s in section)):
        raise CheckpointError(f"{source}: mrope_section={section!r} must be three non-negative integers "
                              "(frequency pairs for time, height and width)")
    if sum(section) != head_dim // 2:
        raise CheckpointError(f"{source}: mrope_section={list(section)} sums to {sum(section)}, but a head of "
                              f"{head_dim} has {head_dim // 2} frequency pairs")
    return tuple(section)


def _multimodal(thinker: dict[str, Any], family: str, source: str) -> MultimodalConfig:
    vision = thinker.get("vision_config")
    if not isinstance(vision, dict):
        raise CheckpointError(f"{source}: a {family} checkpoint needs a vision_config object")
    omni = family == "qwen2_5_omni"
    audio = thinker.get("audio_config") if omni else None
    if omni and not isinstance(audio, dict):
        raise CheckpointError(f"{source}: a Qwen2.5-Omni thinker needs an audio_config object")

    def token(name: str, default: int) -> int:
        # Omni names the placeholders *_token_index; transformers maps *_token_id onto them
        value = thinker.get(name, thinker.get(name.replace("_id", "_index"), default))
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointError(f"{source}: {name}={value!r} must be a token id")
        return value

    return MultimodalConfig(
        family=family,
        image_token_id=token("image_token_id", 151655),
        video_token_id=token("video_token_id", 151656),
        vision_start_token_id=token("vision_start_token_id", 151652),
        vision_end_token_id=token("vision_end_token_id", 151653),
        audio_token_id=token("audio_token_id", 151646) if omni else None,
        audio_start_token_id=token("audio_start_token_id", 151647) if omni else None,
        audio_end_token_id=token("audio_end_token_id", 151648) if omni else None,
        position_id_per_seconds=float(thinker.get("position_id_per_seconds", 25) if omni
                                      else vision.get("tokens_per_second", 4)),
        seconds_per_chunk=float(thinker.get("seconds_per_chunk", 2)),
        # Omni's checkpoints store the ViT's q, k and v apart, VL's as one tensor.
        vision=VisionConfig.from_dict(vision, split_qkv=omni, where=f"{source}: vision_config"),
        audio=AudioConfig.from_dict(audio, where=f"{source}: audio_config") if omni else None,
    )


def _check_towers(mm: MultimodalConfig, hidden: int, source: str) -> None:
    """The towers' embeddings take the place of token embeddings: they must be as wide."""
    widths = [("vision_config.out_hidden_size", mm.vision.out_hidden_size)]
    if mm.audio is not None:
        widths.append(("audio_config.output_dim", mm.audio.output_dim))
    for key, width in widths:
        if width != hidden:
            raise CheckpointError(f"{source}: {key}={width} differs from the text model's hidden_size={hidden}; "
                                  "the tower's embeddings fill rows of the text model's input")


def _parse_rope_scaling(raw: dict[str, Any], source: str) -> RopeScaling | None:
    scaling = raw.get("rope_scaling")
    if scaling is None:
        params = raw.get("rope_parameters") or {}
        if params.get("rope_type", "default") not in ("default", None):
            scaling = params
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(f"{source}: rope_scaling type {kind!r} is not supported (supported: llama3)")
    try:
        return RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as exc:
        raise CheckpointError(f"{source}: rope_scaling of type llama3 lacks {exc.args[0]!r}") from exc


@lru_cache(maxsize=16)
def _parsed(text: str, path: str) -> ModelConfig:
    """config.json parsed once per content: the frontend, the planner and the loader each ask for it."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); restore the file from the original checkpoint") from exc
    return ModelConfig.from_dict(raw, source=path)
