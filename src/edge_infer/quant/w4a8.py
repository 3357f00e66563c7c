"""The W4A8 kernel: int4 weights times int8 activations on AVX512-VNNI CPUs.

``cpu_int4`` weights (the same codes, scales and zeros) computed by our own
kernel, ``csrc/w4a8.cpp``, instead of PyTorch's tinygemm: activations are
quantized to int8 per row and weight group as they enter, and the products
run on integer dot-product instructions. At one token a matrix-vector
product then runs at memory speed rather than tinygemm's dequantizing
compute speed (4-6x faster on this machine class, see docs/quantization.md),
for a small extra error from the 8-bit activations.

The library is built on first use (``w4a8_build``). Anything missing is
refused by name: there is no silent fall back to tinygemm.
"""
from __future__ import annotations

import functools

import torch

from edge_infer.errors import KernelUnavailableError
from edge_infer.hardware.cpu import detect
from edge_infer.hardware.kernels import KERNELS
from edge_infer.quant import w4a8_build
from edge_infer.quant.kernel import PackedInt4
from edge_infer.quant.quantize import QuantizedRows, dequantize_rows

TILE_ROWS = 64  # output rows per packed tile (csrc/w4a8.cpp)


def missing_requirement() -> str | None:
    """Why the W4A8 kernel cannot run here, or None when it can."""
    reason = KERNELS["cpu-w4a8"].missing(detect())
    if reason is not None:
        return f"{reason}; use cpu_int4"
    return w4a8_build.missing_toolchain()


def require_w4a8_kernel() -> None:
    """Build (once) and load the kernel; a RuntimeError names what is missing."""
    reason = missing_requirement()
    if reason is not None:
        raise KernelUnavailableError(f"cpu_w4a8: {reason}")
    _load_extension()


@functools.lru_cache(maxsize=1)
def _load_extension() -> None:
    """Load the built library, building it first if these sources, flags and torch have none yet."""
    library = w4a8_build.library_path()
    if not library.exists():
        w4a8_build.build(library)
    torch.ops.load_library(str(library))


class W4A8Kernel(PackedInt4):
    """``x @ W.T`` for a weight ``[out_features, in_features]`` held as int4 in ``csrc/w4a8.cpp``'s layout.

    ``packed`` uint8 ``[Np / 64, Kp / 8, 64, 4]`` and ``scales_zeros`` bf16
    ``[Np / 64, Kp / group_size, 2, 64]`` (see the kernel source); ``Np`` pads the
    rows to whole tiles with zero codes and scales, which the kernel never stores.
    """

    name = "cpu-w4a8"

    def __init__(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype):
        require_w4a8_kernel()
        super().__init__(out_features, in_features, group_size)
        self.dtype = dtype
        tiles = -(-out_features // TILE_ROWS)
        self.packed = torch.zeros(tiles, self.cols_padded // 8, TILE_ROWS, 4, dtype=torch.uint8)
        self.scales_zeros = torch.zeros(tiles, self.cols_padded // group_size, 2, TILE_ROWS, dtype=torch.bfloat16)

    def write_rows(self, start: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:
        """Pack rows ``start .. start + len(codes)`` (``start`` a multiple of 64); arguments as ``Int4Kernel.write_rows``."""
        assert start % TILE_ROWS == 0, "blocks must start on a row tile"
        n = min(codes.shape[0], self.out_features - start)
        tiles = -(-n // TILE_ROWS)
        rows = tiles * TILE_ROWS
        pad = rows - n
        codes = torch.nn.functional.pad(codes[:n].to(torch.uint8), (0, 0, 0, pad))
        kp, groups = self.cols_padded, self.cols_padded // self.group_size
        # Column k + 4 + i shares a byte with column k + i (i < 4) in every block of 8 columns.
        halves = codes.view(tiles, TILE_ROWS, kp // 8, 2, 4)
        byte = halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)
        first = start // TILE_ROWS
        self.packed[first:first + tiles] = byte.permute(0, 2, 1, 3)
        sz = torch.stack((scales[:n], zeros[:n])).to(torch.bfloat16)  # [2, n, groups]
        sz = torch.nn.functional.pad(sz, (0, 0, 0, pad)).view(2, tiles, TILE_ROWS, groups)
        self.scales_zeros[first:first + tiles] = sz.permute(1, 3, 0, 2)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.edge_infer.w4a8_linear(self.padded_input(x), self.packed, self.scales_zeros, self.group_size,
                                             self.out_features)
        return y.view(*lead, self.out_features)

    def quantized_rows(self, ids: torch.Tensor) -> QuantizedRows:
        """The codes, scales and zeros of weight rows ``ids``."""
        ids = ids.reshape(-1).long()
        tile, r = ids // TILE_ROWS, ids % TILE_ROWS
        byte = self.packed[tile, :, r]  # [T, Kp / 8, 4]
        codes = torch.stack((byte & 15, byte >> 4), dim=2).reshape(len(ids), self.cols_padded)
        sz = self.scales_zeros[tile, :, :, r]  # [T, groups, 2]
        return QuantizedRows(codes, sz[..., 0], sz[..., 1])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized weight rows ``[len(ids), in_features]`` in the activation dtype (an embedding lookup)."""
        w = dequantize_rows(self.quantized_rows(ids), self.group_size, self.in_features)
        return w.to(self.dtype)
