"""edge-infer's tile kernels: 4-bit (W4A8) and 8-bit (W8A8) weights times int8 activations, and 4-bit weights
times the activations as they are (W4A16).

``cpu_int4`` weights (the same codes, scales and zeros) or ``cpu_int8``
weights computed by edge-infer's own kernels (``csrc/``) instead of
PyTorch's. With int8 activations (cpu_w4a8, cpu_w8a8) the activations are
quantized per row and weight group as they enter, and the products run on
integer dot-product instructions: at one token a matrix-vector product then
runs at memory speed rather than tinygemm's dequantizing compute speed
(docs/quantization.md), for a small extra error from the 8-bit activations.
cpu_w4a16 keeps the activations in fp32 (no extra error): each code is
widened in registers and multiplied on fused multiply-adds at one to a few
rows, and a prompt's rows run on BLAS over dequantized blocks of the weight,
as cpu_int4's do.

Every ISA variant reads the same 64-row tile layout (csrc/isa.h) and gives
the same bits, so the resident size does not depend on the CPU and a model
computes the same tokens on AVX2, AVX-VNNI, AVX-512 and NEON.
"""
from __future__ import annotations

import torch

from edge_infer.models.weight_arena import packed_zeros
from edge_infer.quant import native
from edge_infer.quant.kernel import PackedWeights, prompt_matmul
from edge_infer.quant.quantize import NonFiniteWeightError, QuantizedRows, dequantize_rows
from edge_infer.quant.sizes import PROMPT_MIN_ROWS, WEIGHT_BLOCK_ROWS

TILE_ROWS = 64  # output rows per packed tile (csrc/isa.h)


class TileKernel(PackedWeights):
    """``x @ W.T`` for a weight ``[out_features, in_features]`` packed in 64-row tiles for ``csrc/``'s kernels.

    ``packed`` holds the codes and ``scales`` the bf16 scales (and, 4-bit, zeros) in the layouts of
    csrc/isa.h; rows are padded to whole tiles with zero codes and scales, which are never stored out.
    ``variant`` is the ISA variant it runs on (``native.require``; tests may name another).
    """

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

    def write_rows(self, start: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None) -> None:
        """Pack rows ``start .. start + len(codes)`` (``start`` a multiple of 64): ``codes [rows, Kp]``, or for
        4 bits ``[rows, Kp / 2]`` two per byte as a checkpoint stores them (``quantize.pack_nibbles``);
        ``scales`` and ``zeros`` ``[rows, Kp / group_size]`` (zeros: 4 bits only)."""
        n = self.out_features - start
        side = [t[:n].to(torch.bfloat16).contiguous() for t in ((scales, zeros) if self.bits == 4 else (scales,))]
        torch.ops.edge_infer.pack_into_tiles(codes[:n].to(self.packed.dtype).contiguous(), side[0],
                                             side[1] if self.bits == 4 else None, self.packed, self.scales,
                                             self.bits, self.group_size, self._first_tile(start))

    def write_weight_rows(self, start: int, weight: torch.Tensor, symmetric: bool) -> None:
        """Quantize float rows ``weight [rows, in_features]`` as ``quantize.quantize_rows`` does (the same codes
        and scales, and NonFiniteWeightError for a row without codes) and pack them from row ``start`` on."""
        bad = torch.ops.edge_infer.quantize_into_tiles(weight[: self.out_features - start].contiguous(), self.packed,
                                                       self.scales, self.bits, self.group_size, symmetric,
                                                       self._first_tile(start), self.variant)
        if bad >= 0:
            raise NonFiniteWeightError(bad)

    def _first_tile(self, start: int) -> int:
        if start % TILE_ROWS or not 0 <= start < self.out_features:
            raise ValueError(f"blocks of rows start on a 64-row tile inside the weight, not at row {start}")
        return start // TILE_ROWS

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self(x)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:  # pragma: no cover
        """``x @ W.T + bias`` in x's dtype."""
        raise NotImplementedError

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


class Int8ActivationKernel(TileKernel):
    """A tile kernel whose activations are quantized to int8 as they enter (W4A8, W8A8)."""

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The bias is added as each output tile is stored (the bits of a separate add, without its pass); the
        input is not padded to whole groups (the kernel takes the missing columns as zeros)."""
        lead = x.shape[:-1]
        y = torch.ops.edge_infer.int8_linear(x.reshape(-1, self.in_features).contiguous(), self.packed, self.scales,
                                             self.bits, self.group_size, self.out_features, self.variant, bias)
        return y.view(*lead, self.out_features)


class FourBitTiles(TileKernel):
    """4-bit codes: for 8 input columns k..k+7, a row's 4 bytes hold columns k+i (low nibble) and k+4+i."""

    bits = 4
    columns_per_step = 8

    def _unpack_codes(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.stack((rows & 15, rows >> 4), dim=2).reshape(rows.shape[0], self.cols_padded)


class W4A8Kernel(FourBitTiles, Int8ActivationKernel):
    name = "cpu-w4a8"


class W4A16Kernel(FourBitTiles):
    """The 4-bit tiles times the activations as they are, in fp32: fewer than PROMPT_MIN_ROWS rows on the W4A16 tile
    kernel (csrc/linear.cpp's w4a16_linear), more on BLAS over blocks of the weight dequantized by
    csrc/int4_rows.cpp (as cpu_int4's prompts)."""

    name = "cpu-w4a16"

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        if x.shape[0] < PROMPT_MIN_ROWS:
            y = torch.ops.edge_infer.w4a16_linear(x.contiguous(), self.packed, self.scales, self.group_size,
                                                  self.out_features, self.variant, bias)
            return y.view(*lead, self.out_features)
        per_block = WEIGHT_BLOCK_ROWS // TILE_ROWS
        blocks = [(t * TILE_ROWS, min(per_block, self.tiles - t) * TILE_ROWS) for t in range(0, self.tiles, per_block)]

        def dequantize(first: int, rows: int, w_t: torch.Tensor) -> None:
            torch.ops.edge_infer.w4_tiles_transposed(self.packed, self.scales, self.group_size, first // TILE_ROWS, w_t)

        y = prompt_matmul(self.padded_input(x), self.tiles * TILE_ROWS, blocks, dequantize)[:, : self.out_features]
        y = y + bias if bias is not None else y.contiguous()
        return y.view(*lead, self.out_features)


class W8A8Kernel(Int8ActivationKernel):
    """8-bit codes: for 4 input columns k..k+3, a row's 4 bytes are its 4 weights."""

    name = "cpu-w8a8"
    bits = 8
    columns_per_step = 4

    def _unpack_codes(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.reshape(rows.shape[0], self.cols_padded)
