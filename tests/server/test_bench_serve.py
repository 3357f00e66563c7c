"""``edge-infer bench serve`` runs end to end on a tiny model and prints its metrics as one JSON line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_serve_reports_engine_and_server_metrics_per_level(served_model):
    cmd = [sys.executable, "-m", "edge_infer.cli", "bench", "serve", str(served_model), "--dtype", "float32",
           "--num-threads", "1", "--max-model-len", "256", "--concurrency", "1,2", "--requests", "2", "--max-tokens", "8"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    for c in (1, 2):
        for arm in ("engine", "server"):
            assert metrics[f"c{c}_{arm}_out_tps"] > 0
            assert metrics[f"c{c}_{arm}_ttft_p95_ms"] >= metrics[f"c{c}_{arm}_ttft_p50_ms"] > 0
        assert f"c{c}_overhead_tpot_ms" in metrics
    assert "server overhead per token" in out.stderr


def test_bench_serve_refuses_more_clients_than_sequences(served_model):
    cmd = [sys.executable, "-m", "edge_infer.cli", "bench", "serve", str(served_model), "--max-num-seqs", "2", "--concurrency", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--max-num-seqs 2" in out.stderr
