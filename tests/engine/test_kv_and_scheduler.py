"""Block allocation, the exact KV budget, and the scheduler's batching and preemption."""
from __future__ import annotations

import pytest

from edge_infer.engine.block_allocator import BlockAllocator
from edge_infer.models.layers.kv_cache import KVCache, KVLayout
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.engine.scheduler import Scheduler
from edge_infer.engine.sequence import Sequence, Status

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype_bytes=4, block_size=4)


def seq(rid: str, prompt_len: int, max_tokens: int = 100) -> Sequence:
    return Sequence(request_id=rid, prompt_token_ids=list(range(1, prompt_len + 1)),
                    params=SamplingParams(max_tokens=max_tokens), arrival_time=0.0)


def test_budget_becomes_whole_blocks_allocated_once():
    budget = 10 * LAYOUT.bytes_per_block + 123
    blocks = LAYOUT.blocks_for_budget(budget)
    import torch

    cache = KVCache(LAYOUT, blocks, torch.float32)
    assert blocks == 10
    assert cache.nbytes == 10 * LAYOUT.bytes_per_block
    assert len(cache.k) == len(cache.v) == LAYOUT.num_layers


def test_allocator_keeps_a_growing_sequence_contiguous():
    alloc = BlockAllocator(16)
    a = alloc.allocate(2)
    b = alloc.allocate(2)  # starts at the largest free run, leaving room after a? no: after b's start
    a += alloc.allocate(1, after=a[-1]) or []
    assert a[:2] == [a[0], a[0] + 1]
    assert len(set(a) | set(b)) == 5
    alloc.free(a)
    alloc.free(b)
    assert alloc.num_free == 16


def test_allocator_refuses_when_exhausted_and_detects_double_free():
    alloc = BlockAllocator(3)
    got = alloc.allocate(3)
    assert alloc.allocate(1) is None
    alloc.free(got[:1])
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.free(got[:1])


def test_chunked_prefill_respects_the_token_budget():
    sched = Scheduler(LAYOUT, num_blocks=64, max_num_seqs=4, max_num_batched_tokens=8)
    s = seq("a", 20)
    sched.add(s)
    steps = []
    while s.num_computed < s.num_tokens:
        batch = sched.schedule()
        steps.append([(b.seq.request_id, b.num_new, b.reaches_last_token) for b in batch])
        for b in batch:
            b.seq.num_computed += b.num_new
    assert steps == [[("a", 8, False)], [("a", 8, False)], [("a", 4, True)]]


def test_decodes_go_first_and_max_num_seqs_limits_admission():
    sched = Scheduler(LAYOUT, num_blocks=64, max_num_seqs=2, max_num_batched_tokens=16)
    seqs = [seq(str(i), 5) for i in range(3)]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert [b.seq.request_id for b in batch] == ["0", "1"]
    assert seqs[2].status is Status.WAITING


def test_preemption_frees_the_newest_and_requeues_it_first():
    # 4 blocks of 4 tokens = 16 tokens in all; two sequences of 7 prompt tokens fill 2 blocks each.
    sched = Scheduler(LAYOUT, num_blocks=4, max_num_seqs=2, max_num_batched_tokens=32)
    a, b = seq("a", 7), seq("b", 7)
    sched.add(a)
    sched.add(b)
    for item in sched.schedule():
        item.seq.num_computed += item.num_new
    # each samples a token, then needs more room as they grow
    for s in (a, b):
        s.output_token_ids += [1, 1]
    batch = sched.schedule()
    assert [x.seq.request_id for x in batch] == ["a"]
    assert b.status is Status.WAITING and b.num_computed == 0 and b.num_preemptions == 1
    assert sched.waiting[0] is b
    assert sched.allocator.num_free == 4 - len(a.blocks)


def test_paused_sequences_keep_blocks_but_are_not_scheduled():
    sched = Scheduler(LAYOUT, num_blocks=8, max_num_seqs=2, max_num_batched_tokens=16)
    s = seq("a", 3)
    s.credits = 0
    sched.add(s)
    assert sched.schedule() == [] or all(b.seq is not s for b in sched.schedule())
