"""`bench transport` and `bench pipeline` produce their metrics (values are measured elsewhere)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_infer.runtime.transport import list_segments


def bench(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "edge_infer.cli", "bench", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_transport_reports_both_paths_per_size_and_leaves_no_segment(tmp_path):
    before = set(list_segments("ei"))
    metrics = bench("transport", "--sizes", "256,100000", "--repeats", "1", "--budget-s", "0.02", "--out", str(tmp_path / "t.json"))
    for size in (256, 100000):
        for path in ("inline", "shm"):
            assert metrics[f"{path}_{size}_us"] > 0
    assert set(list_segments("ei")) <= before
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["provenance"]["host"] and doc["metrics"] == metrics


@pytest.mark.slow
def test_pipeline_compares_the_engine_with_one_and_two_stages(tiny_model):
    metrics = bench("pipeline", str(tiny_model), "--prompt-tokens", "8", "--max-tokens", "6", "--reps", "1")
    for arm in ("engine", "stage", "two_stages"):
        assert metrics[f"{arm}_decode_tps"] > 0 and metrics[f"{arm}_startup_s"] > 0
    assert "stage_overhead_ms_per_token" in metrics and "second_stage_startup_s" in metrics
