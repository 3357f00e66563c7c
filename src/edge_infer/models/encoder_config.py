"""The multimodal encoders' configurations, read from ``config.json`` (torch-free).

Two towers feed a thinker:

- ``VisionConfig``: the Qwen2.5 ViT (``vision_config`` of Qwen2.5-VL and of
  Qwen2.5-Omni's thinker). The two differ only in how the checkpoint stores
  q/k/v (one fused ``attn.qkv`` in VL, ``attn.q``/``attn.k``/``attn.v`` in
  Omni: ``split_qkv``) and in their sizes (``out_hidden_size`` is the text
  model's width). Both use RMSNorm (eps 1e-6) in the blocks and the merger,
  the same window attention and the same full-attention block list in the
  released checkpoints; transformers 5.24 has no config key for either.
- ``AudioConfig``: Qwen2.5-Omni's Whisper-style audio tower (``audio_config``).

``models.config.ModelConfig`` parses both once, with the rest of config.json
(``ModelConfig.multimodal.vision`` / ``.audio``), in every layout a checkpoint
ships. The memory planner and the media layer read them without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_infer.errors import CheckpointError

# Activations the towers' MLPs use in released checkpoints (transformers' ACT2FN names).
VISION_ACTIVATIONS = ("silu",)
AUDIO_ACTIVATIONS = ("gelu",)
# Both ViT variants hard-code these in transformers (no config key).
VISION_NORM_EPS = 1e-6
AUDIO_NORM_EPS = 1e-5  # nn.LayerNorm's default, used by every audio-tower norm

def _required(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise CheckpointError(f"{where}: required key {key!r} is missing; the tower's shapes cannot be known without it")
    return d[key]


def _positive(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"{where}: {key}={value!r} must be a positive integer")
    return value


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    window_size: int = 112  # pixels per window side
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    split_qkv: bool = False  # q/k/v stored as three tensors (Omni) rather than one (VL)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, split_qkv: bool, where: str = "vision_config") -> "VisionConfig":
        """Parse a ``vision_config`` dict; defaults are transformers' for the keys it defaults."""
        shape = {k: _positive(_required(d, k, where), k, where)
                 for k in ("depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size")}
        # Hub configs of Qwen2.5-VL spell in_channels "in_chans".
        in_channels = d.get("in_channels", d.get("in_chans", cls.in_channels))
        rope = d.get("rope_parameters") or {}
        cfg = cls(
            **shape,
            patch_size=_positive(d.get("patch_size", cls.patch_size), "patch_size", where),
            temporal_patch_size=_positive(d.get("temporal_patch_size", cls.temporal_patch_size), "temporal_patch_size", where),
            spatial_merge_size=_positive(d.get("spatial_merge_size", cls.spatial_merge_size), "spatial_merge_size", where),
            in_channels=_positive(in_channels, "in_channels", where),
            window_size=_positive(d.get("window_size", cls.window_size), "window_size", where),
            fullatt_block_indexes=tuple(d.get("fullatt_block_indexes", cls.fullatt_block_indexes)),
            hidden_act=d.get("hidden_act", cls.hidden_act),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", cls.rope_theta))),
            split_qkv=split_qkv,
        )
        cfg.check(where)
        return cfg

    def check(self, where: str = "vision_config") -> None:
        if self.hidden_size % self.num_heads:
            raise CheckpointError(f"{where}: hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}")
        if self.head_dim % 4:
            raise CheckpointError(f"{where}: head_dim={self.head_dim} must be a multiple of 4 "
                                  "(the 2-D rotary embedding rotates pairs in a height half and a width half)")
        if self.window_units < 1:
            raise CheckpointError(f"{where}: window_size={self.window_size} is smaller than one merged patch "
                                  f"({self.spatial_merge_size * self.patch_size} pixels)")
        if self.hidden_act not in VISION_ACTIVATIONS:
            raise CheckpointError(f"{where}: hidden_act={self.hidden_act!r} is not supported; "
                                  f"supported: {', '.join(VISION_ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch in ``pixel_values``: channels x temporal patch x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merge_unit(self) -> int:
        """Patches merged into one output token."""
        return self.spatial_merge_size ** 2

    @property
    def window_units(self) -> int:
        """Side of an attention window, in merged patches (4 for the released 112-pixel windows)."""
        return self.window_size // self.spatial_merge_size // self.patch_size


@dataclass(frozen=True)
class AudioConfig:
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    output_dim: int
    n_window: int = 100  # half a chunk, in mel frames: attention stays within chunks of 2 * n_window frames
    max_source_positions: int = 1500
    activation_function: str = "gelu"

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = "audio_config") -> "AudioConfig":
        shape = {k: _positive(_required(d, k, where), k, where)
                 for k in ("num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                           "output_dim")}
        cfg = cls(
            **shape,
            n_window=_positive(d.get("n_window", cls.n_window), "n_window", where),
            max_source_positions=_positive(d.get("max_source_positions", cls.max_source_positions),
                                           "max_source_positions", where),
            activation_function=d.get("activation_function", cls.activation_function),
        )
        cfg.check(where)
        return cfg

    def check(self, where: str = "audio_config") -> None:
        if self.d_model % self.encoder_attention_heads:
            raise CheckpointError(f"{where}: d_model={self.d_model} is not a multiple of "
                                  f"encoder_attention_heads={self.encoder_attention_heads}")
        if self.d_model % 2:
            raise CheckpointError(f"{where}: d_model={self.d_model} must be even (sinusoidal positions)")
        if self.chunk_tokens > self.max_source_positions:
            raise CheckpointError(f"{where}: a chunk of 2 * n_window = {2 * self.n_window} frames gives "
                                  f"{self.chunk_tokens} positions, more than max_source_positions={self.max_source_positions}")
        if self.activation_function not in AUDIO_ACTIVATIONS:
            raise CheckpointError(f"{where}: activation_function={self.activation_function!r} is not supported; "
                                  f"supported: {', '.join(AUDIO_ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def chunk_tokens(self) -> int:
        """Tokens of one full chunk after the stride-2 conv."""
        return conv_output_length(self.chunk_frames)


def conv_output_length(frames: int) -> int:
    """Tokens after the audio tower's stride-2 conv (kernel 3, padding 1)."""
    return (frames - 1) // 2 + 1


def audio_output_length(frames: int) -> int:
    """Tokens the audio tower emits for ``frames`` mel frames (transformers' ``_get_feat_extract_output_lengths``).

    The stride-2 conv halves (rounding up), then average pooling over pairs
    halves again (dropping an odd last one); fewer than 3 frames give none.
    """
    return max(0, (conv_output_length(frames) - 2) // 2 + 1)
