"""`bench init-memory` and `bench pp-tg` on a tiny model, run as a grid runs them: a fresh process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_infer.bench.harness.runner import numeric_metrics
from edge_infer.bench.harness.stats import direction_of
from edge_infer.cli import main

from .engine_models import PP_TG_METRICS, last_json, run_cli, tiny_text_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_text_checkpoint(tmp_path_factory.mktemp("arms"))


@pytest.mark.slow
def test_init_memory_measures_sane_figures_and_the_plan_reached_the_engine(tiny, tmp_path):
    out = tmp_path / "init.json"
    done = run_cli("bench", "init-memory", str(tiny), "--dtype", "float32", "--max-model-len", "256",
                   "--kv-cache-memory-bytes", str(3 << 20), "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = last_json(done.stdout)
    assert json.loads(out.read_text()) == r
    # As a grid arm: every top-level number is a metric whose direction its name tells.
    assert [k for k in numeric_metrics(r) if direction_of(k) is None] == []

    assert r["rss_anon_tree_mb"] > 0
    assert r["peak_rss_anon_mb"] >= r["rss_anon_tree_mb"]
    assert r["peak_rss_anon_mb"] >= r["rss_anon_at_context_mb"] > 0
    assert r["peak_rss_anon_mb"] >= r["peak_rss_anon_during_load_mb"] >= r["peak_rss_anon_loading_weights_mb"] > 0
    assert r["ready_s"] >= r["init_s"] + r["import_s"] > 0
    assert [m["phase"] for m in r["phase_marks"]] == [
        "before_import", "after_import", "weights_loaded", "after_load", "after_trim", "after_generate", "at_context"]
    assert r["filled_context"]["tokens"] == 256
    assert r["process_tree"]["n_procs_max"] >= 2  # the engine core runs in a worker process

    plan = r["plan"]
    kv_planned = next(i["bytes"] for i in plan["items"] if i["name"] == "kv cache")
    assert r["loaded"]["kv_cache_bytes"] == kv_planned == plan["settings"]["kv_cache_memory_bytes"] <= 3 << 20
    assert r["loaded"]["dtype"] == "float32" and r["settings_mismatches"] == []
    assert {row["figure"] for row in r["plan_vs_measured"]} >= {
        "steady state at a filled context", "load-time peak (weights loading)", "start-up to ready", "peak", "kv cache"}
    assert r["provenance"]["packages"]["torch"] and r["model_fingerprint"]["sha256"]


@pytest.mark.slow
def test_pp_tg_prints_llama_bench_rates_and_what_was_loaded(tiny):
    # A depth over --pp: the decode test's prompt is prefilled in chunks of --pp tokens.
    done = run_cli("bench", "pp-tg", str(tiny), "--pp", "32", "--tg", "16", "--reps", "2", "--dtype", "float32",
                   "--depth", "40")
    assert done.returncode == 0, done.stderr
    r = last_json(done.stdout)
    assert set(numeric_metrics(r)) == PP_TG_METRICS
    for key in ("pp_tps", "tg_tps", "pp_median_tps", "tg_median_tps"):
        assert r[key] > 0, key
    assert len(r["raw"]["reps"]) == 2 and r["engine"] == "edge-infer"
    assert r["loaded"]["dtype"] == "float32"
    assert r["settings"]["max_num_seqs"] == 1 and r["settings"]["max_num_batched_tokens"] == 32
    assert r["settings"]["prefix_caching"] is False
    assert r["settings"]["depth"] == 40 and r["settings"]["max_model_len"] == 40 + 16 + 1
    # Decode reads every resident weight except an untied embedding table, of which it reads one row.
    cfg = json.loads((tiny / "config.json").read_text())
    untied_table = 0 if cfg.get("tie_word_embeddings") else (cfg["vocab_size"] - 1) * cfg["hidden_size"] * 4
    assert r["loaded"]["weight_bytes"] - r["loaded"]["decode_read_bytes"] == untied_table
    assert r["tg_read_gb_per_s"] == round(r["tg_tps"] * r["loaded"]["decode_read_bytes"] / 1e9, 3)
    assert r["mem_read_gb_per_s"] > 0


def test_pp_tg_refuses_more_than_one_sequence(tiny, capsys):
    assert main(["bench", "pp-tg", str(tiny), "--max-num-seqs", "2"]) == 2
    assert "drop --max-num-seqs" in capsys.readouterr().err


def test_init_memory_reports_an_unloadable_setting_as_a_failed_arm(tiny, tmp_path, capsys):
    code = main(["bench", "init-memory", str(tiny), "--max-model-len", "100000", "--out", str(tmp_path / "x.json")])
    assert code == 1
    assert "max_model_len" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
