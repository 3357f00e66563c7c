"""Writing weights into the int8 kernels' tiles while loading (csrc/pack.cpp): quantizing float rows gives the
codes and scales quantize.py's quantize_rows gives, bit for bit, and codes land where the 64-row tile layout
(csrc/isa.h) puts them, from float weights, one code per byte or two per byte as a checkpoint stores them. The
same loops quantize for cpu_int4 (PyTorch's kernel), bit for bit too."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from testutil import runnable_variants

from edge_infer.quant.native import missing_requirement
from edge_infer.quant.quantize import NonFiniteWeightError, pack_nibbles, quantize_rows
from edge_infer.quant.sizes import GROUP_SIZES

pytestmark = pytest.mark.skipif(missing_requirement() is not None, reason=str(missing_requirement()))
TILE = 64
KINDS = {"w4-sym": (4, True), "w4-asym": (4, False), "w8": (8, True)}
# The quantizer's loops are compiled for AVX2 and the baseline; the scalar variant takes the baseline's.
LOOPS = runnable_variants()[:1] + ["scalar"] if missing_requirement() is None else []


def kernel_class(bits: int):
    from edge_infer.quant.int8_kernels import W4A8Kernel, W8A8Kernel

    return W8A8Kernel if bits == 8 else W4A8Kernel


def layout(kernel, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed codes and side values of whole rows by isa.h's definition, written out with tensor ops: rows
    padded with zeros to whole tiles; 4 bits: for columns k..k+7 a row's byte i holds column k+i in its low nibble
    and k+4+i in its high one; 8 bits: its 4 bytes are columns k..k+3; scales (and zeros) [tiles, groups, parts, 64]."""
    pad = -codes.shape[0] % TILE
    tiles = (codes.shape[0] + pad) // TILE
    codes = F.pad(codes.to(kernel.packed.dtype), (0, 0, 0, pad)).view(tiles, TILE, kernel.cols_padded)
    if kernel.bits == 4:
        halves = codes.view(tiles, TILE, kernel.cols_padded // 8, 2, 4)
        packed = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).permute(0, 2, 1, 3)
        side = torch.stack((scales, zeros))
    else:
        packed = codes.view(tiles, TILE, kernel.cols_padded // 4, 4).permute(0, 2, 1, 3)
        side = scales.unsqueeze(0)
    side = F.pad(side.to(torch.bfloat16), (0, 0, 0, pad)).view(len(side), tiles, TILE, -1).permute(1, 3, 0, 2)
    return packed.contiguous(), side.reshape(kernel.scales.shape).contiguous()


def hard_weights(rows: int, cols: int, group: int, bits: int, symmetric: bool) -> torch.Tensor:
    """Values over 60 binary orders, with the cases rounding gets wrong: codes exactly halfway between two
    (ties go to even), all-zero groups and rows, zeros of both signs, subnormals, a lone value in a group."""
    torch.manual_seed(rows * 131 + cols + group + bits)
    w = torch.randn(rows, cols) * torch.logspace(-30, 30, cols, base=2.0)[torch.randperm(cols)]
    # Ties: a group whose largest magnitude is top * s gets the scale s exactly (s a power of two: exact in bf16
    # and fp16, and so is top * s), so its other values (c + 0.5) * s sit halfway between codes c and c + 1.
    # Asymmetric: lo = -6 s and hi = 9 s give the scale s and the zero 2 s exactly, the values' ties after it.
    top = 127 if bits == 8 else 7
    for r in range(0, rows, 3):
        s = 2.0 ** (r % 13 - 6)
        if symmetric:
            ties = (torch.randint(-top, top, (group,)) + 0.5) * s
            ties[0] = top * s
        else:
            ties = (torch.randint(-6, 8, (group,)) + 0.5) * s
            ties[0], ties[1] = -6 * s, 9 * s
        w[r, :min(group, cols)] = ties[:min(group, cols)]
    w[1::7] = 0.0
    w[2::5, :group] = -0.0
    w[3::11, : group // 2] = torch.randn(group // 2) * 1e-41  # subnormal in fp32, zero in bf16 and fp16
    w[4::9, :group] = 0.0
    w[4::9, group // 3] = -3.5
    return w


@pytest.mark.parametrize("variant", sorted(set(LOOPS)))
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_quantizing_into_tiles_equals_quantize_rows_bit_for_bit(variant, kind, group, dtype):
    """Partial last tiles (rows 1, 63, 130), columns padded to whole groups, blocks written from row 64 on; the
    loops of the variant the CPU runs and the baseline's."""
    bits, symmetric = KINDS[kind]
    for rows, cols in itertools.product((1, 63, 130), (group + 8, 3 * group)):
        weight = hard_weights(rows, cols, group, bits, symmetric)
        weight = weight.clamp(-6e4, 6e4).to(dtype) if dtype == torch.float16 else weight.to(dtype)  # fp16's range
        q = quantize_rows(weight, group, symmetric, bits)
        kernel = kernel_class(bits)(rows, cols, group, torch.bfloat16, variant=variant)
        for start in range(0, rows, TILE):  # a block per tile, as the loader writes a linear
            kernel.write_weight_rows(start, weight[start:start + TILE], symmetric)
        packed, side = layout(kernel, q.codes, q.scales, q.zeros)
        assert torch.equal(kernel.packed, packed), (rows, cols)
        assert torch.equal(kernel.scales, side), (rows, cols)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_stored_codes_land_where_the_tile_layout_puts_them(kind):
    """A checkpoint's codes (4 bits: two per byte, as stored), or one per byte: the same tiles; rows read back."""
    bits, symmetric = KINDS[kind]
    rows, cols, group = 150, 200, 64
    q = quantize_rows(torch.randn(rows, cols), group, symmetric, bits)
    forms = [q.codes] + ([pack_nibbles(q.codes)] if bits == 4 else [])
    expected = None
    for codes in forms:
        kernel = kernel_class(bits)(rows, cols, group, torch.bfloat16)
        kernel.write_rows(0, codes[:128], q.scales[:128], q.zeros[:128])
        kernel.write_rows(128, codes[128:], q.scales[128:], q.zeros[128:])
        expected = expected or layout(kernel, q.codes, q.scales, q.zeros)
        assert torch.equal(kernel.packed, expected[0]) and torch.equal(kernel.scales, expected[1])
        back = kernel.quantized_rows(torch.tensor([0, 63, 64, 149]))
        assert torch.equal(back.codes, q.codes[[0, 63, 64, 149]])
        assert torch.equal(back.scales, q.scales[[0, 63, 64, 149]])


@pytest.mark.parametrize("variant", sorted(set(LOOPS)))
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 3e38])
def test_a_weight_with_no_codes_is_refused_by_both_quantizers(variant, kind, bad):
    """NaN, infinity, or a group too wide for a finite scale (asymmetric: (hi - lo) / 15 past the largest float)."""
    bits, symmetric = KINDS[kind]
    weight = torch.randn(70, 128)
    weight[66, 5] = bad
    if bad == 3e38:
        weight[66, 6] = -3e38
    refused = bad != 3e38 or not symmetric
    kernel = kernel_class(bits)(70, 128, 64, torch.bfloat16, variant=variant)
    if not refused:
        q = quantize_rows(weight, 64, symmetric, bits)
        kernel.write_weight_rows(0, weight, symmetric)
        packed, side = layout(kernel, q.codes, q.scales, q.zeros)
        assert torch.equal(kernel.packed, packed) and torch.equal(kernel.scales, side)
        return
    for quantize in (lambda: quantize_rows(weight, 64, symmetric, bits), lambda: kernel.write_weight_rows(0, weight, symmetric)):
        with pytest.raises(NonFiniteWeightError, match="row 66 holds a NaN or infinite weight") as refused_row:
            quantize()
        assert refused_row.value.row == 66


@pytest.mark.parametrize("variant", sorted(set(LOOPS)))
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_quantizing_for_the_int4_kernel_equals_quantize_rows_bit_for_bit(variant, symmetric, group, dtype):
    """cpu_int4 (PyTorch's kernel packs its own layout): the native loop's int32 codes and the kernel's scale/zero
    pairs equal those of quantize_rows packed by the kernel's write_rows (which is also what a kernel without the
    library quantizes with); bf16 pairs, and fp32 for an fp32 model."""
    from edge_infer.quant.kernel import Int4Kernel

    pairs = torch.float32 if dtype == torch.float32 else torch.bfloat16
    for rows, cols in itertools.product((1, 63, 130), (group + 8, 3 * group)):
        weight = hard_weights(rows, cols, group, 4, symmetric)
        weight = weight.clamp(-6e4, 6e4).to(dtype) if dtype == torch.float16 else weight.to(dtype)
        q = quantize_rows(weight, group, symmetric)
        native, plain, expected = (Int4Kernel(rows, cols, group, pairs) for _ in range(3))
        native.quantizer, plain.quantizer = variant, None
        for start in range(0, rows, TILE):
            native.write_weight_rows(start, weight[start:start + TILE], symmetric)
            plain.write_weight_rows(start, weight[start:start + TILE], symmetric)
            expected.write_rows(start, q.codes[start:start + TILE], q.scales[start:start + TILE], q.zeros[start:start + TILE])
        for kernel in (native, plain):
            assert torch.equal(kernel.packed, expected.packed), (rows, cols)
            assert torch.equal(kernel.scales_zeros, expected.scales_zeros), (rows, cols)


@pytest.mark.parametrize("variant", sorted(set(LOOPS)))
def test_the_int4_kernel_refuses_a_weight_with_no_codes_by_its_row(variant):
    from edge_infer.quant.kernel import Int4Kernel

    weight = torch.randn(70, 128)
    weight[66, 5] = float("nan")
    kernel = Int4Kernel(70, 128, 64, torch.bfloat16)
    kernel.quantizer = variant
    with pytest.raises(NonFiniteWeightError, match="row 2 holds a NaN or infinite weight") as refused:
        kernel.write_weight_rows(64, weight[64:], False)
    assert refused.value.row == 2  # of the block's rows: the loader names the tensor's
