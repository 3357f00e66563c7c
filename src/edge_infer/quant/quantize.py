"""Group-wise 4- and 8-bit quantization of weight rows, and the portable code format.

4 bits: the convention is the one PyTorch's CPU int4 kernel dequantizes
with: a code ``q`` in 0..15 stands for ``(q - 8) * scale + zero``, one
(scale, zero) pair per group of ``group_size`` consecutive input columns of a
row.

- symmetric: ``zero = 0``, ``scale = max|w| / 7`` (codes 1..15 are used);
- asymmetric: ``scale = (max - min) / 15``, ``zero = min + 8 * scale``, so
  code 0 is the group's minimum and code 15 its maximum.

8 bits (symmetric only): an int8 code ``q`` in -127..127 stands for
``q * scale``, ``scale = max|w| / 127`` per group. -128 is never used, so
the kernels can take ``|q|`` as an unsigned byte (csrc/isa_avx2.cpp).

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
    codes: torch.Tensor  # [rows, Kp]: uint8 0..15 (4 bits) or int8 -127..127 (8 bits)
    scales: torch.Tensor  # bf16 [rows, Kp / group_size]
    zeros: torch.Tensor  # bf16 [rows, Kp / group_size]; all zero when symmetric (always, for 8 bits)

    @property
    def bits(self) -> int:
        return 8 if self.codes.dtype == torch.int8 else 4


def _working_groups(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """One fp32 working copy of ``weight [rows, K]``, K zero-padded to whole groups, as ``[rows, groups, group_size]``
    (changed in place by the callers: this runs over every weight while loading)."""
    rows, cols = weight.shape
    padded_cols = -(-cols // group_size) * group_size
    w = weight.float()
    if padded_cols != cols:
        w = torch.nn.functional.pad(w, (0, padded_cols - cols))
    elif w is weight:
        w = w.clone()
    return w.view(rows, padded_cols // group_size, group_size)


class NonFiniteWeightError(ValueError):
    """A row holds a NaN or infinite weight, or a group too wide for a finite bf16 scale: it has no codes."""

    def __init__(self, row: int):
        super().__init__(f"row {row} holds a NaN or infinite weight, or one too large to quantize")
        self.row = row  # of the rows given

    def located(self, where: str) -> str:
        """The refusal with the row named by its checkpoint tensor (``where``: "<tensor>, row <n>")."""
        return (f"{where} holds a NaN or infinite weight, or one too large to quantize (its codes would mean nothing); "
                f"fix the checkpoint")


def quantize_rows(weight: torch.Tensor, group_size: int, symmetric: bool, bits: int = 4) -> QuantizedRows:
    """Quantize ``weight [rows, K]`` to ``bits`` (4 or 8; 8 is symmetric); K is zero-padded to a multiple of ``group_size``.
    Raises NonFiniteWeightError for a row without codes."""
    if bits == 8:
        return _quantize_rows_int8(weight, group_size)
    rows = weight.shape[0]
    groups = _working_groups(weight, group_size)
    padded_cols = groups.shape[1] * group_size
    lo, hi = torch.aminmax(groups, dim=-1)
    if symmetric:
        scale = (torch.maximum(-lo, hi) / 7).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
        zero = torch.zeros_like(scale)
    else:
        scale = ((hi - lo) / 15).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
        zero = (lo + 8 * scale.float()).to(SCALE_DTYPE)
        groups.sub_(zero.float().unsqueeze(-1))
    _check_finite(lo, hi, scale, zero)
    groups.div_(scale.float().unsqueeze(-1)).round_().add_(8).clamp_(0, 15)
    return QuantizedRows(groups.to(torch.uint8).view(rows, padded_cols), scale, zero)


def _quantize_rows_int8(weight: torch.Tensor, group_size: int) -> QuantizedRows:
    groups = _working_groups(weight, group_size)
    rows, padded_cols = groups.shape[0], groups.shape[1] * group_size
    lo, hi = torch.aminmax(groups, dim=-1)
    scale = (torch.maximum(-lo, hi) / 127).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
    _check_finite(lo, hi, scale)
    groups.div_(scale.float().unsqueeze(-1)).round_().clamp_(-127, 127)
    return QuantizedRows(groups.to(torch.int8).view(rows, padded_cols), scale, torch.zeros_like(scale))


def _check_finite(*per_group: torch.Tensor) -> None:
    """Refuse a group holding NaN or infinity, or whose bf16 scale or zero overflows: its codes would mean nothing."""
    ok = torch.ones_like(per_group[0], dtype=torch.bool)
    for t in per_group:
        ok &= torch.isfinite(t)
    if not bool(ok.all()):
        raise NonFiniteWeightError(int((~ok).any(dim=-1).nonzero()[0, 0]))


def dequantize_rows(q: QuantizedRows, group_size: int, cols: int | None = None) -> torch.Tensor:
    """fp32 weights the codes stand for (the first ``cols`` columns)."""
    rows, padded_cols = q.codes.shape
    groups = q.codes.view(rows, padded_cols // group_size, group_size).float() - (8 if q.bits == 4 else 0)
    w = groups * q.scales.float().unsqueeze(-1) + q.zeros.float().unsqueeze(-1)
    return w.view(rows, padded_cols)[:, : padded_cols if cols is None else cols]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 ``[rows, K]`` codes -> ``[rows, K / 2]`` bytes, column 2j in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_nibbles``."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).view(packed.shape[0], -1)
