"""cpu_w4a16: the 4-bit tiles times the activations as they are, on bare matrices per ISA variant (the harness in
test_isa_variants.py checks the same tile kernels without PyTorch, and NEON under qemu), against the weights the
codes stand for and against PyTorch's int4 kernel (cpu_int4) on the same codes."""
from __future__ import annotations

import pytest
import torch

import testutil
from testutil import require_built, runnable_variants

from edge_infer.config import QuantConfig
from edge_infer.quant.native import missing_requirement
from edge_infer.quant.quantize import dequantize_rows
from edge_infer.quant.sizes import GROUP_SIZES, PROMPT_MIN_ROWS, quantized_nbytes

pytestmark = pytest.mark.skipif(missing_requirement("cpu-w4a16") is not None,
                                reason=str(missing_requirement("cpu-w4a16")))
VARIANTS = runnable_variants()
# Rows through the tile kernel (pairs and a single one; past a 16-row block) and through BLAS (a prompt).
TILE_ROWS = (1, 2, 5, 17, PROMPT_MIN_ROWS - 1)
PROMPT_ROWS = (PROMPT_MIN_ROWS, 300)


def packed(weight: torch.Tensor, group_size: int, symmetric: bool, dtype: torch.dtype, variant: str | None = None):
    from edge_infer.quant.int8_kernels import W4A16Kernel

    if variant is not None:
        require_built(variant)
    return testutil.packed_kernel(W4A16Kernel, weight, group_size, symmetric, dtype, variant=variant)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "scalar"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_each_isa_variant_equals_the_scalar_reference_bit_for_bit(variant, symmetric, group_size):
    """A partial row tile, columns padded to whole groups, fp32 and bf16, every row count under the prompt path."""
    torch.manual_seed(group_size)
    weight = torch.randn(200, 2 * group_size + 24) * 0.05
    for dtype in (torch.float32, torch.bfloat16):
        kernel, _ = packed(weight, group_size, symmetric, dtype, variant)
        reference, _ = packed(weight, group_size, symmetric, dtype, "scalar")
        for rows in TILE_ROWS:
            x = torch.randn(rows, weight.shape[1]).to(dtype)
            assert torch.equal(kernel(x), reference(x)), (dtype, rows)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_products_equal_the_dequantized_weights_to_float_rounding(symmetric, group_size, monkeypatch):
    """No activation quantization: fp32 outputs within fp32 rounding of x @ W.T for the weights the codes stand for
    (W4A8 would be off by up to half an int8 step per group), bf16 outputs within their own rounding; the tile
    kernel's rows and a prompt's (BLAS over dequantized blocks, fp32 blocks here) alike."""
    monkeypatch.setattr("edge_infer.quant.kernel.products_dtype", lambda d: torch.float32)
    torch.manual_seed(group_size + symmetric)
    weight = torch.randn(200, 2 * group_size + 24) * 0.05
    for dtype in (torch.float32, torch.bfloat16):
        kernel, q = packed(weight, group_size, symmetric, dtype)
        cols = weight.shape[1]
        w = dequantize_rows(q, group_size)[:, :cols].double()
        # The codes go in as they are (0..15) and -8 sum x is added: terms up to 16 scales per column.
        terms = (16 * q.scales.double().abs() + q.zeros.double().abs()).repeat_interleave(group_size, 1)[:, :cols]
        for rows in TILE_ROWS + PROMPT_ROWS:
            x = torch.randn(rows, cols).to(dtype)
            out = kernel(x)
            assert out.shape == (rows, 200) and out.dtype == dtype
            ref = x.double() @ w.T
            tolerance = (x.double().abs() @ terms.T) * (cols + 8) * 2**-24
            tolerance += ref.abs() * 2**-8 if dtype == torch.bfloat16 else 0
            assert bool(((out.double() - ref).abs() <= tolerance).all()), (dtype, rows)


def test_a_prompt_multiplies_bf16_blocks_where_bf16_is_native(monkeypatch):
    """Where the CPU has native bf16 (stood in for here: PyTorch emulates what it lacks) a prompt's blocks are
    dequantized to bf16 and multiplied on oneDNN: within bf16's rounding of the weights, as cpu_int4's prompts."""
    monkeypatch.setattr("edge_infer.quant.kernel.products_dtype", lambda d: d)
    torch.manual_seed(9)
    weight = torch.randn(300, 360) * 0.05
    kernel, q = packed(weight, 64, False, torch.bfloat16)
    x = torch.randn(PROMPT_MIN_ROWS + 20, 360).to(torch.bfloat16)
    ref = x.float() @ dequantize_rows(q, 64, 360).T
    assert (kernel(x).float() - ref).abs().max() <= 8e-3 * ref.abs().max()


def test_the_same_codes_give_cpu_int4s_products():
    """Switching cpu_int4 for cpu_w4a16 changes the kernel, not the model: the same codes, scales and zeros give
    PyTorch's int4 kernel's products to within fp32 rounding (bf16 activations, one token and a prompt)."""
    from edge_infer.quant.kernel import Int4Kernel, require_int4_kernel

    require_int4_kernel()
    torch.manual_seed(5)
    weight = torch.randn(256, 384) * 0.05
    ours, _ = packed(weight, 128, False, torch.bfloat16)
    theirs, _ = testutil.packed_kernel(Int4Kernel, weight, 128, False, torch.bfloat16)
    for rows in (1, 7, 100):
        x = torch.randn(rows, 384).to(torch.bfloat16)
        a, b = ours(x).float(), theirs.matmul(x).float()
        assert bool(((a - b).abs() <= b.abs() * 2**-7 + 1e-3).all()), rows


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_bias_gives_the_bits_of_a_separate_add(variant):
    """On the tile kernel the bias goes in as each output tile is stored, on the prompt path after the product:
    the bits of PyTorch adding it after, either way; a bias of another dtype is refused."""
    for dtype in (torch.float32, torch.bfloat16):
        kernel, _ = packed(torch.randn(200, 96) * 0.05, 32, False, dtype, variant)
        bias = torch.randn(200).to(dtype)
        for rows in (3, 17, PROMPT_MIN_ROWS + 3):
            x = torch.randn(rows, 96).to(dtype)
            assert torch.equal(kernel(x, bias), kernel(x) + bias), (dtype, rows)
    with pytest.raises(RuntimeError, match="bias must be 200 contiguous values of the activations' dtype"):
        kernel(torch.randn(3, 96).to(dtype), bias.float())


def test_sizes_and_rows_match_the_plan():
    """Resident bytes are what the planner counts for cpu_w4a16 (cpu_w4a8's tiles); a row reads back as its codes."""
    torch.manual_seed(3)
    weight = torch.randn(130, 200)
    kernel, q = packed(weight, 64, False, torch.float32)
    assert kernel.nbytes == quantized_nbytes(130, 200, QuantConfig.named("cpu_w4a16", group_size=64, symmetric=False), 4)
    assert kernel.nbytes == sum(t.untyped_storage().nbytes() for t in kernel.resident())
    ids = torch.tensor([0, 63, 64, 129])
    assert torch.equal(kernel.rows(ids), dequantize_rows(q, 64, 200)[ids])


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_nan_or_infinite_activation_reaches_its_row_only(variant):
    kernel, _ = packed(torch.randn(64, 128), 32, True, torch.bfloat16, variant)
    for rows in (3, PROMPT_MIN_ROWS):
        x = torch.randn(rows, 128).to(torch.bfloat16)
        x[0, 5] = float("nan")
        x[2, 100] = float("inf")
        out = kernel(x)
        assert bool(out[0].isnan().all()) and bool(out[1].isfinite().all()) and not bool(out[2].isfinite().any())


def test_w4a16_linear_refuses_what_does_not_fit():
    kernel, _ = packed(torch.randn(64, 128), 32, True, torch.float32)
    with pytest.raises(RuntimeError, match="the input has 96 columns; the weight packs 128 in groups of 32"):
        torch.ops.edge_infer.w4a16_linear(torch.randn(1, 96), kernel.packed, kernel.scales, 32, 64, kernel.variant)
    with pytest.raises(RuntimeError, match="x must be a contiguous bf16 or fp32"):
        torch.ops.edge_infer.w4a16_linear(torch.randn(1, 128).half(), kernel.packed, kernel.scales, 32, 64, kernel.variant)
    with pytest.raises(RuntimeError, match="not built into this library"):
        torch.ops.edge_infer.w4a16_linear(torch.randn(1, 128), kernel.packed, kernel.scales, 32, 64, "avx1024")
