"""16-bit weights at 2 bytes where bf16 arithmetic is not native: the W16A32 kernel.

On a CPU without native bf16 (AVX2, AVX-512 without avx512_bf16, ARM without
bf16) bf16 products are emulated, so edge-infer computes in fp32; a
row-major fp32 copy of a bf16 or fp16 checkpoint would double its resident
bytes. ``W16A32Kernel`` keeps the checkpoint's 16-bit weights exactly as
stored, in 64-row tiles (csrc/isa.h), and widens them to fp32 in registers
(a shift for bf16, F16C / fcvtl for fp16), with fp32 activations: 2 bytes per
weight, the same values. A tied model's table is held once, by the head, and
the embedding lookup reads rows from it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from edge_infer.errors import CheckpointError
from edge_infer.models.layers.linear import Linear
from edge_infer.models.loader import CheckpointReader
from edge_infer.models.weight_arena import packed_zeros
from edge_infer.quant import native
from edge_infer.quant.install import row_block_pieces
from edge_infer.quant.kernel import PackedWeights
from edge_infer.quant.sizes import repack_block_rows

TILE_ROWS = 64
# The checkpoint dtypes kept as they are.
STORED = {"BF16": torch.bfloat16, "F16": torch.float16}
# Activation rows from which a product widens tiles into fp32 scratch for PyTorch's GEMM instead (prefill), and
# the scratch's size (the plan's activation item covers it: a few MiB against a chunk's activations).
GEMM_ROWS = 16
GEMM_SCRATCH_BYTES = 4 << 20


class W16A32Kernel(PackedWeights):
    """``x @ W.T`` for fp32 ``x`` and a 16-bit weight held as ``packed`` ``[Np / 64, K, 64]`` (bf16 or fp16)."""

    name = "cpu-w16a32"

    def __init__(self, out_features: int, in_features: int, storage: torch.dtype, variant: str | None = None):
        chosen = native.require(self.name)
        super().__init__(out_features, in_features, group_size=1)
        self.variant = variant or chosen
        self.packed = packed_zeros((-(-out_features // TILE_ROWS), in_features, TILE_ROWS), storage)

    @property
    def label(self) -> str:
        return f"{self.name} [{self.variant}]"

    def resident(self) -> tuple[torch.Tensor, ...]:
        return (self.packed,)

    def write_rows(self, start: int, rows: torch.Tensor) -> None:
        """Rows ``start .. start + len(rows)`` of the weight (``start`` a multiple of 64), in the storage dtype."""
        assert start % TILE_ROWS == 0, "blocks must start on a row tile"
        n = min(rows.shape[0], self.out_features - start)
        tiles = -(-n // TILE_ROWS)
        block = F.pad(rows[:n], (0, 0, 0, tiles * TILE_ROWS - n)).view(tiles, TILE_ROWS, self.in_features)
        self.packed[start // TILE_ROWS:start // TILE_ROWS + tiles] = block.transpose(1, 2)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features).contiguous()
        if x.shape[0] >= GEMM_ROWS:
            return self._gemm(x).view(*lead, self.out_features)
        y = torch.ops.edge_infer.w16_linear(x, self.packed, self.out_features, self.variant)
        return y.view(*lead, self.out_features)

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        """Many rows (a prefill chunk): widen a few tiles at a time into fp32 scratch and multiply with PyTorch's
        GEMM, which blocks for cache better than one multiply-add per weight and row. The scratch is transient
        (GEMM_SCRATCH_BYTES); nothing wider than 16 bits stays resident."""
        y = torch.empty(x.shape[0], self.out_features)
        step = max(1, GEMM_SCRATCH_BYTES // (TILE_ROWS * self.in_features * 4))  # tiles per scratch
        for t in range(0, self.packed.shape[0], step):
            w = self.packed[t:t + step].transpose(1, 2).float().reshape(-1, self.in_features)  # rows in order
            first = t * TILE_ROWS
            rows = min(w.shape[0], self.out_features - first)
            y[:, first:first + rows] = F.linear(x, w[:rows])
        return y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Weight rows ``[len(ids), in_features]`` in fp32 (an embedding lookup)."""
        ids = ids.reshape(-1).long()
        return self.packed[ids // TILE_ROWS, :, ids % TILE_ROWS].float()


def stored_dtype(reader: CheckpointReader, sources: tuple[str, ...]) -> torch.dtype:
    """The one 16-bit dtype ``sources`` are stored in (refused: 32-bit or mixed tensors, which the plan never sends here)."""
    dtypes = {reader.info(name).dtype for name in sources}
    if len(dtypes) != 1 or next(iter(dtypes)) not in STORED:
        raise CheckpointError(f"tensors {', '.join(sources)} are {', '.join(sorted(dtypes))}; the W16A32 kernel keeps "
                              f"BF16 or F16 weights as they are (load with --weight-backend dense)")
    return STORED[dtypes.pop()]


def install_widened(linear: Linear, target: str, sources: tuple[str, ...], reader: CheckpointReader,
                    dtype: torch.dtype) -> None:
    """A ``LinearInstaller``: the 16-bit rows packed into tiles a block at a time (the peak is one block)."""
    kernel = W16A32Kernel(linear.out_features, linear.in_features, stored_dtype(reader, sources))
    shapes = [reader.info(name).shape for name in sources]
    if any(len(s) != 2 or s[1] != linear.in_features for s in shapes):
        raise CheckpointError(f"tensors {', '.join(sources)} have shapes {shapes}; config.json implies "
                              f"{linear.in_features} columns")
    extents = [(name, shape[0]) for name, shape in zip(sources, shapes)]
    if sum(rows for _, rows in extents) != linear.out_features:
        raise CheckpointError(f"tensors {', '.join(sources)} give {sum(r for _, r in extents)} rows; "
                              f"config.json implies {linear.out_features}")
    for start, pieces in row_block_pieces(extents, repack_block_rows(linear.in_features, 1)):
        kernel.write_rows(start, torch.cat([reader.rows(p.name, p.start, p.stop) for p in pieces]))
    linear.kernel = kernel
