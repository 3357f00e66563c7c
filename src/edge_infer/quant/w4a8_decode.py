"""Decode steps of a W4A8 model with each decoder layer in one C++ call (``csrc/decode_layer.cpp``).

A decode step (one new token per sequence) of a small model is dominated by
the ~150 small PyTorch operators around each layer's four matrix products,
not by the products themselves once they run on the W4A8 kernel. The fused
layer computes the same layer (models/llama.py's ``DecoderLayer``, rounding
to bf16 at the same points) in one call. Prefill chunks, fp32 models,
sliding windows and tinygemm/bf16 weights keep the PyTorch path.
"""
from __future__ import annotations

import torch

from edge_infer.engine.attention import AttentionMetadata
from edge_infer.quant.w4a8 import W4A8Kernel


def fusable(model) -> bool:
    """Whether every decoder layer of ``model`` (a ``DecoderLM``) can run as one fused call."""
    cfg = model.cfg
    if model.dtype != torch.bfloat16 or cfg.sliding_window is not None or cfg.head_dim % 16:
        return False
    return all(isinstance(lin.kernel, W4A8Kernel)
               for layer in model.layers for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down))


class FusedDecode:
    """The fused layer calls of one ``DecoderLM``, with each layer's weight arguments gathered once."""

    def __init__(self, model) -> None:
        cfg = model.cfg
        self.group_size = model.layers[0].qkv.kernel.group_size
        self.layer_args = [
            (layer.input_norm, layer.post_attention_norm, layer.q_norm, layer.k_norm,
             layer.qkv.kernel.packed, layer.qkv.kernel.scales_zeros, layer.qkv.bias,
             layer.o_proj.kernel.packed, layer.o_proj.kernel.scales_zeros,
             layer.gate_up.kernel.packed, layer.gate_up.kernel.scales_zeros,
             layer.down.kernel.packed, layer.down.kernel.scales_zeros)
            for layer in model.layers
        ]
        self.shape_args = (self.group_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
                           cfg.rms_norm_eps, cfg.head_dim**-0.5)

    @staticmethod
    def accepts(x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """A decode step: one query per sequence, in row order, every key visible."""
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
