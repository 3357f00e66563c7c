"""Turns a scheduled batch into one forward pass and the logits to sample from.

``prepare_step`` is model-agnostic: positions, cache slots, per-sequence
attention metadata and the rows that need an output. Any decoder that runs
over the paged cache (the text models here, the Qwen3-TTS Talker) builds its
step from it and supplies its own inputs for each token span.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from edge_infer.models.layers.attention import AttentionMetadata, build_seq_attention
from edge_infer.models.layers.kv_cache import KVCache
from edge_infer.engine.scheduler import ScheduledSeq
from edge_infer.models.llama import DecoderLM


@dataclass
class StepBatch:
    spans: list[tuple[ScheduledSeq, int, int]]  # (item, first position, end position) computed this step
    positions: torch.Tensor  # int64 [T]
    meta: AttentionMetadata
    output_rows: torch.Tensor  # int64 rows of the flat batch that need an output
    sampling: list[ScheduledSeq]  # the items whose last token is computed (they sample), in row order


def prepare_step(
    batch: list[ScheduledSeq], block_size: int, group: int, sliding_window: int | None, all_rows: bool = False
) -> StepBatch:
    positions: list[int] = []
    slots: list[int] = []
    seqs = []
    rows: list[int] = []
    sampling: list[ScheduledSeq] = []
    spans = []
    for item in batch:
        seq = item.seq
        start, end = seq.num_computed, seq.num_computed + item.num_new
        q_start = len(positions)
        spans.append((item, start, end))
        positions.extend(range(start, end))
        slots.extend(seq.blocks[p // block_size] * block_size + p % block_size for p in range(start, end))
        seqs.append(build_seq_attention(q_start, item.num_new, end, seq.blocks, block_size, group, sliding_window))
        if all_rows:
            rows.extend(range(q_start, len(positions)))
        elif item.reaches_last_token:
            rows.append(len(positions) - 1)
            sampling.append(item)
    return StepBatch(
        spans=spans,
        positions=torch.tensor(positions, dtype=torch.long),
        meta=AttentionMetadata(slot_mapping=torch.tensor(slots, dtype=torch.long), seqs=seqs),
        output_rows=torch.tensor(rows, dtype=torch.long),
        sampling=sampling,
    )


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
        step = prepare_step(batch, self.block_size, self.group, self.sliding_window, all_logits)
        ids: list[int] = []
        for item, start, end in step.spans:
            ids.extend(item.seq.token_slice(start, end))
        logits = self.model(torch.tensor(ids, dtype=torch.long), step.positions, step.meta, self.cache, step.output_rows)
        return logits, step.sampling

    def forward_all_logits(self, item: ScheduledSeq) -> torch.Tensor:
        return self.forward([item], all_logits=True)[0]
