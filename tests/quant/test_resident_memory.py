"""Measured, not computed: loading int4 weights grows RssAnon by the plan's weight figure, not by a second copy."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testutil import write_hf_checkpoint

MiB = 1 << 20

MEASURE = """
import json, sys
import torch
from edge_infer.config import QuantConfig
from edge_infer.engine.core import load_model
from edge_infer.memory.measure import malloc_trim, rss_anon_bytes
from edge_infer.memory.plan import plan_text_session
from edge_infer.quant.kernel import Int4Kernel
from edge_infer.quant.quantize import quantize_rows

torch.set_num_threads(1)
# Warm up every op loading uses, so first-call allocations are not counted as weights.
q = quantize_rows(torch.randn(64, 128), 64, True)
k = Int4Kernel(64, 128, 64, torch.bfloat16)
k.write_rows(0, q.codes, q.scales, q.zeros)
k(torch.randn(2, 128, dtype=torch.bfloat16))
quant = QuantConfig(group_size=64) if sys.argv[2] == "packed" else None
plan = plan_text_session(sys.argv[1], quantization=quant, dtype="bfloat16", max_model_len=128, kv_cache_memory_bytes=1 << 20)
malloc_trim()
before = rss_anon_bytes()
model = load_model(plan.engine_config)
malloc_trim()
print(json.dumps({"grown": rss_anon_bytes() - before, "planned": plan.item("weights"), "resident": model.resident_bytes()}))
"""


def measure(model, variant: str) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(model), variant], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_rss_anon_grows_by_the_packed_weights_only(tmp_path):
    model = write_hf_checkpoint(
        tmp_path / "medium", "qwen2", hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, vocab_size=4096,
    )
    dense_linears = 4 * (768 * 512 + 512 * 512 + 4096 * 512 + 512 * 2048) * 2  # what a bf16 copy would add
    packed = measure(model, "packed")
    assert packed["resident"] == packed["planned"]
    assert packed["planned"] - 2 * MiB <= packed["grown"] <= packed["planned"] + 6 * MiB, packed
    # The measurement resolves a dense copy: bf16 linears make RssAnon grow by their bytes.
    dense = measure(model, "bf16")
    assert dense["resident"] == dense["planned"]
    assert dense["planned"] - 2 * MiB <= dense["grown"] <= dense["planned"] + 6 * MiB, dense
    assert dense["grown"] - packed["grown"] >= dense_linears // 2, (dense, packed)
