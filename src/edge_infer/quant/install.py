"""Install quantized linears (tinygemm, or edge-infer's W4A8/W8A8 kernels) while loading, a block of rows at a time.

A linear's rows come from one or more checkpoint tensors (q/k/v and gate/up
are fused). They are read in blocks of whole 64-row tiles across those
tensors, quantized (bf16/fp32 checkpoints) or unpacked from their stored
codes (checkpoints written by ``edge-infer quantize``), and packed straight
into the kernel's final tensor, in the layout this CPU's kernel reads. The
load-time peak is therefore the packed model plus one block, never a
row-major copy of a whole linear.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from edge_infer.config import QuantConfig
from edge_infer.errors import CheckpointError
from edge_infer.models.layers.linear import Linear
from edge_infer.models.loader import CheckpointReader, LinearInstaller, release_staging
from edge_infer.quant.kernel import Int4Kernel, PackedWeights, require_int4_kernel
from edge_infer.quant.quantize import NonFiniteWeightError
from edge_infer.quant.sizes import check_quant_config, padded, repack_block_rows

# Names of the extra tensors a quantized checkpoint stores next to "<name>" (docs/quantization.md).
SCALE_SUFFIX = "_scale"
ZERO_SUFFIX = "_zero"
FLOAT_DTYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of checkpoint tensor ``name``."""

    name: str
    start: int
    stop: int


def row_block_pieces(extents: list[tuple[str, int]], block_rows: int) -> Iterator[tuple[int, list[Piece]]]:
    """Blocks of ``block_rows`` rows over tensors ``(name, rows)`` stacked along dim 0."""
    total = sum(rows for _, rows in extents)
    for start in range(0, total, block_rows):
        stop = min(total, start + block_rows)
        pieces, first = [], 0
        for name, rows in extents:
            lo, hi = max(start, first), min(stop, first + rows)
            if lo < hi:
                pieces.append(Piece(name, lo - first, hi - first))
            first += rows
        yield start, pieces


# The safetensors dtype of stored codes, by bits (docs/quantization.md).
CODE_DTYPES = {4: "U8", 8: "I8"}


def is_prequantized(reader: CheckpointReader, name: str) -> bool:
    return reader.info(name).dtype in CODE_DTYPES.values()


def fill_kernel(kernel: PackedWeights, reader: CheckpointReader, sources: tuple[str, ...], quant: QuantConfig,
                block_rows: int) -> None:
    """Write the linear stacked from ``sources`` into ``kernel`` a block of rows at a time: float weights
    quantized, a checkpoint's stored codes packed as they are."""
    rows, cols = kernel.out_features, kernel.in_features
    stored = [is_prequantized(reader, name) for name in sources]
    if any(stored) and not all(stored):
        raise CheckpointError(f"tensors {', '.join(sources)} mix stored codes and float weights; re-run edge-infer quantize")
    prequantized = all(stored)
    groups = padded(cols, quant.group_size) // quant.group_size
    width = padded(cols, quant.group_size) * quant.bits // 8 if prequantized else cols
    extents = []
    for name in sources:
        info = reader.info(name)
        if len(info.shape) != 2 or info.shape[1] != width:
            what = (f"{quant.bits}-bit codes of {width} bytes per row (group size {quant.group_size})" if prequantized
                    else f"{cols} columns")
            raise CheckpointError(f"tensor {name!r} has shape {info.shape}; config.json implies {what}")
        if prequantized and info.dtype != CODE_DTYPES[quant.bits]:
            raise CheckpointError(f"tensor {name!r} is {info.dtype}; {quant.bits}-bit codes are stored as {CODE_DTYPES[quant.bits]}")
        if not prequantized and info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {name!r} is {info.dtype}; {quant.name} quantizes F32, F16 or BF16 weights")
        extents.append((name, info.shape[0]))
    if sum(n for _, n in extents) != rows:
        raise CheckpointError(f"tensors {', '.join(sources)} give {sum(n for _, n in extents)} rows; config.json implies {rows}")
    for start, pieces in row_block_pieces(extents, block_rows):
        if prequantized:
            kernel.write_rows(start, *_read_codes(reader, pieces, groups, quant.symmetric))
            continue
        weight = _cat([reader.rows(p.name, p.start, p.stop) for p in pieces])
        try:
            kernel.write_weight_rows(start, weight, quant.symmetric)
        except NonFiniteWeightError as exc:
            raise CheckpointError(exc.located(_source_row(pieces, exc.row))) from None


def _source_row(pieces: list[Piece], row: int) -> str:
    """Row ``row`` of a block stacked from ``pieces``, as its tensor's name and row."""
    for p in pieces:
        if row < p.stop - p.start:
            return f"{p.name}, row {p.start + row}"
        row -= p.stop - p.start
    raise IndexError(row)


def _cat(blocks: list[torch.Tensor]) -> torch.Tensor:
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


def _read_codes(reader: CheckpointReader, pieces: list[Piece], groups: int,
                symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A block's stored codes (4 bits: two per byte, as stored), scales and zeros."""
    codes = _cat([reader.rows(p.name, p.start, p.stop) for p in pieces])
    scales = _cat([_side_tensor(reader, p, SCALE_SUFFIX, groups) for p in pieces])
    zeros = torch.zeros_like(scales) if symmetric else _cat([_side_tensor(reader, p, ZERO_SUFFIX, groups) for p in pieces])
    return codes, scales, zeros


def _side_tensor(reader: CheckpointReader, piece: Piece, suffix: str, groups: int) -> torch.Tensor:
    name = piece.name + suffix
    if name not in reader.index:
        raise CheckpointError(f"quantized checkpoint {reader.model_dir} lacks {name!r}; re-run edge-infer quantize")
    info = reader.info(name)
    if len(info.shape) != 2 or info.shape[1] != groups:
        raise CheckpointError(f"tensor {name!r} has shape {info.shape}; config.json's group size implies {groups} groups per row")
    return reader.rows(name, piece.start, piece.stop)


def quantized_installer(quant: QuantConfig, fallback: LinearInstaller) -> LinearInstaller:
    """Installer quantizing every decoder linear (and the head with quantize_head); ``fallback`` loads the rest."""
    check_quant_config(quant)
    if quant.tiles:
        from edge_infer.quant import native
        from edge_infer.quant.int8_kernels import W4A8Kernel, W4A16Kernel, W8A8Kernel

        kernel_class = W8A8Kernel if quant.bits == 8 else W4A8Kernel if quant.int8_activations else W4A16Kernel
        native.require(kernel_class.name)
    else:
        require_int4_kernel()
        kernel_class = Int4Kernel

    def install(linear: Linear, target: str, sources: tuple[str, ...], reader: CheckpointReader, dtype: torch.dtype) -> None:
        if target == "lm_head" and not quant.quantize_head:
            fallback(linear, target, sources, reader, dtype)
            return
        release_staging()  # a dense linear's staged rows (oneDNN) are not held beside this one's blocks
        kernel = kernel_class(linear.out_features, linear.in_features, quant.group_size, dtype)
        fill_kernel(kernel, reader, sources, quant, repack_block_rows(linear.in_features, quant.group_size))
        linear.kernel = kernel

    return install
