"""The llama.cpp baseline: our GGUF loads in llama.cpp and computes what edge-infer computes.

Needs the `baseline` extra (llama-cpp-python, gguf); skipped with that reason without it.
"""
from __future__ import annotations

import os
import sys

import pytest

from edge_infer.bench.harness.runner import numeric_metrics

from .engine_models import PP_TG_METRICS, last_json, run_cli, tiny_text_checkpoint

pytest.importorskip("gguf", reason="the `baseline` extra is not installed: pip install -e '.[baseline]'")
pytest.importorskip("llama_cpp", reason="the `baseline` extra is not installed: pip install -e '.[baseline]' (compiles llama.cpp)")

from edge_infer.bench.baselines.gguf_export import export_gguf  # noqa: E402
from edge_infer.bench.baselines.llamacpp_check import run_check  # noqa: E402
from edge_infer.models.checkpoint import demo_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("llamacpp")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
def test_f32_gguf_greedy_tokens_equal_edge_infer_fp32(root, family):
    model = tiny_text_checkpoint(root, family)
    gguf_path = export_gguf(model, root / f"{family}-f32.gguf", "f32").path
    result = run_check(model, gguf_path, None, 8, "float32")
    assert result["llama_cpp"]["file_type"] == "all F32"
    mismatches = [(p["edge_infer"], p["llama_cpp"]) for p in result["prompts"] if p["edge_infer"] != p["llama_cpp"]]
    assert mismatches == []


@pytest.mark.slow
def test_demo_model_bf16_gguf_starts_every_answer_like_edge_infer(tmp_path):
    gguf_path = export_gguf(demo_model_dir(), tmp_path / "demo-bf16.gguf", "bf16").path
    result = run_check(demo_model_dir(), gguf_path, None, 8, "bfloat16")
    assert result["first_token_agreement"] == 1.0, result["prompts"]
    assert all(p["llama_cpp_text"] for p in result["prompts"])


@pytest.mark.slow
def test_quantized_ggufs_run_as_grid_arms_with_edge_infers_keys(root):
    model = tiny_text_checkpoint(root, "llama")
    done = run_cli("bench", "llamacpp", "prepare", str(model), str(root / "q"))
    assert done.returncode == 0, done.stderr[-2000:]
    files = last_json(done.stdout)["files"]
    assert set(files) == {"bf16", "Q8_0", "Q4_K_M", "Q4_0"}

    done = run_cli("bench", "llamacpp", "pp-tg", files["Q4_K_M"], "--pp", "16", "--tg", "32", "--reps", "3", "--depth", "20")
    assert done.returncode == 0, done.stderr[-2000:]
    r = last_json(done.stdout)
    assert set(numeric_metrics(r)) == PP_TG_METRICS
    assert r["pp_tps"] > 0 and r["tg_tps"] > 0 and r["engine"] == "llama.cpp"
    assert r["loaded"]["file_type"] == "Q4_K - Medium"
    assert r["loaded"]["n_threads"] == len(os.sched_getaffinity(0))
    assert r["loaded"]["n_batch"] == 16 and r["loaded"]["n_ctx"] >= 20 + 32 + 1 and r["settings"]["depth"] == 20
    # A tied head: decode reads every tensor, which is what llama.cpp says it loaded.
    assert r["loaded"]["decode_read_bytes"] == r["loaded"]["model_bytes"]
    assert r["tg_read_gb_per_s"] == round(r["tg_tps"] * r["loaded"]["decode_read_bytes"] / 1e9, 3)


def test_decode_reads_one_row_of_a_token_table_the_output_head_does_not_share(tmp_path):
    import gguf
    import numpy as np

    from edge_infer.bench.baselines.llamacpp_engine import decode_read_bytes

    def write(path, names):
        w = gguf.GGUFWriter(str(path), "llama")
        for name in names:
            w.add_tensor(name, np.zeros((100, 8), dtype=np.float32))  # 100 rows of 8
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    table = 100 * 8 * 4
    tied = write(tmp_path / "tied.gguf", ["token_embd.weight", "blk.0.ffn_up.weight"])
    untied = write(tmp_path / "untied.gguf", ["token_embd.weight", "blk.0.ffn_up.weight", "output.weight"])
    assert decode_read_bytes(tied) == 2 * table
    assert decode_read_bytes(untied) == 2 * table + 8 * 4


@pytest.mark.slow
def test_one_grid_interleaves_both_engines(root, write_spec, grid):
    model = tiny_text_checkpoint(root, "qwen2")
    gguf_path = export_gguf(model, root / "grid-bf16.gguf", "bf16").path
    cli = [sys.executable, "-m", "edge_infer.cli", "bench"]
    args = ["--pp", "16", "--tg", "32", "--reps", "3"]
    spec = write_spec([
        {"tag": "edge-infer", "command": [*cli, "pp-tg", str(model), "--dtype", "bfloat16", *args]},
        {"tag": "llama.cpp", "command": [*cli, "llamacpp", "pp-tg", str(gguf_path), *args]},
    ], metric="tg_tps")
    code, result = grid(spec, "--passes", "2")
    assert code == 0
    assert [o.status for o in result.observations] == ["ok"] * 4, [o.error for o in result.observations]
    assert [o.arm for o in result.observations] == ["edge-infer", "llama.cpp", "llama.cpp", "edge-infer"]
    assert {r.arm for r in result.summary if r.metric == "tg_tps" and r.n == 2} == {"edge-infer", "llama.cpp"}
    assert result.observations[1].output["loaded"]["file_type"] == "BF16"
