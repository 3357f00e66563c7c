"""Operators on edge-infer's native kernels (quant/csrc), once whoever loads a model enables them.

- Attention (``attention_runs``, ``segment_attention``; csrc/attention.cpp): block-diagonal
  attention (the media encoders' windows, frames and chunks) and a sequence's causal attention
  against its cached keys, for bf16 activations with a head_dim that is a multiple of 16, on a
  CPU with AVX512-BF16 (``hardware.kernels.BF16_ATTENTION``, masks included). SDPA's bf16
  products run MKL's AVX2 fp32 code on non-Intel CPUs (~100 G multiply-adds/s on 2 Zen 5
  cores); the kernel's run natively, and a causal row skips the keys it cannot see: one
  448x448 image's ViT and prompt attention 2.6-8x faster there (docs/multimodal.md). Not on a
  CPU with AMX-BF16, where SDPA's products run on the tile unit and are faster
  (``quant.native.bf16_attention_preferred``).
- SwiGLU's activation (``swiglu``; csrc/elementwise.cpp on the int8 kernels' ISA variant, any CPU
  they run on): silu(gate) * up for bf16 rows in one pass, where PyTorch makes two over strided
  halves and allocates twice; the same function as the fused decode layer's.
- RMSNorm of bf16 rows (``rms_norm``; the same file and the fused decode layer's function): one
  pass where PyTorch makes ~6 over a widened copy (3.8 ms per ViT norm of a 448x448 image).
- The ViT's rotary embedding of bf16 q and k in fp32 (``rotate``, the same file): one pass where
  PyTorch makes five over a widened copy, with the same bits.

PyTorch's operators take everything else. The models cannot load the native library themselves
(it lives in a layer above them): the engine, an encoder stage and the encoder memory probe call
``quant.native.enable_native_ops(dtype)`` before they run one, for the whole process.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from edge_infer.models.layers.rope import apply_rotary

_attention = False
_variant: str | None = None  # the ISA variant SwiGLU runs on, None: PyTorch's operators


def enable(attention: bool, variant: str | None) -> None:
    """Route what the attention kernel takes through it (``attention``), and bf16 SwiGLU through ``variant``."""
    global _attention, _variant
    _attention, _variant = attention, variant


def attention_runs(q: torch.Tensor) -> bool:
    """Whether the attention kernel takes queries ``q [tokens, heads, head_dim]``."""
    return _attention and q.dtype == torch.bfloat16 and q.shape[-1] % 16 == 0


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: list[int], k_offsets: list[int],
                      causal: bool, scale: float) -> torch.Tensor:
    """q ``[Tq, heads, d]``, k and v ``[Tk, kv_heads, d]`` -> ``[Tq, heads, d]``: segment s's queries (rows
    ``q_offsets[s] .. q_offsets[s+1]``) attend to its keys (rows ``k_offsets[s] .. k_offsets[s+1]``); causal:
    query i of a segment sees its first ``k_len - q_len + i + 1`` keys."""
    return torch.ops.edge_infer.segment_attention(q, k, v, q_offsets, k_offsets, causal, scale)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x [T, heads, head_dim]`` rotated in fp32 by ``cos`` and ``signed_sin`` (fp32, ``[T, 1, head_dim]``), returned
    in x's dtype as a new contiguous tensor: ``apply_rotary(x.float(), cos, signed_sin).to(x.dtype)``, bit for bit."""
    if _variant is not None and x.dtype == torch.bfloat16 and x.stride(-1) == 1:
        return torch.ops.edge_infer.rotate(x, cos.reshape(x.shape[0], -1), signed_sin.reshape(x.shape[0], -1), _variant)
    return apply_rotary(x.float(), cos, signed_sin, inplace=True).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32 and scaled in the activation dtype, as transformers does. bf16 rows ``[T, n]`` or
    ``[T, heads, n]`` (weight ``[n]`` or ``[heads, n]``) take one pass on the kernel, whose sum of squares runs in
    16 lanes (isa.h): the last bits differ from PyTorch's order now and then.

    (``F.rms_norm`` on bf16 runs ~3x slower on a 512-token chunk here and rounds differently.)
    """
    if (_variant is not None and x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
            and x.dim() in (2, 3) and x.stride(-1) == 1 and weight.shape in (x.shape[-1:], x.shape[1:])):
        return torch.ops.edge_infer.rms_norm(x, weight.contiguous(), eps, _variant)
    xf = x.to(torch.float32, copy=True)  # a copy even of fp32 input: normalised in place
    xf.mul_(torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))
    return weight * xf.to(x.dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """``[..., 2 * i]`` (gate, then up) -> silu(gate) * up ``[..., i]``, silu rounded to the rows' dtype first."""
    if _variant is not None and gate_up.dtype == torch.bfloat16:
        return torch.ops.edge_infer.swiglu(gate_up.contiguous(), _variant)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
