"""Group-wise 4-bit quantization of weight rows, and the portable code format.

The convention is the one PyTorch's CPU int4 kernel dequantizes with: a code
``q`` in 0..15 stands for ``(q - 8) * scale + zero``, one (scale, zero) pair
per group of ``group_size`` consecutive input columns of a row.

- symmetric: ``zero = 0``, ``scale = max|w| / 7`` (codes 1..15 are used);
- asymmetric: ``scale = (max - min) / 15``, ``zero = min + 8 * scale``, so
  code 0 is the group's minimum and code 15 its maximum.

Scales and zeros are rounded to bf16 *before* the codes are chosen, so the
codes fit the values the kernel will actually use, and a quantized
checkpoint (which stores bf16 scales) loads to exactly the weights that
quantizing at load time gives. Rows are independent: quantizing a block of
rows gives the same codes as quantizing the whole matrix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_DTYPE = torch.bfloat16
# Smallest scale: keeps an all-zero group finite (its codes then all mean 0).
MIN_SCALE = 1e-12


@dataclass
class QuantizedRows:
    codes: torch.Tensor  # uint8 [rows, Kp], values 0..15
    scales: torch.Tensor  # bf16 [rows, Kp / group_size]
    zeros: torch.Tensor  # bf16 [rows, Kp / group_size]; all zero when symmetric


def quantize_rows(weight: torch.Tensor, group_size: int, symmetric: bool) -> QuantizedRows:
    """Quantize ``weight [rows, K]``; K is zero-padded to a multiple of ``group_size``."""
    rows, cols = weight.shape
    padded_cols = -(-cols // group_size) * group_size
    # One fp32 working copy, changed in place below (this runs over every weight while loading).
    w = weight.float()
    if padded_cols != cols:
        w = torch.nn.functional.pad(w, (0, padded_cols - cols))
    elif w is weight:
        w = w.clone()
    groups = w.view(rows, padded_cols // group_size, group_size)
    lo, hi = torch.aminmax(groups, dim=-1)
    if symmetric:
        scale = (torch.maximum(-lo, hi) / 7).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
        zero = torch.zeros_like(scale)
    else:
        scale = ((hi - lo) / 15).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
        zero = (lo + 8 * scale.float()).to(SCALE_DTYPE)
        groups.sub_(zero.float().unsqueeze(-1))
    groups.div_(scale.float().unsqueeze(-1)).round_().add_(8).clamp_(0, 15)
    return QuantizedRows(groups.to(torch.uint8).view(rows, padded_cols), scale, zero)


def dequantize_rows(q: QuantizedRows, group_size: int, cols: int | None = None) -> torch.Tensor:
    """fp32 weights the codes stand for (the first ``cols`` columns)."""
    rows, padded_cols = q.codes.shape
    groups = q.codes.view(rows, padded_cols // group_size, group_size).float() - 8
    w = groups * q.scales.float().unsqueeze(-1) + q.zeros.float().unsqueeze(-1)
    return w.view(rows, padded_cols)[:, : padded_cols if cols is None else cols]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 ``[rows, K]`` codes -> ``[rows, K / 2]`` bytes, column 2j in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_nibbles``."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).view(packed.shape[0], -1)
