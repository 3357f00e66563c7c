"""Attention through edge-infer's bf16 kernel (quant/csrc/attention.cpp), once whoever loads a model enables it.

Block-diagonal attention (the media encoders' windows, frames and chunks)
and a prompt chunk's causal attention against its cached keys, for bf16
activations with a head_dim that is a multiple of 16, on a CPU with
AVX512-BF16 (``hardware.kernels.BF16_ATTENTION``, masks included). PyTorch's
SDPA takes everything else. SDPA's bf16 products run MKL's AVX2 fp32 code on
non-Intel CPUs (~100 G multiply-adds/s on 2 Zen 5 cores); the kernel's run
natively, and a causal row skips the keys it cannot see: one 448x448 image's
ViT and prompt attention 2.6-8x faster there (docs/multimodal.md).

The models cannot load the native library themselves (it lives in a layer
above them): the engine, an encoder stage and the encoder memory probe call
``enable`` with ``quant.native.bf16_attention_available()`` before they run one,
for the whole process.
"""
from __future__ import annotations

import torch

_enabled = False


def enable(on: bool) -> None:
    """Route what the kernel takes through it (``on``), or everything through SDPA, in this process."""
    global _enabled
    _enabled = on


def runs(q: torch.Tensor) -> bool:
    """Whether the kernel takes queries ``q [tokens, heads, head_dim]``."""
    return _enabled and q.dtype == torch.bfloat16 and q.shape[-1] % 16 == 0


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: list[int], k_offsets: list[int],
                      causal: bool, scale: float) -> torch.Tensor:
    """q ``[Tq, heads, d]``, k and v ``[Tk, kv_heads, d]`` -> ``[Tq, heads, d]``: segment s's queries (rows
    ``q_offsets[s] .. q_offsets[s+1]``) attend to its keys (rows ``k_offsets[s] .. k_offsets[s+1]``); causal:
    query i of a segment sees its first ``k_len - q_len + i + 1`` keys."""
    return torch.ops.edge_infer.segment_attention(q, k, v, q_offsets, k_offsets, causal, scale)
