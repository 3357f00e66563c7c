"""Model configuration read from a Hugging Face ``config.json``.

One decoder serves Llama, Qwen2, Qwen3 and Mistral; the differences are
flags here (q/k/v bias, q/k RMSNorm, explicit head_dim, RoPE scaling,
sliding window), never separate model classes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_infer.errors import CheckpointError

# architecture name in config.json -> family
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}
FAMILIES = tuple(sorted(set(ARCHITECTURES.values())))


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


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
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")

        rope_scaling = _parse_rope_scaling(raw, source)
        # Qwen2/2.5 always carry q/k/v bias; Llama/Mistral/Qwen3 only with attention_bias.
        attention_bias = bool(raw.get("attention_bias", family == "qwen2"))
        if family == "qwen2":
            attention_bias = True
        sliding_window = raw.get("sliding_window")
        if family == "qwen2" or family == "qwen3":
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
            rope_theta=float(raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            qk_norm=family == "qwen3",
            sliding_window=int(sliding_window) if sliding_window else None,
            rope_scaling=rope_scaling,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            quantization_config=raw.get("quantization_config"),
            raw=raw,
        )


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
