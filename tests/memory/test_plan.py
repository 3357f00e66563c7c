"""Memory admission: itemised plans, refusals with reasons and levers, the CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_infer import LLM, plan_text_session
from edge_infer.cli import main as cli_main
from edge_infer.models.layers.kv_cache import KVLayout
from edge_infer.hardware.cpu import detect, profile
from edge_infer.hardware.kernels import KERNELS

_onednn_missing = KERNELS["onednn-bf16"].missing(detect())
needs_onednn_bf16 = pytest.mark.skipif(_onednn_missing is not None, reason=str(_onednn_missing))

ITEMS = {"runtime overhead", "weights", "kv cache", "rope tables", "activations", "load transient", "checkpoint pages"}


def test_sensible_plan_is_admitted_and_itemised(tiny_model):
    plan = plan_text_session(tiny_model, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=128)
    assert plan.admitted and plan.reasons == []
    d = plan.to_dict()
    assert {i["name"] for i in d["items"]} == ITEMS
    assert all(isinstance(i["bytes"], int) and i["bytes"] > 0 for i in d["items"])
    assert d["peak_bytes"] == max(d["steady_bytes"], d["load_peak_bytes"]) <= d["available_bytes"]
    assert plan.item("rope tables") == 2 * 512 * 32 * 4  # sized to max_model_len, fp32 cos+sin, head_dim 32
    assert plan.engine_config.max_model_len == 512


def test_a_server_plans_the_request_bodies_it_holds(tiny_model):
    """The bodies of a server's requests in flight (at most --max-body-bytes-in-flight) are an item, at the bytes
    per body byte measured for a server process (scripts/measure_overhead.py --bodies); the library plans none."""
    from edge_infer.memory.sizing import runtime_overhead

    settings = dict(max_model_len=512, max_num_seqs=4, max_num_batched_tokens=128, frontend="server")
    plain = plan_text_session(tiny_model, **settings)
    server = plan_text_session(tiny_model, body_bytes_in_flight=32 << 20, **settings)
    per_byte = runtime_overhead()["server_bytes_per_body_byte"]
    assert 1.5 < per_byte < 3  # raw and parsed: about two copies
    assert server.item("request bodies") == int(per_byte * (32 << 20))
    assert server.steady_bytes - plain.steady_bytes == server.item("request bodies")
    assert "request bodies" not in {i.name for i in plain.items}
    assert "--max-body-bytes-in-flight" in next(i.note for i in server.items if i.name == "request bodies")


def test_oversized_max_num_seqs_is_refused_with_reasons(tiny_model):
    plan = plan_text_session(tiny_model, max_num_seqs=100000)
    assert not plan.admitted
    assert any("max_num_seqs (100000)" in r for r in plan.reasons)
    assert plan.levers and plan.engine_config is None


@pytest.mark.parametrize("setting", ["max_num_seqs", "max_num_batched_tokens"])
def test_a_zero_batch_setting_is_refused_not_taken_as_the_default(tiny_model, setting):
    # 0 used to become the default (8 sequences, 512 tokens) without a word
    plan = plan_text_session(tiny_model, **{setting: 0})
    assert not plan.admitted and "max_num_seqs and max_num_batched_tokens must be at least 1" in plan.reasons


def test_emulated_bf16_linears_plan_the_fp32_copy_of_their_output(tiny_model):
    # oneDNN's bf16 linears emulated on AVX-512 without bf16 hold their whole output in fp32 while they run: the
    # Qwen2.5-0.5B shape's measured peak was 1.0075x its plan on an Ice Lake Xeon without it, 0.987x with it
    def activations(cpu: str, **kw) -> int:
        return plan_text_session(tiny_model, dtype="bfloat16", max_num_batched_tokens=128, cpu=profile(cpu),
                                 **kw).item("activations")
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert activations("avx512") - activations("avx512-bf16") == 128 * 2 * cfg["intermediate_size"] * 4
    assert activations("avx512", quantization="cpu_w4a8") == activations("avx512-bf16", quantization="cpu_w4a8")


def test_kv_budget_below_one_sequence_is_refused_with_the_lever(tiny_model):
    plan = plan_text_session(tiny_model, max_model_len=1024, kv_cache_memory_bytes=100_000)
    assert not plan.admitted
    assert any("less than one sequence of max_model_len=1024" in r for r in plan.reasons)
    assert any(lever.startswith("--kv-cache-memory-bytes") for lever in plan.levers)


def test_not_enough_memory_names_the_numbers_and_levers(tiny_model):
    plan = plan_text_session(tiny_model, max_model_len=1024, available_bytes=50 << 20)
    assert not plan.admitted
    assert any("exceeds the 50.0 MiB available" in r for r in plan.reasons)
    assert any("cpu_int4" in lever for lever in plan.levers)


def test_context_beyond_the_model_is_refused(tiny_model):
    plan = plan_text_session(tiny_model, max_model_len=4096)  # tiny preset: 2048 positions
    assert not plan.admitted and any("max_position_embeddings=2048" in r for r in plan.reasons)


def test_default_kv_budget_is_whole_blocks_and_fits(tiny_model):
    plan = plan_text_session(tiny_model, max_model_len=256, max_num_seqs=2)
    # dtype auto: bf16 where the CPU has it, fp32 elsewhere; the KV cache holds that dtype.
    layout = KVLayout(2, 2, 32, 2 if plan.settings["dtype"] == "bfloat16" else 4)
    assert plan.item("kv cache") % layout.bytes_per_block == 0
    assert plan.item("kv cache") == 2 * 256 * layout.bytes_per_token  # max_num_seqs full sequences fit


def test_planned_bytes_equal_what_the_engine_allocates(tiny_model):
    for dtype in ("float32", "bfloat16"):
        with LLM(tiny_model, dtype=dtype, max_model_len=256, worker="thread") as llm:
            assert llm.ready.weight_bytes == llm.plan.item("weights")
            assert llm.ready.kv_cache_bytes == llm.plan.item("kv cache")
            assert llm.ready.rope_bytes == llm.plan.item("rope tables")
            assert llm.ready.dtype == dtype


def test_plan_cli_prints_the_table_and_exits_nonzero_on_refusal(tiny_model, capsys):
    assert cli_main(["plan", str(tiny_model), "--max-model-len", "256"]) == 0
    out = capsys.readouterr().out
    assert "ADMITTED" in out and "kv cache" in out and "weights" in out
    assert cli_main(["plan", str(tiny_model), "--max-num-seqs", "100000"]) == 1
    out = capsys.readouterr().out
    assert "REFUSED" in out and "levers" in out
    assert cli_main(["plan", str(tiny_model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["admitted"] is True


def test_planning_does_not_import_torch(tiny_model):
    code = (
        "import sys; from edge_infer.memory.plan import plan_text_session; "
        f"p = plan_text_session({str(tiny_model)!r}); assert 'torch' not in sys.modules, 'torch imported'; print(p.admitted)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@needs_onednn_bf16
def test_packed_head_costs_one_table_and_the_engine_holds_exactly_that(tiny_model):
    base = plan_text_session(tiny_model, max_model_len=256, dtype="bfloat16")
    packed = plan_text_session(tiny_model, max_model_len=256, dtype="bfloat16", packed_head=True)
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert packed.item("weights") - base.item("weights") == cfg["vocab_size"] * cfg["hidden_size"] * 2
    with LLM(tiny_model, max_model_len=256, dtype="bfloat16", packed_head=True, worker="thread") as llm:
        assert llm.ready.weight_bytes == packed.item("weights")
        assert llm.ready.weight_kernels["onednn-bf16"] == 2 * cfg["num_hidden_layers"] * 2 + 1  # 4 per layer + the head


def test_packed_head_is_refused_where_its_kernel_cannot_run(tiny_model):
    refused = plan_text_session(tiny_model, max_model_len=256, dtype="float32", packed_head=True)
    assert not refused.admitted and any("--packed-head" in r and "bfloat16" in r for r in refused.reasons)
    no_avx512 = plan_text_session(tiny_model, max_model_len=256, dtype="bfloat16", packed_head=True, cpu=profile("avx2"))
    assert not no_avx512.admitted
    assert any("--packed-head: onednn-bf16 needs avx512bw, avx512vl, avx512dq" in r and "drop --packed-head" in r
               for r in no_avx512.reasons)
