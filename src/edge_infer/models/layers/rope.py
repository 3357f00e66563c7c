"""Rotary position embedding tables, sized to ``max_model_len``.

The tables are computed once in fp32 for exactly the positions the engine can
reach; a model that advertises 128K positions served at 4K context pays for
4K rows, not 128K.
"""
from __future__ import annotations

import math

import torch

from edge_infer.models.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    # Llama-3: long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    in_band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_band, smoothed, scaled)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and signed sin ``[T, head_dim]`` of ``positions`` (half-split: the two halves share frequencies).

    The sin has its first half negated: rotate_half(x) * sin == roll(x, half) * signed_sin.
    """
    freqs = torch.outer(positions.to(torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.cos()), dim=-1), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


class RotaryTable:
    def __init__(self, head_dim: int, theta: float, max_positions: int, scaling: RopeScaling | None = None):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        self.cos, self.signed_sin = rotary_tables(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.max_positions = max_positions

    @staticmethod
    def nbytes_for(head_dim: int, max_positions: int) -> int:
        return 2 * max_positions * head_dim * 4

    @property
    def nbytes(self) -> int:
        return self.nbytes_for(self.cos.shape[1], self.max_positions)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin ``[T, 1, head_dim]`` for the given positions, in the activation dtype."""
        cos = self.cos.index_select(0, positions).to(dtype).unsqueeze(1)
        sin = self.signed_sin.index_select(0, positions).to(dtype).unsqueeze(1)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` (half-split convention of HF Llama/Qwen).

    ``x * cos + rotate_half(x) * sin`` with rotate_half written as a roll
    against a sign-folded sin: three kernels instead of six.
    """
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, -1), signed_sin)
