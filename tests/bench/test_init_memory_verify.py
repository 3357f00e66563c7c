"""bench init-memory refuses a run whose engine did not load what the plan promised (kernel, KV, dtype)."""
from __future__ import annotations

from types import SimpleNamespace

from edge_infer.bench.measures.init_memory import verify_loaded


def plan(quantization: str | None) -> SimpleNamespace:
    return SimpleNamespace(settings={"quantization": quantization, "dtype": "bfloat16"}, item=lambda name: 1024)


def ready(kernels: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(kv_cache_bytes=1024, dtype="bfloat16", weight_kernels=kernels)


def test_each_quantization_must_load_its_own_kernel():
    assert verify_loaded(plan("cpu_w4a8 g128 sym"), ready({"cpu-w4a8": 96, "dense": 1})) == []
    assert verify_loaded(plan("cpu_int4 g32 asym +head"), ready({"cpu-int4": 97})) == []
    wrong = verify_loaded(plan("cpu_w4a8 g128 sym"), ready({"cpu-int4": 96, "dense": 1}))
    assert len(wrong) == 1 and "cpu_w4a8 g128 sym planned but its kernel did not load" in wrong[0]


def test_unquantized_plans_must_not_load_quantized_kernels():
    assert verify_loaded(plan(None), ready({"onednn-bf16": 96, "dense": 1})) == []
    assert "no quantization planned" in verify_loaded(plan(None), ready({"cpu-w4a8": 96}))[0]
