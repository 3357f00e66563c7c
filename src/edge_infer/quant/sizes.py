"""Exact resident sizes of quantized weights, and the settings a checkpoint carries.

Torch-free on purpose: the memory planner sizes quantized weights from the
config alone. The figures here are the same arithmetic ``quant.kernel`` and
``quant.int8_kernels`` allocate with, so a plan's weight item equals the
loaded model's bytes.

Layouts (see docs/quantization.md): a linear ``[N, K]`` on tinygemm
(cpu_int4) is PyTorch's CPU int4 packed tensor, ``uint8 [Np, Kp / 2]``, plus
one scale-and-zero pair per group of ``group_size`` input columns,
``[Kp / group_size, Np, 2]`` in the activation dtype, ``Np`` a multiple of
16. On edge-infer's int8 kernels (cpu_w4a8, cpu_w8a8) it is ``Np * Kp / 2``
(4-bit) or ``Np * Kp`` (8-bit) code bytes plus bf16 scales (and, 4-bit,
zeros) per group, ``Np`` a multiple of 64, the same on every ISA variant;
cpu_w4a16 holds the 4-bit weights as cpu_w4a8 does.
``Kp`` pads the input dimension to a multiple of the group size; padding is
zero and is sliced away, so any shape loads.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from edge_infer.config import METHOD_KERNELS, QuantConfig
from edge_infer.errors import CheckpointError, InvalidRequestError
from edge_infer.models.encoder_weights import is_tower_spec
from edge_infer.models.weights import WeightSpec

# The weight formats by bits, as config.json's quantization_config names them.
METHOD = "cpu_int4"
INT8_METHOD = "cpu_int8"
FORMATS = {4: METHOD, 8: INT8_METHOD}
# The same 4-bit weights computed with int8 activations (quant/int8_kernels.py): a name users pass, not a format.
W4A8_METHOD = "cpu_w4a8"
# The same 4-bit weights in edge-infer's tiles times the activations as they are: a name too.
W4A16_METHOD = "cpu_w4a16"
# The only kernel of the 8-bit format.
W8A8_METHOD = "cpu_w8a8"
# Group sizes torch.ops.aten._weight_int4pack_mm_for_cpu accepts (and the int8 kernels, which take multiples of 16).
GROUP_SIZES = (32, 64, 128, 256)
# The kernel packs output rows in tiles; it needs the row count to be a multiple of 16.
ROW_MULTIPLE = 16
# The int8 kernels pack whole tiles of 64 rows, with bf16 scales (and zeros) whatever the activation dtype.
INT8_KERNEL_ROW_MULTIPLE = 64
INT8_KERNEL_SCALE_BYTES = 2
# Version of the on-disk layout written by `edge-infer quantize` (docs/quantization.md).
FORMAT_VERSION = 1
# Group sizes only `edge-infer quantize --simulate` takes (the kernel cannot run them): one
# group per row, or one per whole matrix (a deliberately bad quantizer, to check that fidelity ranks).
ROW_GROUP = 0
TENSOR_GROUP = -1
# Rows of a linear quantized and packed per step when loading: a multiple of the
# kernel's 64-row tile, sized so one block holds about this many weights. Smaller
# blocks lower the load peak but cost time: every block runs a dozen parallel ops.
REPACK_BLOCK_ELEMENTS = 1 << 20
# Working memory per weight of one block, besides its source rows (read, then
# concatenated: twice the source bytes): for cpu_int4 quantized by PyTorch
# operators (no edge-infer library here), the fp32 copy quantized in place (4),
# uint8 codes (1), the int32 codes the packing op takes (4), packed bytes (0.5),
# rounded up. Measured: 14.7 B per bf16 weight when a 9728x896 linear is
# repacked whole (docs/quantization.md). With the library (csrc/pack.cpp)
# cpu_int4 needs the int32 codes and packed bytes only (4.5), and the int8
# kernels quantize straight into their tiles: for them the figure is a bound.
REPACK_BYTES_PER_ELEMENT = 12


def check_quant_config(quant: QuantConfig) -> None:
    """Refuse settings the kernel cannot run, before anything is read or loaded."""
    if quant.bits not in FORMATS:
        raise InvalidRequestError(f"{quant.bits}-bit weights are not supported; use 4 ({METHOD}) or 8 ({INT8_METHOD})")
    if quant.bits == 8 and not (quant.int8_activations and quant.symmetric):
        raise InvalidRequestError(f"8-bit weights are symmetric and run on {W8A8_METHOD} (int8 activations) only")
    if quant.group_size not in GROUP_SIZES:
        raise InvalidRequestError(
            f"{quant.name} group size {quant.group_size} is not supported by its kernel; "
            f"use one of {', '.join(map(str, GROUP_SIZES))} (128 is the usual choice)"
        )


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# The prompt path of cpu_int4 and cpu_w4a16 (quant/kernel.py, prompt_matmul): products with at least PROMPT_MIN_ROWS
# activation rows run on BLAS, the rows PROMPT_BLOCK_ROWS at a time, the weight dequantized WEIGHT_BLOCK_ROWS
# output rows at a time (each block once per block of rows: ~1/256 of the products' work).
PROMPT_MIN_ROWS = 64
PROMPT_BLOCK_ROWS = 256
WEIGHT_BLOCK_ROWS = 128


def int4_prompt_bytes(rows: int, width: int, dtype_bytes: int, native_bf16: bool) -> int:
    """What the prompt path of cpu_int4 and cpu_w4a16 holds beside a product's input and output when the product has ``rows`` rows
    (nothing under PROMPT_MIN_ROWS): a block of them and a dequantized weight block, ``width`` (padded) columns
    each, in fp32 (bf16 where the CPU has native bf16)."""
    if rows < PROMPT_MIN_ROWS or not width:
        return 0
    product_bytes = dtype_bytes if dtype_bytes == 2 and native_bf16 else 4
    return product_bytes * width * (min(rows, PROMPT_BLOCK_ROWS) + WEIGHT_BLOCK_ROWS)


def int4_prompt_widths(specs: list[WeightSpec], decoder: QuantConfig | None,
                       towers: QuantConfig | None) -> tuple[int, int]:
    """The widest padded input among the decoder's linears and among a thinker's towers' that run on cpu_int4 or
    cpu_w4a16 (0 where none does)."""
    def widest(quant: QuantConfig | None, in_towers: bool) -> int:
        if quant is None or quant.int8_activations:
            return 0
        return max((padded(s.shape[1], quant.group_size) for s in specs
                    if s.is_linear and len(s.shape) == 2 and is_tower_spec(s) == in_towers), default=0)

    return widest(decoder, False), widest(towers, True)


def packed_rows(rows: int, quant: QuantConfig) -> int:
    """Output rows as the kernel packs them (padded to its row tile)."""
    return padded(rows, INT8_KERNEL_ROW_MULTIPLE if quant.tiles else ROW_MULTIPLE)


def quantized_nbytes(rows: int, cols: int, quant: QuantConfig, dtype_bytes: int) -> int:
    """Bytes of one packed linear ``[rows, cols]``: codes plus scales (and zeros), as its kernel holds them."""
    n, k = packed_rows(rows, quant), padded(cols, quant.group_size)
    scale_bytes = INT8_KERNEL_SCALE_BYTES if quant.tiles else dtype_bytes
    per_group = 1 if quant.bits == 8 else 2  # 8-bit weights are symmetric: no zeros
    return n * k * quant.bits // 8 + (k // quant.group_size) * n * per_group * scale_bytes


def widened_spec_nbytes(spec: WeightSpec, dtype_bytes: int, tied: bool) -> int:
    """Resident bytes of one tensor when a 16-bit checkpoint runs on the W16A32 kernel (quant/widened.py): every
    decoder linear at 2 bytes in 64-row tiles (a tied table once, held by the head), a separate embedding table
    at 2 bytes, the rest (norms; a thinker's towers, dense unless --encoder-quantization) in the activation dtype."""
    if is_tower_spec(spec):
        return spec.numel * dtype_bytes
    if spec.is_linear or (spec.target == "embed" and tied):
        return padded(spec.shape[0], INT8_KERNEL_ROW_MULTIPLE) * spec.shape[1] * 2
    return spec.numel * (2 if spec.target == "embed" else dtype_bytes)


def is_quantized(spec: WeightSpec, quant: QuantConfig, tied: bool) -> bool:
    """Whether ``spec`` is held in int4: every linear of the decoder layers; the output
    head (its own tensor, or the embedding table of a tied model) only with quantize_head. A thinker's
    towers follow --encoder-quantization, not the decoder's setting: not by ``quant``."""
    if is_tower_spec(spec):
        return False
    if spec.target == "lm_head" or (spec.target == "embed" and tied):
        return quant.quantize_head
    return spec.is_linear


def spec_nbytes(spec: WeightSpec, quant: QuantConfig, dtype_bytes: int, tied: bool) -> int:
    """Resident bytes of one tensor of ``weight_specs(cfg)`` under ``quant``."""
    if not is_quantized(spec, quant, tied):
        return spec.numel * dtype_bytes
    return linear_nbytes(spec, quant, dtype_bytes)


def linear_nbytes(spec: WeightSpec, quant: QuantConfig, dtype_bytes: int) -> int:
    """Resident bytes of a quantized linear: packed codes, scales and zeros."""
    check_quant_config(quant)
    rows, cols = spec.shape
    return quantized_nbytes(rows, cols, quant, dtype_bytes)


def repack_block_rows(cols: int, group_size: int) -> int:
    """Rows per load-time repack block: a multiple of 64 rows near REPACK_BLOCK_ELEMENTS weights."""
    k = padded(cols, group_size)
    return max(64, REPACK_BLOCK_ELEMENTS // k // 64 * 64)


def repack_transient_bytes(specs: list[WeightSpec], quant: QuantConfig, tied: bool, source_bytes: int) -> int:
    """Load-time working memory beyond the resident weights while quantizing or repacking: one block of rows."""
    quantized = [s for s in specs if is_quantized(s, quant, tied)]
    if not quantized:
        return 0

    def block_rows(spec: WeightSpec) -> int:
        return min(packed_rows(spec.shape[0], quant), repack_block_rows(spec.shape[1], quant.group_size))

    per_element = 2 * source_bytes + REPACK_BYTES_PER_ELEMENT
    return max(block_rows(s) * padded(s.shape[1], quant.group_size) for s in quantized) * per_element


def widened_transient_bytes(specs: list[WeightSpec]) -> int:
    """Load-time working memory of the W16A32 path: one block of 16-bit rows as read, concatenated and padded."""
    return max(min(s.shape[0], repack_block_rows(s.shape[1], 1)) * s.shape[1] * 2 * 3 for s in specs
               if s.is_linear and not is_tower_spec(s))


def checkpoint_quantization_config(quant: QuantConfig, towers: bool = False) -> dict[str, Any]:
    """The ``quantization_config`` entry `edge-infer quantize` writes into config.json; ``towers``: a thinker's
    media towers are stored as codes too, in the decoder's format."""
    return {
        "quant_method": quant.method,
        "format_version": FORMAT_VERSION,
        "bits": quant.bits,
        "group_size": quant.group_size,
        "symmetric": quant.symmetric,
        "quantize_head": quant.quantize_head,
        **({"towers": True} if towers else {}),
    }


def stored_towers(raw: dict[str, Any] | None) -> bool:
    """Whether a checkpoint's ``quantization_config`` says its media towers are stored as codes."""
    return bool((raw or {}).get("towers"))


def quant_config_from_checkpoint(raw: dict[str, Any]) -> QuantConfig:
    """The QuantConfig a quantized checkpoint was written with (its config.json entry)."""
    method = raw.get("quant_method")
    bits = {name: bits for bits, name in FORMATS.items()}.get(method)
    if bits is None:
        raise CheckpointError(
            f"config.json has quantization_config with quant_method={method!r}; edge-infer loads "
            f"{' and '.join(map(repr, FORMATS.values()))} checkpoints written by `edge-infer quantize` (other formats, "
            f"e.g. GPTQ or AWQ, are not supported)"
        )
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"config.json has a {method} quantization_config of format_version {version!r}; this edge-infer reads "
            f"version {FORMAT_VERSION}: re-run `edge-infer quantize` on the original checkpoint"
        )
    try:
        quant = QuantConfig(bits=bits, group_size=int(raw["group_size"]), symmetric=bool(raw["symmetric"]),
                            quantize_head=bool(raw["quantize_head"]), kernel="int8" if bits == 8 else "tinygemm")
    except KeyError as exc:
        raise CheckpointError(f"config.json's quantization_config lacks {exc.args[0]!r}") from exc
    try:
        check_quant_config(quant)
    except InvalidRequestError as exc:
        raise CheckpointError(f"config.json's quantization_config: {exc}") from exc
    return quant


def resolve_checkpoint_quant(requested: QuantConfig | str | None, raw: dict[str, Any]) -> QuantConfig:
    """A quantized checkpoint loads with the settings it was written with; conflicting requests are refused.

    The 4-bit format loads on tinygemm (cpu_int4), on edge-infer's tiles (cpu_w4a16) or with int8 activations
    (cpu_w4a8); the 8-bit format on cpu_w8a8 only.
    """
    stored = quant_config_from_checkpoint(raw)
    kernels = (METHOD, W4A16_METHOD, W4A8_METHOD) if stored.bits == 4 else (W8A8_METHOD,)
    if requested is None:
        return stored
    if requested == "none":
        raise InvalidRequestError(
            f"this checkpoint holds {stored.method} weights and cannot load unquantized; "
            f"drop --quantization none or load the original checkpoint"
        )
    if isinstance(requested, str) and requested in kernels:
        return replace(stored, kernel=METHOD_KERNELS[requested])
    if isinstance(requested, QuantConfig) and requested.name in kernels:
        # The kernel may differ; the format may not.
        if replace(requested, kernel=stored.kernel) != stored:
            raise InvalidRequestError(
                f"this checkpoint was quantized with group size {stored.group_size}, "
                f"{'symmetric' if stored.symmetric else 'asymmetric'}, quantize_head={stored.quantize_head}; "
                f"the requested settings differ: drop them (they are read from config.json) or quantize the "
                f"original checkpoint again"
            )
        return requested
    name = requested.name if isinstance(requested, QuantConfig) else requested
    raise InvalidRequestError(
        f"this checkpoint holds {stored.bits}-bit {stored.method} weights, which load with --quantization "
        f"{' or '.join(kernels)}, not {name!r}; drop --quantization (config.json names the format) or quantize the "
        f"original checkpoint again"
    )
