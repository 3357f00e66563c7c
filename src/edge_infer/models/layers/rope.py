"""Rotary position embedding tables, sized to ``max_model_len``.

The tables are computed once in fp32 for exactly the positions the engine can
reach; a model that advertises 128K positions served at 4K context pays for
4K rows, not 128K.

Multimodal RoPE (Qwen2.5-VL, Qwen2.5-Omni) gives each token three positions
(time, height, width) and each frequency pair of a head reads one of them:
the first ``mrope_section[0]`` pairs the temporal position, the next
``mrope_section[1]`` the height, the rest the width. Those positions are not
bounded by the context length (a video's temporal positions advance by
seconds, not tokens), so such a table holds no rows: cos and sin are computed
for each step's positions, with the same fp32 products a table would hold.
A token whose three positions are equal gets exactly the 1-D rotation.
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
    def __init__(self, head_dim: int, theta: float, max_positions: int, scaling: RopeScaling | None = None,
                 mrope_section: tuple[int, ...] | None = None):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        self.max_positions = max_positions
        self.inv_freq = inv_freq
        # M-RoPE: the position axis (0 time, 1 height, 2 width) each frequency pair reads
        self.axes = None if mrope_section is None else torch.repeat_interleave(
            torch.arange(len(mrope_section)) % 3, torch.tensor(mrope_section))
        if self.axes is None:
            self.cos, self.signed_sin = rotary_tables(torch.arange(max_positions, dtype=torch.float32), inv_freq)

    @staticmethod
    def nbytes_for(head_dim: int, max_positions: int, mrope: bool = False) -> int:
        return 0 if mrope else 2 * max_positions * head_dim * 4

    @property
    def nbytes(self) -> int:
        return self.nbytes_for(2 * self.inv_freq.numel(), self.max_positions, self.axes is not None)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin ``[T, 1, head_dim]`` for positions ``[T]`` (or, with M-RoPE, ``[3, T]``: time, height
        and width), in the activation dtype."""
        if self.axes is None:
            cos = self.cos.index_select(0, positions)
            sin = self.signed_sin.index_select(0, positions)
        else:
            cos, sin = self._mrope(positions)
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def _mrope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = positions.to(torch.float32)
        if pos.dim() == 1:  # one position per token: every axis reads it
            freqs = pos.unsqueeze(1) * self.inv_freq
        else:  # [T, pairs]: pair j's position from its axis, times its frequency
            freqs = pos.t().index_select(1, self.axes) * self.inv_freq
        return torch.cat((freqs.cos(), freqs.cos()), dim=-1), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` (half-split convention of HF Llama/Qwen).

    ``x * cos + rotate_half(x) * sin`` with rotate_half written as a roll
    against a sign-folded sin: three kernels instead of six. ``inplace``
    overwrites ``x`` (which must already have the result's dtype) and
    allocates only the roll: every fresh tensor is page faults under the
    encoders' pinned allocator (memory.measure.pin_mmap_threshold).
    """
    rolled = torch.roll(x, x.shape[-1] // 2, -1)
    return (x.mul_(cos) if inplace else x * cos).addcmul_(rolled, signed_sin)
