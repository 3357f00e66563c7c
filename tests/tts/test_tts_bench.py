"""``edge-infer bench tts`` on the tiny checkpoint: one JSON line of metrics a grid arm can read."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import edge_infer
from edge_infer.bench.measures.tts import Band, parse_bands
from tts_helpers import TINY


def test_bands_parse_and_their_text_grows_with_the_length() -> None:
    bands = parse_bands("short:10, long:200")
    assert bands == [Band("short", 10), Band("long", 200)]
    assert len(bands[1].text.split()) > len(bands[0].text.split())
    with pytest.raises(ValueError, match="NAME:FRAMES"):
        parse_bands("short")


@pytest.mark.slow
def test_bench_tts_prints_ttfp_rtf_and_stage_times_per_band_and_level() -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(edge_infer.__file__).resolve().parents[1]))
    cmd = [sys.executable, "-m", "edge_infer.cli", "bench", "tts", str(TINY), "--concurrency", "1,2", "--requests", "1",
           "--bands", "short:4,long:8", "--num-threads", "1", "--dtype", "float32"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    metrics = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    for level in ("c1", "c2"):
        for band in ("short", "long"):
            prefix = f"{level}_{band}"
            assert 0 < metrics[f"{prefix}_ttfp_p50_ms"] <= metrics[f"{prefix}_ttfp_p95_ms"]
            assert 0 < metrics[f"{prefix}_rtf_p50"] <= metrics[f"{prefix}_rtf_p95"]
            assert metrics[f"{prefix}_talker_p50_ms"] > 0 and metrics[f"{prefix}_code2wav_p50_ms"] > 0
            assert metrics[f"{prefix}_audio_s_per_s"] > 0
    assert metrics["talker_dtype"] == "float32" and metrics["talker_quantization"] == "none"
    assert "TTFP p50" in done.stderr
