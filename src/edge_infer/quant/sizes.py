"""Exact resident sizes of cpu_int4 weights, and the settings a checkpoint carries.

Torch-free on purpose: the memory planner sizes quantized weights from the
config alone. The figures here are the same arithmetic ``quant.kernel``
allocates with, so a plan's weight item equals the loaded model's bytes.

Layout (see docs/quantization.md): a linear ``[N, K]`` is stored as
PyTorch's CPU int4 packed tensor, ``uint8 [Np, Kp / 2]``, plus one
scale-and-zero pair per group of ``group_size`` input columns,
``[Kp / group_size, Np, 2]`` in the activation dtype. ``Kp`` pads the input
dimension to a multiple of the group size and ``Np`` the output dimension
to a multiple of 16 (what the kernel accepts); padding is zero and is
sliced away, so any shape loads.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from edge_infer.engine.config import QuantConfig
from edge_infer.errors import CheckpointError, InvalidRequestError
from edge_infer.models.weights import WeightSpec

METHOD = "cpu_int4"
# The same weights computed with int8 activations (quant/w4a8.py): a name users pass, not a format.
W4A8_METHOD = "cpu_w4a8"
# Group sizes torch.ops.aten._weight_int4pack_mm_for_cpu accepts.
GROUP_SIZES = (32, 64, 128, 256)
# The kernel packs output rows in tiles; it needs the row count to be a multiple of 16.
ROW_MULTIPLE = 16
# The W4A8 kernel packs whole tiles of 64 rows, with bf16 scales and zeros whatever the activation dtype.
W4A8_ROW_MULTIPLE = 64
W4A8_SCALE_BYTES = 2
# Version of the on-disk layout written by `edge-infer quantize` (docs/quantization.md).
FORMAT_VERSION = 1
REPACK_MODES = ("blocked", "whole")
# Group sizes only `edge-infer quantize --simulate` takes (the kernel cannot run them): one
# group per row, or one per whole matrix (a deliberately bad quantizer, to check that fidelity ranks).
ROW_GROUP = 0
TENSOR_GROUP = -1
# Rows of a linear quantized and packed per step when loading: a multiple of the
# kernel's 64-row tile, sized so one block holds about this many weights. Smaller
# blocks lower the load peak but cost time: every block runs a dozen parallel ops.
REPACK_BLOCK_ELEMENTS = 1 << 20
# Working memory per weight of one block, besides its source rows (read, then
# concatenated: twice the source bytes): the fp32 copy quantized in place (4),
# uint8 codes (1), the int32 codes the packing op takes (4), packed bytes (0.5),
# rounded up. Measured: 14.7 B per bf16 weight when a 9728x896 linear is
# repacked whole (docs/quantization.md).
REPACK_BYTES_PER_ELEMENT = 12


def check_quant_config(quant: QuantConfig) -> None:
    """Refuse settings the kernel cannot run, before anything is read or loaded."""
    if quant.method != METHOD:
        raise InvalidRequestError(f"quantization method {quant.method!r} is not supported; use {METHOD} or {W4A8_METHOD}")
    if quant.group_size not in GROUP_SIZES:
        raise InvalidRequestError(
            f"cpu_int4 group size {quant.group_size} is not supported by PyTorch's CPU int4 kernel; "
            f"use one of {', '.join(map(str, GROUP_SIZES))} (128 is the usual choice)"
        )
    if quant.repack not in REPACK_MODES:
        raise InvalidRequestError(f"cpu_int4 repack mode {quant.repack!r} is not one of {', '.join(REPACK_MODES)}")


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def packed_rows(rows: int, quant: QuantConfig) -> int:
    """Output rows as the kernel packs them (padded to its row tile)."""
    return padded(rows, W4A8_ROW_MULTIPLE if quant.int8_activations else ROW_MULTIPLE)


def int4_nbytes(rows: int, cols: int, quant: QuantConfig, dtype_bytes: int) -> int:
    """Bytes of one packed int4 linear ``[rows, cols]``: codes plus scales and zeros, as its kernel holds them."""
    n, k = packed_rows(rows, quant), padded(cols, quant.group_size)
    scale_bytes = W4A8_SCALE_BYTES if quant.int8_activations else dtype_bytes
    return n * k // 2 + (k // quant.group_size) * n * 2 * scale_bytes


def is_quantized(spec: WeightSpec, quant: QuantConfig, tied: bool) -> bool:
    """Whether ``spec`` is held in int4: every linear of the decoder layers; the output
    head (its own tensor, or the embedding table of a tied model) only with quantize_head."""
    if spec.target == "lm_head" or (spec.target == "embed" and tied):
        return quant.quantize_head
    return spec.is_linear


def spec_nbytes(spec: WeightSpec, quant: QuantConfig, dtype_bytes: int, tied: bool) -> int:
    """Resident bytes of one tensor of ``weight_specs(cfg)`` under ``quant``."""
    if not is_quantized(spec, quant, tied):
        return spec.numel * dtype_bytes
    return linear_nbytes(spec, quant, dtype_bytes)


def linear_nbytes(spec: WeightSpec, quant: QuantConfig, dtype_bytes: int) -> int:
    """Resident bytes of a quantized linear: packed codes, scales and zeros
    (and, for the measuring-only ``keep_dense_copy`` alternative, the dense copy)."""
    check_quant_config(quant)
    rows, cols = spec.shape
    total = int4_nbytes(rows, cols, quant, dtype_bytes)
    if quant.keep_dense_copy:
        total += rows * cols * dtype_bytes
    return total


def repack_block_rows(cols: int, group_size: int) -> int:
    """Rows per load-time repack block: a multiple of 64 rows near REPACK_BLOCK_ELEMENTS weights."""
    k = padded(cols, group_size)
    return max(64, REPACK_BLOCK_ELEMENTS // k // 64 * 64)


def repack_transient_bytes(specs: list[WeightSpec], quant: QuantConfig, tied: bool, source_bytes: int) -> int:
    """Load-time working memory beyond the resident weights while quantizing or repacking.

    Blocked (default): one block of rows. ``whole`` (the measuring-only
    alternative): the largest quantized linear at once.
    """
    quantized = [s for s in specs if is_quantized(s, quant, tied)]
    if not quantized:
        return 0
    def block_rows(spec: WeightSpec) -> int:
        rows = packed_rows(spec.shape[0], quant)
        return rows if quant.repack == "whole" else min(rows, repack_block_rows(spec.shape[1], quant.group_size))

    per_element = 2 * source_bytes + REPACK_BYTES_PER_ELEMENT
    return max(block_rows(s) * padded(s.shape[1], quant.group_size) for s in quantized) * per_element


def checkpoint_quantization_config(quant: QuantConfig) -> dict[str, Any]:
    """The ``quantization_config`` entry `edge-infer quantize` writes into config.json."""
    return {
        "quant_method": METHOD,
        "format_version": FORMAT_VERSION,
        "bits": 4,
        "group_size": quant.group_size,
        "symmetric": quant.symmetric,
        "quantize_head": quant.quantize_head,
    }


def quant_config_from_checkpoint(raw: dict[str, Any]) -> QuantConfig:
    """The QuantConfig a quantized checkpoint was written with (its config.json entry)."""
    method = raw.get("quant_method")
    if method != METHOD:
        raise CheckpointError(
            f"config.json has quantization_config with quant_method={method!r}; edge-infer loads {METHOD!r} "
            f"checkpoints written by `edge-infer quantize` (other formats, e.g. GPTQ or AWQ, are not supported)"
        )
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"config.json has a {METHOD} quantization_config of format_version {version!r}; this edge-infer reads "
            f"version {FORMAT_VERSION}: re-run `edge-infer quantize` on the original checkpoint"
        )
    try:
        quant = QuantConfig(
            group_size=int(raw["group_size"]), symmetric=bool(raw["symmetric"]), quantize_head=bool(raw["quantize_head"])
        )
    except KeyError as exc:
        raise CheckpointError(f"config.json's quantization_config lacks {exc.args[0]!r}") from exc
    try:
        check_quant_config(quant)
    except InvalidRequestError as exc:
        raise CheckpointError(f"config.json's quantization_config: {exc}") from exc
    return quant


def resolve_checkpoint_quant(requested: QuantConfig | str | None, raw: dict[str, Any]) -> QuantConfig:
    """A quantized checkpoint loads with the settings it was written with; conflicting requests are refused."""
    stored = quant_config_from_checkpoint(raw)
    if requested in (None, METHOD):
        return stored
    if requested == W4A8_METHOD:  # the stored weights, computed with int8 activations
        return replace(stored, int8_activations=True)
    if requested == "none":
        raise InvalidRequestError(
            "this checkpoint holds cpu_int4 weights and cannot load unquantized; "
            "drop --quantization none or load the original checkpoint"
        )
    if isinstance(requested, QuantConfig):
        # Loading-time alternatives (repack, keep_dense_copy) and the kernel may differ; the format may not.
        loading = dict(repack=stored.repack, keep_dense_copy=stored.keep_dense_copy, int8_activations=stored.int8_activations)
        if replace(requested, **loading) != stored:
            raise InvalidRequestError(
                f"this checkpoint was quantized with group size {stored.group_size}, "
                f"{'symmetric' if stored.symmetric else 'asymmetric'}, quantize_head={stored.quantize_head}; "
                f"the requested settings differ: drop them (they are read from config.json) or quantize the "
                f"original checkpoint again"
            )
        return requested
    raise InvalidRequestError(f"quantization {requested!r} is not supported; use {METHOD}, {W4A8_METHOD} or none")
