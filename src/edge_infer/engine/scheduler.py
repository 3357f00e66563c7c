"""Continuous batching with chunked prefill and preempt-and-recompute.

Every step has a budget of ``max_num_batched_tokens``. Running sequences go
first, oldest first (a decode costs one token, an unfinished prefill the next
chunk), then waiting sequences are admitted while the budget, the
``max_num_seqs`` limit and free KV blocks allow.

When a running sequence needs a block and none is free, the newest other
running sequence is preempted: its blocks are freed and it returns to the
front of the queue, to be recomputed (prompt + tokens so far) when blocks
are free again. Its tokens are unchanged; it only loses time. A sequence
whose consumer has not read its output (no credits left) keeps its blocks but
is not scheduled.

With prefix caching, a sequence being admitted first takes the cached blocks
of its longest cached prefix of full blocks (never its last token: that one
is computed so that its logits can be sampled), and every block a step
fills is cached for later requests (engine/block_allocator.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from edge_infer.engine.block_allocator import BlockAllocator
from edge_infer.models.layers.kv_cache import KVLayout
from edge_infer.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new: int  # tokens computed for it this step

    @property
    def reaches_last_token(self) -> bool:
        """True when this step computes the sequence's last token, so a new one is sampled after it."""
        return self.seq.num_computed + self.num_new == self.seq.num_tokens


class Scheduler:
    def __init__(self, layout: KVLayout, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                 prefix_caching: bool = False):
        self.layout = layout
        self.allocator = BlockAllocator(num_blocks)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefix_caching = prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.prefix_query_tokens = 0  # tokens looked up at admission
        self.prefix_hit_tokens = 0  # of those, found cached

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_schedulable(self) -> bool:
        return bool(self.waiting) or any(not s.paused for s in self.running)

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Blocks for ``tokens`` tokens of a sequence run outside the queue (scoring)."""
        return self._ensure_blocks(seq, tokens)

    def release(self, seq: Sequence) -> None:
        self._release(seq)

    def _ensure_blocks(self, seq: Sequence, tokens: int) -> bool:
        needed = self.layout.blocks_for_tokens(tokens) - len(seq.blocks)
        if needed <= 0:
            return True
        got = self.allocator.allocate(needed, after=seq.blocks[-1] if seq.blocks else None)
        if got is None:
            return False
        seq.blocks.extend(got)
        return True

    def _release(self, seq: Sequence) -> None:
        self.allocator.free(seq.blocks)
        seq.blocks = []
        seq.num_cached_blocks = 0

    def _take_cached_prefix(self, seq: Sequence) -> None:
        if seq.prompt_logprobs is not None:  # every prompt token must be computed to be scored
            return
        size = self.layout.block_size
        reusable = (seq.num_tokens - 1) // size  # the last token is always computed: it is sampled from
        blocks = self.allocator.take_cached(seq.full_block_hashes(reusable, size))
        seq.blocks, seq.num_cached_blocks, seq.num_computed = blocks, len(blocks), len(blocks) * size
        self.prefix_query_tokens += seq.num_tokens
        self.prefix_hit_tokens += seq.num_computed
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Cache the blocks of ``seq`` that are now full and computed."""
        full = seq.num_computed // self.layout.block_size
        if not self.prefix_caching or full <= seq.num_cached_blocks:
            return
        hashes = seq.full_block_hashes(full, self.layout.block_size)
        for j in range(seq.num_cached_blocks, full):
            self.allocator.cache(seq.blocks[j], hashes[j])
        seq.num_cached_blocks = full

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        out: list[ScheduledSeq] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.paused or seq.remaining == 0:
                i += 1
                continue
            n = min(seq.remaining, budget)
            while not self._ensure_blocks(seq, seq.num_computed + n):
                later = self.running[i + 1 :]
                victim = later[-1] if later else seq
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                continue  # preempted itself; self.running[i] is now the next sequence
            out.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.prefix_caching and not seq.blocks:
                self._take_cached_prefix(seq)
            n = min(seq.remaining, budget)
            if not self._ensure_blocks(seq, seq.num_computed + n):
                self._release(seq)  # a waiting sequence holds nothing (not even cached blocks others could evict)
                seq.num_computed = 0
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.FINISHED:
            return
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        else:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
