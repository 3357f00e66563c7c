"""The int4 weight kernel: PyTorch's CPU tinygemm (``_weight_int4pack_mm_for_cpu``).

An ``Int4Kernel`` owns the only resident copy of its weight: the packed codes
``uint8 [Np, Kp / 2]`` in the kernel's own layout and one (scale, zero) pair
per group, ``[Kp / group_size, Np, 2]`` in the activation dtype. It is filled
a block of rows at a time (``write_rows``), so loading never holds the whole
weight unpacked.

The packed layout depends on the CPU capability PyTorch dispatched to
(AVX512: 64-row tiles, nibbles interleaved across 32 rows; AVX2: 32-row
tiles, interleaved across 16; otherwise 32-row tiles of row pairs; a partial
last tile always pairs rows), so it is built at load time and never written
to disk. Row tiles are independent, which makes blocked packing exact:
blocks start at multiples of 64 rows, a multiple of every tile size.

A prompt's rows go through BLAS instead (``sizes.PROMPT_MIN_ROWS``, ``prompt_matmul``, which cpu_w4a16 shares):
blocks of the weight dequantized by edge-infer's library (csrc/int4_rows.cpp) and multiplied in bf16 where the
CPU has native bf16 (oneDNN), else in fp32 (MKL). PyTorch's int4 kernel runs a prompt at about half of MKL's
fp32 rate on AVX2 and never uses AMX; the blocks' bytes are the plan's (``sizes.int4_prompt_bytes``).

``rows(ids)`` reads whole weight rows back out of the packed form. A tied
model whose head is quantized uses it as its embedding lookup, so the table
is resident once, in 4 bits. Neither the tile size nor where each row's
nibbles sit inside a tile is documented: ``tile_rows`` and
``_tile_positions`` learn both by packing probe matrices and check
themselves, so a PyTorch with another layout fails loudly instead of
reading wrong rows.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from edge_infer.errors import KernelUnavailableError
from edge_infer.models.layers.linear import WeightKernel, products_dtype
from edge_infer.models.weight_arena import packed_zeros
from edge_infer.quant.native import vector_variant
from edge_infer.quant.quantize import NonFiniteWeightError, quantize_rows, unpack_nibbles
from edge_infer.quant.sizes import PROMPT_BLOCK_ROWS, PROMPT_MIN_ROWS, ROW_MULTIPLE, WEIGHT_BLOCK_ROWS, padded

BLOCK_ALIGN = 64  # the largest row tile of any layout; blocks of rows start at multiples of it


def require_int4_kernel() -> None:
    """Refuse cpu_int4 by name on a PyTorch without the CPU int4 kernel (no silent fallback)."""
    ops = ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")
    missing = [op for op in ops if not hasattr(torch.ops.aten, op)]
    if missing:
        raise KernelUnavailableError(
            f"PyTorch {torch.__version__} lacks torch.ops.aten.{missing[0]}, the CPU int4 kernel cpu_int4 runs on; "
            f"install a CPU build of torch >= 2.5 or load the model without quantization"
        )


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """int32-convertible codes ``[rows, K]`` (rows a multiple of 16) -> the kernel's packed ``uint8 [rows, K / 2]``."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)


class PackedWeights(WeightKernel):
    """What the quantized kernels share: tensors in the kernel's own layout (``resident``), inputs
    zero-padded to whole groups, and the byte count."""

    bits: int  # 4 or 8

    def __init__(self, out_features: int, in_features: int, group_size: int):
        self.out_features = out_features
        self.in_features = in_features
        self.group_size = group_size
        self.cols_padded = padded(in_features, group_size)

    def padded_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., in_features]`` as a contiguous ``[rows, cols_padded]`` matrix."""
        x = x.reshape(-1, self.in_features)
        if self.cols_padded != self.in_features:
            x = F.pad(x, (0, self.cols_padded - self.in_features))
        return x.contiguous()

    def resident(self) -> tuple[torch.Tensor, ...]:  # pragma: no cover - interface
        """The tensors that hold the weight."""
        raise NotImplementedError

    def write_rows(self, start: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:  # pragma: no cover - interface
        """Pack rows ``start .. start + len(codes)`` (``start`` a multiple of 64) of codes already chosen."""
        raise NotImplementedError

    def write_weight_rows(self, start: int, weight: torch.Tensor, symmetric: bool) -> None:
        """Quantize float rows ``weight [rows, in_features]`` (``quantize.quantize_rows``) and pack them from row
        ``start`` on."""
        q = quantize_rows(weight, self.group_size, symmetric, self.bits)
        self.write_rows(start, q.codes, q.scales, q.zeros)

    @property
    def nbytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in self.resident())
        return n


class Int4Kernel(PackedWeights):
    """``x @ W.T`` for a weight ``[out_features, in_features]`` held as packed int4 (PyTorch's tinygemm)."""

    name = "cpu-int4"
    bits = 4

    def __init__(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype):
        super().__init__(out_features, in_features, group_size)
        self.rows_padded = padded(out_features, ROW_MULTIPLE)
        # Padding rows stay zero (codes 0 with scale 0 and zero 0: weight 0) and are sliced off.
        self.packed = packed_zeros((self.rows_padded, self.cols_padded // 2), torch.uint8)
        self.scales_zeros = packed_zeros((self.cols_padded // group_size, self.rows_padded, 2), dtype)
        self.quantizer = vector_variant()  # the ISA variant of edge-infer's library that quantizes here, if any

    def resident(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.scales_zeros

    def write_rows(self, start: int, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:
        """Pack rows ``start .. start + len(codes)``; ``start`` must be a multiple of 64.

        ``codes`` uint8/int32 ``[rows, Kp]``, or ``[rows, Kp / 2]`` two per byte as a checkpoint stores them;
        ``scales`` and ``zeros`` ``[rows, Kp / group_size]``.
        """
        if codes.shape[1] == self.cols_padded // 2:
            codes = unpack_nibbles(codes)
        end, stop = self._block_rows(start, codes.shape[0])
        if stop - start != codes.shape[0]:  # the last block: pad to the kernel's row multiple with zero rows
            codes = F.pad(codes, (0, 0, 0, stop - start - codes.shape[0]))
        self.packed[start:stop] = pack_codes(codes)
        self.scales_zeros[:, start:end, 0] = scales[: end - start].T.to(self.scales_zeros.dtype)
        self.scales_zeros[:, start:end, 1] = zeros[: end - start].T.to(self.scales_zeros.dtype)

    def write_weight_rows(self, start: int, weight: torch.Tensor, symmetric: bool) -> None:
        """As ``PackedWeights.write_weight_rows`` (the same codes and scales), quantized by edge-infer's native
        loop (csrc/pack.cpp) straight into int32 codes and the kernel's scale/zero pairs where its library runs
        here; with PyTorch operators elsewhere (about 3x the time)."""
        if self.quantizer is None:
            super().write_weight_rows(start, weight, symmetric)
            return
        end, stop = self._block_rows(start, weight.shape[0])
        codes = torch.empty(stop - start, self.cols_padded, dtype=torch.int32)
        bad = torch.ops.edge_infer.quantize_into_rows(weight[: end - start].contiguous(), codes, self.scales_zeros,
                                                      self.group_size, symmetric, start, self.quantizer)
        if bad >= 0:
            raise NonFiniteWeightError(bad)
        self.packed[start:stop] = pack_codes(codes)

    def _block_rows(self, start: int, n: int) -> tuple[int, int]:
        """(end, stop) of a block of ``n`` rows from ``start``: its last weight row, and its last row with the
        kernel's padding rows (past the last weight row, up to the row multiple)."""
        assert start % BLOCK_ALIGN == 0, "blocks must start on a row tile"
        end = min(start + n, self.out_features)
        return end, self.rows_padded if end == self.out_features else end

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.scales_zeros.dtype:
            raise TypeError(f"int4 linear holds {self.scales_zeros.dtype} scales; got {x.dtype} activations")
        lead = x.shape[:-1]
        x = self.padded_input(x)
        if x.shape[0] >= PROMPT_MIN_ROWS and self.quantizer is not None and _layout_readable():
            y = self._prompt_matmul(x)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_zeros)
        if self.rows_padded != self.out_features:
            y = y[:, : self.out_features].contiguous()
        return y.view(*lead, self.out_features)

    def _prompt_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x [m, cols_padded] @ W.T`` -> ``[m, rows_padded]`` on BLAS, over dequantized weight blocks."""
        full = tile_rows()
        whole = self.rows_padded // full * full
        blocks = [(n0, min(WEIGHT_BLOCK_ROWS, whole - n0)) for n0 in range(0, whole, WEIGHT_BLOCK_ROWS)]
        if whole < self.rows_padded:  # a partial last tile has a layout of its own
            blocks.append((whole, self.rows_padded - whole))

        def dequantize(first: int, rows: int, w_t: torch.Tensor) -> None:
            position = _tile_positions(full if first < whole else rows)
            torch.ops.edge_infer.int4_rows_transposed(self.packed, self.scales_zeros, position, self.group_size, first, w_t)

        return prompt_matmul(x, self.rows_padded, blocks, dequantize)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized weight rows ``[len(ids), in_features]`` in the activation dtype (an embedding lookup)."""
        ids = ids.reshape(-1).long()
        full = tile_rows()
        tile, r = ids // full, ids % full
        tail = self.rows_padded % full  # rows of the last tile when it is partial
        in_full = tile < self.rows_padded // full
        rows_in_tile = torch.where(in_full, full, tail)
        pos = _tile_positions(full)[r]
        if tail:
            pos = torch.where(in_full, pos, _tile_positions(tail)[r.clamp_max(tail - 1)])
        half_k = self.cols_padded // 2
        # Within a tile of t rows the bytes are k-major: column k's t nibbles fill t / 2 bytes.
        base = tile * full * half_k + pos // 2
        k = torch.arange(self.cols_padded)
        byte = self.packed.view(-1)[base[:, None] + k[None, :] * (rows_in_tile[:, None] // 2)]
        codes = (byte >> (4 * (pos % 2))[:, None]) & 15
        sz = self.scales_zeros[:, ids].float()  # [groups, T, 2]
        scale = sz[..., 0].T.repeat_interleave(self.group_size, dim=1)
        zero = sz[..., 1].T.repeat_interleave(self.group_size, dim=1)
        w = (codes.float() - 8) * scale + zero
        return w[:, : self.in_features].to(self.scales_zeros.dtype)


def prompt_matmul(x: torch.Tensor, out_rows: int, blocks: list[tuple[int, int]],
                  dequantize: Callable[[int, int, torch.Tensor], None]) -> torch.Tensor:
    """``x [m, Kp] @ W.T`` -> ``[m, out_rows]`` in x's dtype on BLAS: the weight's output rows a block
    ``(first, rows)`` at a time, dequantized by ``dequantize(first, rows, out [Kp, rows])``, x's rows
    PROMPT_BLOCK_ROWS at a time; the products in bf16 where the CPU has native bf16, else in fp32."""
    dtype = products_dtype(x.dtype)
    k = x.shape[1]
    out = torch.empty(x.shape[0], out_rows, dtype=x.dtype)
    block = torch.empty(k * max(rows for _, rows in blocks), dtype=dtype)
    for i0 in range(0, x.shape[0], PROMPT_BLOCK_ROWS):
        rows_in = x[i0 : i0 + PROMPT_BLOCK_ROWS].to(dtype)
        for first, rows in blocks:
            w_t = block[: k * rows].view(k, rows)
            dequantize(first, rows, w_t)
            out[i0 : i0 + PROMPT_BLOCK_ROWS, first : first + rows] = rows_in @ w_t
    return out


@functools.lru_cache(maxsize=1)
def _layout_readable() -> bool:
    """Whether this PyTorch's packed layout, its whole tiles' and every partial last tile's (a multiple of
    ROW_MULTIPLE rows), is one the library can dequantize; else prompts stay on the int4 kernel."""
    try:
        full = tile_rows()
        for rows in range(ROW_MULTIPLE, full + 1, ROW_MULTIPLE):
            _tile_positions(rows)
    except KernelUnavailableError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def tile_rows() -> int:
    """Rows per full tile of this PyTorch's packed layout (64 on AVX512, 32 on AVX2 and elsewhere).

    Packing a 128 x 4 matrix whose only nonzero column is column 1: tile 0's
    bytes are k-major, so its first nonzero byte sits at (tile rows) / 2.
    """
    probe = torch.zeros(128, 4, dtype=torch.int32)
    probe[:, 1] = 1
    first = int(torch.nonzero(pack_codes(probe).view(-1))[0])
    if 2 * first not in (16, 32, 64) or BLOCK_ALIGN % (2 * first):
        raise KernelUnavailableError(_LAYOUT_ERROR)
    return 2 * first


@functools.lru_cache(maxsize=None)
def _tile_positions(n_rows: int) -> torch.Tensor:
    """For a tile of ``n_rows`` rows: each row's nibble position (2 * byte + high) within one column.

    Learned by packing probes whose code in row r is bit b of r, then checked
    against a random matrix packed whole.
    """
    rows = torch.arange(n_rows)
    owner = torch.zeros(n_rows, dtype=torch.long)  # nibble position -> row
    for bit in range(max(1, (n_rows - 1).bit_length())):
        probe = ((rows >> bit) & 1)[:, None].expand(n_rows, 2)
        column0 = pack_codes(probe).view(-1)[: n_rows // 2].long()
        nibbles = torch.stack((column0 & 15, column0 >> 4), dim=-1).view(-1)
        owner |= nibbles << bit
    if not torch.equal(owner.sort().values, rows):
        raise KernelUnavailableError(_LAYOUT_ERROR)
    position = torch.empty_like(owner)
    position[owner] = rows
    _check_layout(n_rows, position)
    return position


def _check_layout(n_rows: int, position: torch.Tensor) -> None:
    gen = torch.Generator().manual_seed(n_rows)
    cols = 64
    codes = torch.randint(0, 16, (n_rows, cols), generator=gen, dtype=torch.int32)
    packed = pack_codes(codes).view(-1).long()
    k = torch.arange(cols)
    byte = packed[(position // 2)[:, None] + k[None, :] * (n_rows // 2)]
    if not torch.equal((byte >> (4 * (position % 2))[:, None]) & 15, codes.long()):
        raise KernelUnavailableError(_LAYOUT_ERROR)


_LAYOUT_ERROR = (
    "this PyTorch build packs int4 weights in a layout edge-infer cannot read rows from, so a tied output "
    "head cannot be quantized and still serve as the embedding; load without --quantize-head"
)
