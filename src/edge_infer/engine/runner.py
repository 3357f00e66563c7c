"""Turns a scheduled batch into one forward pass and the logits to sample from."""
from __future__ import annotations

import torch

from edge_infer.engine.attention import AttentionMetadata, build_seq_attention
from edge_infer.engine.kv_cache import KVCache
from edge_infer.engine.scheduler import ScheduledSeq
from edge_infer.models.llama import DecoderLM


class ModelRunner:
    def __init__(self, model: DecoderLM, cache: KVCache):
        self.model = model
        self.cache = cache
        cfg = model.cfg
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.sliding_window = cfg.sliding_window
        self.block_size = cache.layout.block_size

    @torch.inference_mode()
    def forward(self, batch: list[ScheduledSeq], all_logits: bool = False) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        """Run the batch; returns fp32 logits ``[S, vocab]`` for the S sequences that sample
        (with ``all_logits``, one row per computed token instead)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seqs = []
        logits_rows: list[int] = []
        sampling: list[ScheduledSeq] = []
        bs = self.block_size
        for item in batch:
            seq = item.seq
            start, end = seq.num_computed, seq.num_computed + item.num_new
            q_start = len(ids)
            ids.extend(seq.token_slice(start, end))
            positions.extend(range(start, end))
            slots.extend(seq.blocks[p // bs] * bs + p % bs for p in range(start, end))
            seqs.append(
                build_seq_attention(q_start, item.num_new, end, seq.blocks, bs, self.group, self.sliding_window)
            )
            if all_logits:
                logits_rows.extend(range(q_start, len(ids)))
            elif item.samples:
                logits_rows.append(len(ids) - 1)
                sampling.append(item)
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.long), seqs=seqs)
        logits = self.model(
            torch.tensor(ids, dtype=torch.long),
            torch.tensor(positions, dtype=torch.long),
            meta,
            self.cache,
            torch.tensor(logits_rows, dtype=torch.long),
        )
        return logits, sampling

    def forward_all_logits(self, item: ScheduledSeq) -> torch.Tensor:
        return self.forward([item], all_logits=True)[0]
