"""The int8 KV cache: planned exactly, nearly twice the tokens per byte, and close to the 16/32-bit cache."""
from __future__ import annotations

import pytest
import torch

from edge_infer.config import QuantConfig
from edge_infer.engine.core import EngineCore
from edge_infer.memory.plan import plan_text_session
from edge_infer.models.layers.kv_cache import Int8KV, KVLayout

PROMPT = [(13 * i + 7) % 380 + 1 for i in range(90)]
SETTINGS = dict(dtype="float32", max_model_len=256, max_num_seqs=2, max_num_batched_tokens=64)


def test_codes_and_scales_round_trip_within_half_a_step():
    codes = torch.zeros(4, 16, 2, 64, dtype=torch.int8)
    scales = torch.zeros(4, 16, 2)
    kv = Int8KV(codes, scales, torch.float32)
    x = torch.randn(20, 2, 64) * torch.tensor([0.01, 30.0]).view(1, 2, 1)  # heads of very different ranges
    x[3, 0] = 0  # an all-zero head
    kv.write(torch.arange(20) + 5, x)
    back = kv.read(torch.tensor([0, 1]), contiguous_from=0)[5:25]
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((back - x).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(back[3, 0], torch.zeros(64))
    gathered = kv.read(torch.tensor([1, 0]), contiguous_from=None)  # the same rows through a gather
    assert torch.equal(gathered[16:32], kv.read(torch.tensor([0]), contiguous_from=0))


def test_the_plan_holds_nearly_twice_the_tokens_and_the_engine_allocates_exactly_that(hf_checkpoints):
    path = hf_checkpoints["llama"]  # head_dim 16: 16 + 4 bytes per head instead of 64
    budget = 2 << 20
    dense = plan_text_session(path, kv_cache_memory_bytes=budget, **SETTINGS)
    int8 = plan_text_session(path, kv_cache_memory_bytes=budget, kv_cache_dtype="int8", **SETTINGS)
    assert int8.settings["kv_cache_dtype"] == "int8" and dense.settings["kv_cache_dtype"] == "float32"
    d = int8.model_config.head_dim
    assert int8.settings["kv_cache_tokens"] // 16 == budget // (KVLayout.for_model(int8.model_config, 4, 16, int8=True).bytes_per_block)
    assert int8.settings["kv_cache_tokens"] / dense.settings["kv_cache_tokens"] == pytest.approx(4 * d / (d + 4), rel=0.02)
    core = EngineCore(int8.engine_config)
    assert core.ready_info.kv_cache_bytes == int8.item("kv cache") <= budget
    assert core.cache.storage.dtype == torch.int8


def test_int8_kv_scores_close_to_the_full_precision_cache(hf_checkpoints):
    path = hf_checkpoints["llama"]
    full = EngineCore(plan_text_session(path, kv_cache_memory_bytes=2 << 20, **SETTINGS).engine_config)
    int8 = EngineCore(plan_text_session(path, kv_cache_memory_bytes=2 << 20, kv_cache_dtype="int8", **SETTINGS).engine_config)
    a, b = full.score(PROMPT), int8.score(PROMPT)
    kl = torch.nn.functional.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="batchmean")
    assert kl.item() < 1e-3
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.95


def test_a_fused_decode_quantization_says_it_runs_the_layers_with_an_int8_cache(hf_checkpoints):
    plan = plan_text_session(hf_checkpoints["llama"], quantization=QuantConfig.named("cpu_w4a8", group_size=32),
                             kv_cache_dtype="int8", dtype="bfloat16", max_model_len=256)
    assert any("not the fused int8 decode layer" in n for n in plan.notes)
    with pytest.raises(Exception, match="kv_cache_dtype must be one of auto, int8"):
        plan_text_session(hf_checkpoints["llama"], kv_cache_dtype="fp8", max_model_len=256)
