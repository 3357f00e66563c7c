"""SwiGLU, RMSNorm and the rotary embedding on edge-infer's kernels (csrc/elementwise.cpp) against PyTorch's operators."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edge_infer.models.layers import native_ops
from edge_infer.quant.native import vector_variant

VARIANT = vector_variant()
pytestmark = pytest.mark.skipif(VARIANT is None, reason="edge-infer's int8 kernels do not run here")


def pytorch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("shape", [(1, 2 * 4864), (37, 2 * 3420), (2, 3, 2 * 11)])
def test_equals_pytorchs_silu_and_product_within_a_bf16_step(shape):
    gate_up = (torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 4).to(torch.bfloat16)
    gate_up[..., 0] = 100  # silu is the gate itself
    gate_up[..., 1] = -100  # silu under 1e-36 (PyTorch's: -0)
    ours = torch.ops.edge_infer.swiglu(gate_up, VARIANT)
    want = pytorch(gate_up)
    assert ours.shape == want.shape and ours.dtype == torch.bfloat16
    step = want.float().abs() * 2**-7 + 1e-30  # one bf16 rounding of each of the two
    assert bool(((ours.float() - want.float()).abs() <= step).all())
    assert (ours[..., 2:] != want[..., 2:]).float().mean() < 0.01  # and almost always the same bits


def test_a_nan_reaches_only_its_own_output():
    gate_up = torch.ones(2, 8, dtype=torch.bfloat16)
    gate_up[0, 1] = float("nan")
    out = torch.ops.edge_infer.swiglu(gate_up, VARIANT)
    assert out[0, 1].isnan() and torch.isfinite(out[0, [0, 2, 3]]).all() and torch.isfinite(out[1]).all()


def test_it_refuses_what_it_cannot_take():
    with pytest.raises(RuntimeError, match="contiguous bf16"):
        torch.ops.edge_infer.swiglu(torch.ones(2, 8), VARIANT)
    with pytest.raises(RuntimeError, match="contiguous bf16"):
        torch.ops.edge_infer.swiglu(torch.ones(2, 7, dtype=torch.bfloat16), VARIANT)


def test_the_models_take_it_for_bf16_once_enabled(monkeypatch):
    gate_up = torch.randn(3, 64).to(torch.bfloat16)
    monkeypatch.setattr(native_ops, "_variant", None)
    assert torch.equal(native_ops.swiglu(gate_up), pytorch(gate_up))
    monkeypatch.setattr(native_ops, "_variant", VARIANT)
    assert torch.equal(native_ops.swiglu(gate_up), torch.ops.edge_infer.swiglu(gate_up, VARIANT))
    assert torch.equal(native_ops.swiglu(gate_up.float()), pytorch(gate_up.float()))  # fp32 stays PyTorch's


@pytest.mark.parametrize("d", [16, 80, 128])
def test_rotate_gives_the_bits_of_pytorchs_rotary_in_fp32(d):
    """The ViT's q/k rotation (bf16 in, fp32 inside, bf16 out) in one pass: apply_rotary on a widened copy, bit
    for bit, from a strided view (q and k inside the q/k/v product)."""
    from edge_infer.models.layers.rope import apply_rotary

    gen = torch.Generator().manual_seed(d)
    qkv = (torch.randn(37, 3, 4, d, generator=gen) * 3).to(torch.bfloat16)
    x = qkv[:, :2].reshape(37, 8, d)
    angles = torch.rand(37, d // 2, generator=gen) * 50
    cos = torch.cat((angles.cos(), angles.cos()), -1)[:, None]
    sin = torch.cat((-angles.sin(), angles.sin()), -1)[:, None]
    want = apply_rotary(x.float(), cos, sin, inplace=True).to(torch.bfloat16)
    assert torch.equal(torch.ops.edge_infer.rotate(x, cos.reshape(37, d), sin.reshape(37, d), VARIANT), want)


def pytorch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("shape", [(1, 2048), (1024, 1280), (5, 37)])
def test_rms_norm_equals_pytorchs_within_a_bf16_step(shape):
    gen = torch.Generator().manual_seed(shape[1])
    x = (torch.randn(*shape, generator=gen) * 3).to(torch.bfloat16)
    weight = torch.rand(shape[1], generator=gen).to(torch.bfloat16)
    ours, want = torch.ops.edge_infer.rms_norm(x, weight, 1e-6, VARIANT), pytorch_rms_norm(x, weight, 1e-6)
    assert ours.shape == want.shape and ours.dtype == torch.bfloat16
    assert bool(((ours.float() - want.float()).abs() <= want.float().abs() * 2**-7 + 1e-30).all())
    assert (ours != want).float().mean() < 0.01  # only the sum of squares' order differs


def test_rms_norm_of_heads_inside_a_product_takes_each_heads_weight():
    """Qwen3's q/k norms: [tokens, heads, d] views into the q/k/v product, one weight row per head."""
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(7, 6, 32, generator=gen).to(torch.bfloat16)
    qk, weight = qkv[:, :5], torch.rand(5, 32, generator=gen).to(torch.bfloat16)
    ours = torch.ops.edge_infer.rms_norm(qk, weight, 1e-6, VARIANT)
    assert ours.is_contiguous() and torch.allclose(ours.float(), pytorch_rms_norm(qk, weight, 1e-6).float(), rtol=2**-7)


def test_rms_norm_of_a_nan_row_is_nan_and_leaves_the_others():
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    x[0, 3] = float("nan")
    out = torch.ops.edge_infer.rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6, VARIANT)
    assert out[0].isnan().all() and torch.equal(out[1], torch.ones(64, dtype=torch.bfloat16))


def test_rms_norm_refuses_what_it_cannot_take():
    with pytest.raises(RuntimeError, match="x must be bf16"):
        torch.ops.edge_infer.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6, VARIANT)
    with pytest.raises(RuntimeError, match="the weight must be 8"):
        torch.ops.edge_infer.rms_norm(torch.ones(2, 8, dtype=torch.bfloat16), torch.ones(7, dtype=torch.bfloat16), 1e-6, VARIANT)


def test_the_models_take_rms_norm_for_bf16_once_enabled(monkeypatch):
    x, weight = torch.randn(3, 64).to(torch.bfloat16), torch.rand(64).to(torch.bfloat16)
    monkeypatch.setattr(native_ops, "_variant", None)
    assert torch.equal(native_ops.rms_norm(x, weight, 1e-6), pytorch_rms_norm(x, weight, 1e-6))
    monkeypatch.setattr(native_ops, "_variant", VARIANT)
    assert torch.equal(native_ops.rms_norm(x, weight, 1e-6), torch.ops.edge_infer.rms_norm(x, weight, 1e-6, VARIANT))
    assert torch.equal(native_ops.rms_norm(x.float(), weight.float(), 1e-6),  # fp32 stays PyTorch's
                       pytorch_rms_norm(x.float(), weight.float(), 1e-6))
