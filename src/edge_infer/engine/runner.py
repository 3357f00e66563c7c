"""Turns a scheduled batch into one forward pass and the logits to sample from.

A request that asked for prompt logprobs also has its prompt tokens scored
as its prefill computes them, a few rows of logits at a time so that scoring
a long prompt needs no more memory than the plan gives a step's logits.

For a multimodal thinker, the rows of placeholder tokens in the step's input
embeddings are overwritten by their media's embeddings (encoded by the core
beforehand: a chunk may hold part of an image) and every token gets its
three M-RoPE positions.

``prepare_step`` is model-agnostic: positions, cache slots, per-sequence
attention metadata and the rows that need an output. Any decoder that runs
over the paged cache (the text models here, the Qwen3-TTS Talker) builds its
step from it and supplies its own inputs for each token span.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from edge_infer.models.layers.attention import AttentionMetadata, build_seq_attention
from edge_infer.models.layers.kv_cache import KVCache
from edge_infer.engine.sampler import score_rows
from edge_infer.engine.scheduler import ScheduledSeq
from edge_infer.engine.sequence import Sequence
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
    def __init__(self, model: DecoderLM, cache: KVCache, max_num_seqs: int):
        self.model = model
        self.cache = cache
        cfg = model.cfg
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.sliding_window = cfg.sliding_window
        self.block_size = cache.layout.block_size
        self.mrope = cfg.mrope_section is not None
        # Rows of prompt logits scored at once: their 16-bit and fp32 copies (6 bytes a logit) stay within the
        # fp32 logits of max_num_seqs + 4 rows that memory.sizing plans for a step.
        self.score_rows = max(1, 2 * (max_num_seqs + 4) // 3)

    @torch.inference_mode()
    def forward(self, batch: list[ScheduledSeq], all_logits: bool = False) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        """Run the batch; returns fp32 logits ``[S, vocab]`` for the S sequences that sample
        (with ``all_logits``, one row per computed token instead). Prompt logprobs a sequence asked
        for are appended to its ``prompt_logprobs`` on the way."""
        step = prepare_step(batch, self.block_size, self.group, self.sliding_window, all_logits)
        ids: list[int] = []
        scoring: list[tuple[Sequence, range, int]] = []  # (sequence, positions to score, flat row of its first token)
        for item, start, end in step.spans:
            targets = item.seq.prompt_targets(start, end)
            if targets:
                scoring.append((item.seq, targets, len(ids) - start))
            ids.extend(item.seq.token_slice(start, end))
        x = self.model.embed_tokens(torch.tensor(ids, dtype=torch.long))
        positions = step.positions
        if self.mrope:
            positions = torch.from_numpy(np.concatenate([item.seq.rope_positions(start, end)
                                                         for item, start, end in step.spans], axis=1))
            place_media(x, step.spans)
        hidden = self.model.run_layers(x, positions, step.meta, self.cache)
        for seq, targets, row0 in scoring:
            self._score_prompt(seq, hidden, targets, row0)
        return self.model.logits(hidden, step.output_rows), step.sampling

    def _score_prompt(self, seq: Sequence, hidden: torch.Tensor, positions: range, row0: int) -> None:
        top_n = seq.params.prompt_logprobs or 0
        for first in range(positions.start, positions.stop, self.score_rows):
            chunk = range(first, min(first + self.score_rows, positions.stop))
            rows = torch.tensor([row0 + p for p in chunk], dtype=torch.long)
            targets = torch.tensor(seq.prompt_token_ids[chunk.start + 1 : chunk.stop + 1], dtype=torch.long)
            seq.prompt_logprobs += score_rows(self.model.logits(hidden, rows), targets, top_n)

    def forward_all_logits(self, item: ScheduledSeq) -> torch.Tensor:
        return self.forward([item], all_logits=True)[0]


def place_media(x: torch.Tensor, spans: list[tuple[ScheduledSeq, int, int]]) -> None:
    """Overwrite the rows of ``x`` (the step's input embeddings) that hold media placeholders with the media's
    embeddings, for the part of each item this step computes."""
    row0 = 0
    for item, start, end in spans:
        seq = item.seq
        for m, embeds in zip(seq.media, seq.media_embeds):
            lo, hi = np.searchsorted(m.positions, (start, end))
            if lo == hi:
                continue
            if embeds is None:
                raise RuntimeError(f"{seq.request_id}: the {m.kind} at prompt index {int(m.positions[lo])} was not encoded")
            rows = torch.from_numpy(np.asarray(m.positions[lo:hi] - start + row0, dtype=np.int64))
            x.index_copy_(0, rows, embeds[lo:hi])
        row0 += end - start
