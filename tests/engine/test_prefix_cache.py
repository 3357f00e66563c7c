"""Prefix caching: shared full KV blocks give the tokens a cold run gives, computing only what is new,
through eviction, preemption, cancel and concurrent sharing, with every block free at the end."""
from __future__ import annotations

import pytest

from edge_infer import LLM, SamplingParams
from edge_infer.config import EngineConfig
from edge_infer.engine.block_allocator import BlockAllocator
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest

SYSTEM = [(11 * i + 5) % 380 + 1 for i in range(50)]  # a shared "system prompt": 3 full blocks of 16 and 2 tokens
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def engine(path, prefix_caching: bool = True, **kw) -> EngineCore:
    settings = dict(model=str(path), dtype="float32", max_model_len=256, max_num_seqs=4,
                    max_num_batched_tokens=32, kv_cache_memory_bytes=4 << 20, prefix_caching=prefix_caching)
    return EngineCore(EngineConfig(**{**settings, **kw}))


def run(core: EngineCore, requests: dict[str, list[int]], params: SamplingParams = GREEDY) -> dict[str, list[int]]:
    for rid, prompt in requests.items():
        assert core.add_request(EngineRequest(rid, prompt, params)) is None
    return drain(core, requests)


def drain(core: EngineCore, requests) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    while core.has_work():
        for d in core.step():
            if d.token_id is not None:
                out[d.request_id].append(d.token_id)
    return out


def deltas_of(core: EngineCore, rid: str, prompt: list[int], params: SamplingParams = GREEDY) -> list:
    """One more request on ``core``, run to its end: its deltas."""
    core.add_request(EngineRequest(rid, prompt, params))
    deltas = []
    while core.has_work():
        deltas += core.step()
    return deltas


def tokens(deltas) -> list[int]:
    return [d.token_id for d in deltas if d.token_id is not None]


def cold(path, requests: dict[str, list[int]], params: SamplingParams = GREEDY) -> dict[str, list[int]]:
    """Each request alone on an engine without a prefix cache."""
    return {rid: run(engine(path, prefix_caching=False), {rid: p}, params)[rid] for rid, p in requests.items()}


@pytest.fixture(scope="module")
def model(hf_checkpoints):
    return hf_checkpoints["llama"]


def test_allocator_keeps_released_full_blocks_findable_and_evicts_the_least_recent_first():
    alloc = BlockAllocator(4)
    a, b = alloc.allocate(1), alloc.allocate(1)
    alloc.cache(a[0], b"A")
    alloc.cache(b[0], b"B")
    alloc.free(a)
    alloc.free(b)
    assert alloc.num_free == 4 and alloc.num_cached == 2  # cached blocks are free space
    assert alloc.take_cached([b"A", b"X", b"B"]) == a  # the longest prefix found: a miss ends it
    assert alloc.num_free == 3
    alloc.free(a)
    alloc.allocate(3)  # two never-held blocks, then the least recently released cached one: b
    assert alloc.num_evictions == 1 and alloc.take_cached([b"B"]) == [] and alloc.take_cached([b"A"]) == a
    with pytest.raises(RuntimeError, match="freed twice"):
        alloc.free(a + a)


def test_a_shared_prefix_is_computed_once_and_gives_the_cold_tokens(model):
    requests = {"a": SYSTEM + [7, 8, 9], "b": SYSTEM + [30, 31, 32, 33]}
    core = engine(model)
    first = run(core, {"a": requests["a"]})
    computed = core.stats.prompt_tokens_computed
    deltas = deltas_of(core, "b", requests["b"])
    assert {**first, "b": tokens(deltas)} == cold(model, requests)
    assert deltas[0].num_cached_tokens == 48  # SYSTEM's three full blocks
    assert core.stats.prompt_tokens_computed - computed == len(requests["b"]) - 48
    stats = core.current_stats()
    assert stats.prefix_cache_hit_tokens == 48 and stats.kv_blocks_used == 0


def test_a_repeated_prompt_still_computes_its_last_token(model):
    prompt = SYSTEM[:48]  # exactly three blocks: the third is computed again (its last token is sampled from)
    core = engine(model)
    assert run(core, {"a": prompt}) == cold(model, {"a": prompt})
    deltas = deltas_of(core, "b", prompt)
    assert deltas[0].num_cached_tokens == 32
    assert tokens(deltas) == cold(model, {"b": prompt})["b"]


def test_eviction_under_a_tight_budget_keeps_outputs_exact(model):
    requests = {f"r{i}": [(97 * i + 13 * j) % 380 + 1 for j in range(40)] for i in range(6)}
    requests["again"] = requests["r0"]
    tight = engine(model, kv_cache_memory_bytes=_blocks(model, 8), max_model_len=112)  # 128 tokens: about two requests
    outputs = {}
    for rid, prompt in requests.items():  # one after the other: each leaves its blocks cached
        outputs.update(run(tight, {rid: prompt}))
    assert outputs == cold(model, requests)
    stats = tight.current_stats()
    assert stats.prefix_cache_evictions > 0 and stats.kv_blocks_used == 0


def test_preemption_and_recompute_with_shared_blocks_keep_outputs_exact(model):
    requests = {"a": SYSTEM + [1, 2, 3], "b": SYSTEM + [4, 5, 6]}
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    tight = engine(model, kv_cache_memory_bytes=_blocks(model, 8), max_model_len=112)
    assert run(tight, requests, params) == cold(model, requests, params)
    assert tight.scheduler.num_preemptions >= 1
    assert tight.current_stats().kv_blocks_used == 0


def test_a_request_cancelled_mid_prefill_leaves_only_computed_blocks_cached(model):
    long_prompt = SYSTEM + [(5 * i) % 380 + 1 for i in range(60)]  # 110 tokens: four 32-token chunks
    core = engine(model)
    core.add_request(EngineRequest("a", long_prompt, GREEDY))
    core.step()  # the first 32 tokens: two full blocks computed
    core.abort(["a"])
    assert core.current_stats().kv_blocks_used == 0
    deltas = deltas_of(core, "b", long_prompt)
    assert deltas[0].num_cached_tokens == 32
    assert tokens(deltas) == cold(model, {"b": long_prompt})["b"]


def test_concurrent_requests_share_blocks_and_free_them_all(model):
    requests = {f"r{i}": SYSTEM + [100 + i, 200 + i] for i in range(4)}
    core = engine(model)
    run(core, {"warm": SYSTEM + [1]})
    for rid, prompt in requests.items():
        core.add_request(EngineRequest(rid, prompt, GREEDY))
    first = {d.request_id: d.token_id for d in core.step()}  # all four admitted and sampled at once
    held = core.current_stats().kv_blocks_used
    assert held < 4 * 4, "the four running requests hold SYSTEM's blocks once, not four times"
    rest = drain(core, requests)
    assert {rid: [first[rid], *rest[rid]] for rid in requests} == cold(model, requests)
    assert core.current_stats().kv_blocks_used == 0


def test_prompt_logprobs_requests_compute_every_prompt_token(model):
    core = engine(model)
    run(core, {"warm": SYSTEM + [1]})
    deltas = deltas_of(core, "s", SYSTEM + [2], SamplingParams(max_tokens=1, prompt_logprobs=0))
    assert deltas[0].num_cached_tokens == 0 and len(deltas[0].prompt_logprobs) == len(SYSTEM)


def test_llm_reports_cached_tokens_and_can_turn_the_cache_off(tiny_model):
    prompt = {"prompt_token_ids": list(range(10, 60))}
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    with LLM(tiny_model, max_model_len=128, max_num_seqs=2, worker="thread") as llm:
        assert llm.plan.settings["prefix_caching"] is True
        cold_out = llm.generate(prompt, params)[0]
        warm = llm.generate(prompt, params)[0]
    assert cold_out.num_cached_tokens == 0 and warm.num_cached_tokens == 48
    assert warm.outputs[0].token_ids == cold_out.outputs[0].token_ids
    with LLM(tiny_model, max_model_len=128, max_num_seqs=2, worker="thread", prefix_caching=False) as llm:
        llm.generate(prompt, params)
        assert llm.generate(prompt, params)[0].num_cached_tokens == 0


def _blocks(path, n: int) -> int:
    """The KV budget of ``n`` blocks of this model."""
    probe = engine(path, prefix_caching=False)
    return probe.cache.nbytes // probe.cache.num_blocks * n
