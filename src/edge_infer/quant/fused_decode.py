"""Decode steps of a model on edge-infer's tile kernels (W4A8, W8A8, W4A16) with each decoder layer in one C++ call
(``csrc/decode_layer.cpp``).

A decode step (one new token per sequence) of a small model is dominated by
the ~150 small PyTorch operators around each layer's four matrix products,
not by the products themselves once they run on the tile kernels. The fused
layer computes the same layer (models/llama.py's ``DecoderLayer``, rounding
to bf16 at the same points, or nowhere for an fp32 model) in one call, on the
ISA variant the linears run on. fp32 is what a CPU without native bf16 runs
(AVX2), so the fused layer serves those too. Prefill chunks, sliding windows,
mixed weight kinds and tinygemm/bf16 weights keep the PyTorch path.
"""
from __future__ import annotations

import logging

import torch

from edge_infer.models.layers.attention import AttentionMetadata
from edge_infer.quant.int8_kernels import TileKernel, W4A16Kernel
from edge_infer.quant.sizes import PROMPT_MIN_ROWS


log = logging.getLogger(__name__)


def offer(model, quant) -> None:
    """Let ``model`` fuse its decode steps when ``quant`` runs on the tile kernels (it decides at its first decode)."""
    if quant is not None and quant.tiles:
        model.fused_factory = build


def build(model) -> "FusedDecode | None":
    """The fused decode of ``model`` (a ``DecoderLM``: its ``fused_factory``), or None to keep the PyTorch layers."""
    if not any(isinstance(lin.kernel, TileKernel) for _, lin in model.linears()):
        return None
    if not fusable(model):
        log.info("tile-kernel weights, but decode steps run layer by layer in PyTorch: the fused layer needs bf16 or "
                 "fp32 activations, every linear on one tile kernel, a head_dim multiple of 16 and no sliding window")
        return None
    return FusedDecode(model)


def _layer_kernels(layer) -> tuple:
    return tuple(lin.kernel for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))


def fusable(model) -> bool:
    """Whether every decoder layer of ``model`` (a ``DecoderLM``) can run as one fused call."""
    cfg = model.cfg
    if model.dtype not in (torch.bfloat16, torch.float32) or cfg.sliding_window is not None or cfg.head_dim % 16:
        return False
    kernels = [k for layer in model.layers for k in _layer_kernels(layer)]
    return (all(isinstance(k, TileKernel) for k in kernels)
            and len({(type(k), k.bits, k.group_size, k.variant) for k in kernels}) == 1)


class FusedDecode:
    """The fused layer calls of one ``DecoderLM``, with each layer's weight arguments gathered once."""

    def __init__(self, model) -> None:
        cfg = model.cfg
        first = model.layers[0].qkv.kernel
        self.layer_args = [
            (layer.input_norm, layer.post_attention_norm, layer.q_norm, layer.k_norm,
             layer.qkv.kernel.packed, layer.qkv.kernel.scales, layer.qkv.bias,
             layer.o_proj.kernel.packed, layer.o_proj.kernel.scales,
             layer.gate_up.kernel.packed, layer.gate_up.kernel.scales,
             layer.down.kernel.packed, layer.down.kernel.scales)
            for layer in model.layers
        ]
        self.w4a16 = isinstance(first, W4A16Kernel)
        self.shape_args = (first.bits, first.group_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.intermediate_size, cfg.rms_norm_eps, cfg.head_dim**-0.5, first.variant, self.w4a16)

    def accepts(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """A decode step: one query per sequence, in row order, every key visible; for W4A16, fewer sequences
        than its prompt path takes (the layers' own products then give the same bits)."""
        if self.w4a16 and x.shape[0] >= PROMPT_MIN_ROWS:
            return False
        return len(meta.seqs) == x.shape[0] and all(
            s.q_len == 1 and s.q_start == i and s.window_start == 0 for i, s in enumerate(meta.seqs))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                 kv_cache) -> torch.Tensor:
        table = torch.nn.utils.rnn.pad_sequence([s.blocks for s in meta.seqs], batch_first=True)
        ctx = torch.tensor([s.ctx_len for s in meta.seqs], dtype=torch.long)
        cos, sin = cos.contiguous(), sin.contiguous()
        op = torch.ops.edge_infer.decode_layer
        for n, args in enumerate(self.layer_args):
            x = op(x, cos, sin, kv_cache.k[n], kv_cache.v[n], meta.slot_mapping, table, ctx, *args, *self.shape_args)
        return x
