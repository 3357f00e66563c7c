"""The int4 kernel and the quantizer, on bare matrices (fast)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import testutil
from edge_infer.hardware.cpu import detect

from edge_infer.models.weights import WeightSpec
from edge_infer.config import QuantConfig
from edge_infer.quant.kernel import Int4Kernel, _layout_readable
from edge_infer.quant.quantize import dequantize_rows, pack_nibbles, quantize_rows, unpack_nibbles
from edge_infer.quant.sizes import GROUP_SIZES, PROMPT_BLOCK_ROWS, PROMPT_MIN_ROWS, quantized_nbytes, linear_nbytes


def packed_kernel(weight: torch.Tensor, group_size: int, symmetric: bool, dtype: torch.dtype, block_rows: int = 128):
    return testutil.packed_kernel(Int4Kernel, weight, group_size, symmetric, dtype, block_rows)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_int4_matmul_equals_dequantized_reference(group_size, symmetric, dtype):
    torch.manual_seed(group_size)
    weight = torch.randn(208, 2 * group_size) * 0.05
    kernel, q = packed_kernel(weight, group_size, symmetric, dtype)
    reference_w = dequantize_rows(q, group_size)
    x = torch.randn(7, weight.shape[1]).to(dtype)
    out = kernel(x).float()
    ref = x.float() @ reference_w.T
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert (out - ref).abs().max() <= tolerance * ref.abs().max()


@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("dtype, native_bf16", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)],
                         ids=["fp32", "bf16-on-fp32-blocks", "bf16-on-bf16-blocks"])
def test_a_prompt_runs_on_blas_with_the_int4_kernels_results(group_size, dtype, native_bf16, monkeypatch):
    """A prompt's rows take dequantized blocks of the weight through BLAS (csrc/int4_rows.cpp): the int4 kernel's
    products within a rounding, across blocks of prompt rows and weight rows, a partial last tile and padded columns;
    in fp32, or in bf16 where the CPU has native bf16 (here stood in for: PyTorch emulates what it lacks)."""
    if Int4Kernel(16, 32, 32, dtype).quantizer is None or not _layout_readable():
        pytest.skip("edge-infer's kernel library does not run on this CPU, or cannot read this PyTorch's int4 layout "
                    "(prompts stay on the int4 kernel)")
    if native_bf16 != detect().native_bf16:
        monkeypatch.setattr("edge_infer.quant.kernel.products_dtype", lambda d: d if native_bf16 else torch.float32)
    torch.manual_seed(group_size)
    weight = torch.randn(3436, 3 * group_size - 20) * 0.05  # 3440 padded rows: 107 whole tiles of 32 and one of 16
    kernel, q = packed_kernel(weight, group_size, False, dtype, block_rows=512)
    x = torch.randn(PROMPT_BLOCK_ROWS + 44, weight.shape[1]).to(dtype)
    ref = x.float() @ dequantize_rows(q, group_size, weight.shape[1]).T
    prompt = kernel(x).float()
    int4 = torch.cat([kernel(x[i : i + PROMPT_MIN_ROWS - 1]) for i in range(0, len(x), PROMPT_MIN_ROWS - 1)]).float()
    tolerance = (1e-5 if dtype == torch.float32 else 8e-3) * ref.abs().max()
    assert (prompt - ref).abs().max() <= tolerance and (int4 - ref).abs().max() <= tolerance


def test_a_partial_last_tile_is_dequantized_where_the_whole_tiles_end():
    """PyTorch's AVX-512 layout: tiles of 64 rows, so 4144 rows end in a tile of 48 at row 4096, which is not a multiple
    of 48. The library reads it (a layout stood in for: this CPU may pack another), as kernel.py's rows() would."""
    if Int4Kernel(16, 32, 32, torch.bfloat16).quantizer is None:
        pytest.skip("edge-infer's kernel library does not run on this CPU")
    rows, k, group, t = 4144, 96, 32, 48
    gen = torch.Generator().manual_seed(48)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    pairs = torch.randn(k // group, rows, 2, generator=gen).to(torch.bfloat16)
    position = torch.cat((2 * torch.arange(t // 2), 2 * torch.arange(t // 2) + 1))  # low nibbles, then high ones
    out = torch.empty(k, t)
    torch.ops.edge_infer.int4_rows_transposed(packed, pairs, position, group, rows - t, out)
    tile = packed.view(-1)[(rows - t) * k // 2 :].view(k, t // 2).long()  # column c's t / 2 bytes
    codes = (tile[:, position // 2] >> (4 * (position % 2))) & 15
    side = pairs[:, rows - t :].float().repeat_interleave(group, dim=0)  # [k, t, 2]
    assert torch.equal(out, (codes.float() - 8) * side[..., 0] + side[..., 1])


@pytest.mark.parametrize("shape", [(40, 80), (200, 100), (17, 33)])
def test_shapes_the_kernel_cannot_take_are_padded(shape):
    """Output rows not a multiple of 16 and input columns not a multiple of the group still compute exactly."""
    torch.manual_seed(1)
    weight = torch.randn(*shape)
    kernel, q = packed_kernel(weight, 32, False, torch.float32)
    x = torch.randn(3, shape[1])
    assert kernel(x).shape == (3, shape[0])
    ref = x @ dequantize_rows(q, 32, shape[1]).T
    assert torch.allclose(kernel(x), ref, atol=1e-4, rtol=1e-4)
    assert kernel.nbytes == quantized_nbytes(*shape, QuantConfig(group_size=32), 4)


def test_quantization_error_is_bounded_by_half_a_step():
    torch.manual_seed(2)
    weight = torch.randn(64, 256)
    for symmetric in (True, False):
        q = quantize_rows(weight, 64, symmetric)
        err = (dequantize_rows(q, 64) - weight).abs().view(64, 4, 64).amax(-1)
        step = q.scales.float()
        # Half a step of rounding, plus the bf16 rounding of the zero point (relative 2^-8).
        slack = q.zeros.float().abs() * 2**-8 + 1e-6
        assert bool((err <= step / 2 + slack + 1e-3 * step).all())
        if symmetric:
            assert not q.zeros.any()
        assert int(q.codes.max()) <= 15


def test_blocked_packing_is_identical_to_whole_packing():
    torch.manual_seed(3)
    weight = torch.randn(336, 128)  # 5 full 64-row tiles and a 16-row tail
    blocked, _ = packed_kernel(weight, 64, True, torch.bfloat16, block_rows=64)
    whole, _ = packed_kernel(weight, 64, True, torch.bfloat16, block_rows=336)
    assert torch.equal(blocked.packed, whole.packed)
    assert torch.equal(blocked.scales_zeros, whole.scales_zeros)


@pytest.mark.parametrize("rows", [4096, 4112, 4144])  # full tiles only; a 16-row and a 48-row tail tile
def test_rows_reads_embedding_rows_from_the_packed_form(rows):
    torch.manual_seed(rows)
    weight = torch.randn(rows, 96)
    kernel, q = packed_kernel(weight, 32, False, torch.bfloat16, block_rows=1024)
    ids = torch.tensor([0, 1, 31, 32, 63, 64, 100, rows - 17, rows - 1, 5, 5])
    expected = dequantize_rows(q, 32)[ids].to(torch.bfloat16)
    assert torch.equal(kernel.rows(ids), expected)


# Reads rows back under another of PyTorch's dispatch levels (another packed layout), in a fresh process.
_ROWS_UNDER_DISPATCH = """
import torch
from edge_infer.quant.kernel import Int4Kernel, tile_rows
from edge_infer.quant.quantize import dequantize_rows, quantize_rows
for rows in (4096, 4112, 4144, 100):
    weight = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    q = quantize_rows(weight, 32, False)
    kernel = Int4Kernel(rows, 96, 32, torch.bfloat16)
    for start in range(0, rows, 1024):
        kernel.write_rows(start, q.codes[start:start + 1024], q.scales[start:start + 1024], q.zeros[start:start + 1024])
    ids = torch.tensor([0, 1, 15, 16, 31, 32, 63, 64, rows - 17, rows - 1])
    assert torch.equal(kernel.rows(ids), dequantize_rows(q, 32)[ids].to(torch.bfloat16)), rows
    if kernel.quantizer is not None:  # a prompt's blocks are dequantized from this layout too
        x = torch.randn(64, 96).to(torch.bfloat16)
        ref = x.float() @ dequantize_rows(q, 32).T
        assert (kernel._prompt_matmul(kernel.padded_input(x))[:, :rows].float() - ref).abs().max() <= 8e-3 * ref.abs().max()
print(torch.backends.cpu.get_cpu_capability(), tile_rows())
"""


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_rows_read_every_layout_pytorch_packs(capability):
    """AVX2 packs 32-row tiles interleaved across 16 rows, the scalar build pairs rows; AVX-512 (the
    in-process tests above on such a CPU) packs 64-row tiles. A CPU without AVX2 cannot be asked for it."""
    if capability == "avx2" and not detect().has("avx2"):
        pytest.skip("this CPU lacks avx2")
    done = subprocess.run([sys.executable, "-c", _ROWS_UNDER_DISPATCH], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ATEN_CPU_CAPABILITY": capability})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [capability.upper(), "32"]


def test_nibble_format_round_trips():
    codes = torch.randint(0, 16, (5, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (5, 32)
    assert torch.equal(unpack_nibbles(packed), codes)
    assert int(packed[0, 0]) == int(codes[0, 0]) | int(codes[0, 1]) << 4  # even column in the low nibble


def test_kernel_bytes_equal_planned_bytes_and_real_storage():
    spec = WeightSpec("layers.0.gate_up", (300, 200), ("a",), True)
    for dtype, nbytes in ((torch.bfloat16, 2), (torch.float32, 4)):
        kernel = Int4Kernel(300, 200, 64, dtype)
        storage = kernel.packed.untyped_storage().nbytes() + kernel.scales_zeros.untyped_storage().nbytes()
        assert kernel.nbytes == storage == linear_nbytes(spec, QuantConfig(group_size=64), nbytes)


@pytest.mark.parametrize("cols", [64, 80])
def test_quantizing_leaves_the_callers_weights_untouched(cols):
    weight = torch.randn(16, cols)
    before = weight.clone()
    for symmetric in (True, False):
        quantize_rows(weight, 32, symmetric)
    assert torch.equal(weight, before)
