"""The code predictor, batched over the requests of one Talker step.

For each request the predictor runs the short sequence ``[talker hidden,
embedding of code 0, embeddings of residual codes 1..G-2]``; position
``i``'s output through head ``i - 1`` picks residual code ``i``. All the
step's requests advance together: one decoder pass per residual codebook,
each request's keys and values in its own block of a small paged cache (one
block of ``num_code_groups`` slots per batch row, rewritten every frame).
"""
from __future__ import annotations

from typing import Callable

import torch

from edge_infer.models.layers.attention import AttentionMetadata, build_seq_attention
from edge_infer.models.layers.kv_cache import KVCache, KVLayout
from edge_infer.models.layers.native_ops import rms_norm
from edge_infer.models.qwen3_tts.talker import PredictorDecoder

# Picks a code from one request's fp32 logits row.
CodeSelector = Callable[[torch.Tensor], int]


def predictor_layout(predictor_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, num_code_groups: int) -> KVLayout:
    return KVLayout(predictor_layers, kv_heads, head_dim, dtype_bytes, block_size=num_code_groups)


class BatchedCodePredictor:
    def __init__(self, predictor: PredictorDecoder, max_batch: int, num_code_groups: int):
        cfg = predictor.cfg
        self.predictor = predictor
        self.layout = predictor_layout(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                       predictor.dtype.itemsize, num_code_groups)
        self.cache = KVCache(self.layout, max_batch, predictor.dtype)
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self._inputs: dict[tuple[int, int, int], tuple[torch.Tensor, AttentionMetadata]] = {}

    def _step_inputs(self, batch: int, first: int, q_len: int) -> tuple[torch.Tensor, AttentionMetadata]:
        """Positions ``first .. first + q_len - 1`` of every row; row ``b`` lives in block ``b``.

        Each position is its own single-query entry (seeing the keys up to itself; all new keys are written before
        any attention), so the frame's first, two-position pass is a decode step too: it runs in the fused layer
        where the model has one, not through ~150 PyTorch operators a layer. The inputs of a (batch, position) are
        the same every frame: built once.
        """
        key = (batch, first, q_len)
        if key not in self._inputs:
            size = self.layout.block_size
            positions = torch.arange(first, first + q_len).repeat(batch)
            slots = positions + torch.arange(batch).repeat_interleave(q_len) * size
            seqs = [build_seq_attention(b * q_len + j, 1, first + j + 1, [b], size, self.group, None)
                    for b in range(batch) for j in range(q_len)]
            self._inputs[key] = positions, AttentionMetadata(slot_mapping=slots, seqs=seqs)
        return self._inputs[key]

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, first_embeds: torch.Tensor, select: list[CodeSelector]) -> list[list[int]]:
        """Residual codes ``[B][G - 1]`` from the Talker's normed hidden states and code-0 embeddings ``[B, width]``."""
        p = self.predictor
        batch = hidden.shape[0]
        if batch > self.cache.num_blocks:
            raise ValueError(f"{batch} requests in one step, the predictor's cache holds {self.cache.num_blocks}")
        x = torch.stack((hidden, first_embeds), dim=1).reshape(2 * batch, -1)
        first, q_len = 0, 2
        codes: list[list[int]] = [[] for _ in range(batch)]
        for head in range(p.num_residual):
            positions, meta = self._step_inputs(batch, first, q_len)
            out = p.run_layers(p.project(x), positions, meta, self.cache)
            last = out[q_len - 1::q_len]
            logits = p.heads[head](rms_norm(last, p.final_norm, p.cfg.rms_norm_eps)).float()
            picked = [choose(row) for choose, row in zip(select, logits)]
            for row, code in zip(codes, picked):
                row.append(code)
            if head + 1 < p.num_residual:
                x = p.embed_residual(head + 1, torch.tensor(picked, dtype=torch.long))
                first, q_len = first + q_len, 1
        return codes
