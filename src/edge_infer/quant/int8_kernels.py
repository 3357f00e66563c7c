"""The int8-activation weight kernels: 4-bit (W4A8) and 8-bit (W8A8) weights times int8 activations.

``cpu_int4`` weights (the same codes, scales and zeros) or ``cpu_int8``
weights computed by edge-infer's own kernels (``csrc/``) instead of
PyTorch's: activations are quantized to int8 per row and weight group as
they enter, and the products run on integer dot-product instructions. At one
token a matrix-vector product then runs at memory speed rather than
tinygemm's dequantizing compute speed (docs/quantization.md), for a small
extra error from the 8-bit activations.

Every ISA variant reads the same 64-row tile layout (csrc/isa.h) and gives
the same bits, so the resident size does not depend on the CPU and a model
computes the same tokens on AVX2, AVX-VNNI, AVX-512 and NEON.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from edge_infer.models.weight_arena import packed_zeros
from edge_infer.quant import native
from edge_infer.quant.kernel import PackedWeights
from edge_infer.quant.quantize import QuantizedRows, dequantize_rows

TILE_ROWS = 64  # output rows per packed tile (csrc/isa.h)


class Int8ActivationKernel(PackedWeights):
    """``x @ W.T`` for a weight ``[out_features, in_features]`` packed in 64-row tiles for ``csrc/``'s kernels.

    ``packed`` holds the codes and ``scales`` the bf16 scales (and, 4-bit, zeros) in the layouts of
    csrc/isa.h; rows are padded to whole tiles with zero codes and scales, which are never stored out.
    ``variant`` is the ISA variant it runs on (``native.require``; tests may name another).
    """

    bits: int
    columns_per_step: int  # input columns per 4 bytes of a row in the packed layout

    def __init__(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype,
                 variant: str | None = None):
        chosen = native.require(self.name)
        super().__init__(out_features, in_features, group_size)
        self.dtype = dtype
        self.variant = variant or chosen
        self.tiles = -(-out_features // TILE_ROWS)
        groups = self.cols_padded // group_size
        self.packed = packed_zeros((self.tiles, self.cols_padded // self.columns_per_step, TILE_ROWS, 4),
                                   torch.uint8 if self.bits == 4 else torch.int8)
        self.scales = packed_zeros((self.tiles, groups, *((2,) if self.bits == 4 else ()), TILE_ROWS), torch.bfloat16)

    @property
    def label(self) -> str:
        return f"{self.name} [{self.variant}]"

    def resident(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.scales

    def write_rows(self, start: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:
        """Pack rows ``start .. start + len(codes)`` (``start`` a multiple of 64): ``codes [rows, Kp]``,
        ``scales`` and ``zeros`` ``[rows, Kp / group_size]`` (zeros ignored by 8-bit weights)."""
        assert start % TILE_ROWS == 0, "blocks must start on a row tile"
        n = min(codes.shape[0], self.out_features - start)
        tiles = -(-n // TILE_ROWS)
        pad = tiles * TILE_ROWS - n
        first = start // TILE_ROWS
        codes = F.pad(codes[:n].to(self.packed.dtype), (0, 0, 0, pad))
        self.packed[first:first + tiles] = self._pack_codes(codes.view(tiles, TILE_ROWS, self.cols_padded))
        side = torch.stack((scales[:n], zeros[:n])) if self.bits == 4 else scales[:n].unsqueeze(0)
        side = F.pad(side.to(torch.bfloat16), (0, 0, 0, pad)).view(len(side), tiles, TILE_ROWS, -1)
        # [parts, tiles, 64, groups] -> [tiles, groups, parts, 64] (8-bit: one part, squeezed)
        self.scales[first:first + tiles] = side.permute(1, 3, 0, 2).reshape(self.scales[first:first + tiles].shape)

    def _pack_codes(self, codes: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """``[tiles, 64, Kp]`` codes -> ``[tiles, Kp / columns_per_step, 64, 4]``."""
        raise NotImplementedError

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The bias is added as each output tile is stored (the bits of a separate add, without its pass); the
        input is not padded to whole groups (the kernel takes the missing columns as zeros)."""
        lead = x.shape[:-1]
        y = torch.ops.edge_infer.int8_linear(x.reshape(-1, self.in_features).contiguous(), self.packed, self.scales,
                                             self.bits, self.group_size, self.out_features, self.variant, bias)
        return y.view(*lead, self.out_features)

    def quantized_rows(self, ids: torch.Tensor) -> QuantizedRows:
        """The codes, scales and zeros of weight rows ``ids``."""
        ids = ids.reshape(-1).long()
        tile, r = ids // TILE_ROWS, ids % TILE_ROWS
        codes = self._unpack_codes(self.packed[tile, :, r])
        side = self.scales[tile, ..., r]  # [T, groups(, 2)]
        if self.bits == 4:
            return QuantizedRows(codes, side[..., 0], side[..., 1])
        return QuantizedRows(codes, side, torch.zeros_like(side))

    def _unpack_codes(self, rows: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        """``[T, Kp / columns_per_step, 4]`` packed bytes of T rows -> their codes ``[T, Kp]``."""
        raise NotImplementedError

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized weight rows ``[len(ids), in_features]`` in the activation dtype (an embedding lookup)."""
        return dequantize_rows(self.quantized_rows(ids), self.group_size, self.in_features).to(self.dtype)


class W4A8Kernel(Int8ActivationKernel):
    """4-bit codes: for 8 input columns k..k+7, a row's 4 bytes hold columns k+i (low nibble) and k+4+i."""

    name = "cpu-w4a8"
    bits = 4
    columns_per_step = 8

    def _pack_codes(self, codes: torch.Tensor) -> torch.Tensor:
        tiles = codes.shape[0]
        halves = codes.view(tiles, TILE_ROWS, self.cols_padded // 8, 2, 4)
        return (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).permute(0, 2, 1, 3)

    def _unpack_codes(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.stack((rows & 15, rows >> 4), dim=2).reshape(rows.shape[0], self.cols_padded)


class W8A8Kernel(Int8ActivationKernel):
    """8-bit codes: for 4 input columns k..k+3, a row's 4 bytes are its 4 weights."""

    name = "cpu-w8a8"
    bits = 8
    columns_per_step = 4

    def _pack_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.view(codes.shape[0], TILE_ROWS, self.cols_padded // 4, 4).permute(0, 2, 1, 3)

    def _unpack_codes(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.reshape(rows.shape[0], self.cols_padded)
