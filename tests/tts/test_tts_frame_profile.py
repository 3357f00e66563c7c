"""benchmarks/profile_tts_frame.py on the tiny checkpoint: a profile with every figure, and its table row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tts_helpers import TINY

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_tts_frame.py"


def test_frame_profile_accounts_for_the_talker_and_code2wav(tmp_path: Path) -> None:
    out = tmp_path / "frames" / "tiny.json"
    run = subprocess.run([sys.executable, str(SCRIPT), str(TINY), "--dtype", "float32", "--frames", "4", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    p = json.loads(out.read_text())
    assert p["settings"]["threads"] == 1 and p["settings"]["frames"] == 4 and p["provenance"]["finished_at"]
    assert p["settings"]["talker_dtype"] == p["settings"]["code2wav_dtype"] == "float32"
    parts = p["weight_products_ms_per_frame"] + p["other_operators_ms_per_frame"]
    assert 0 < p["weight_products_ms_per_frame"] < parts
    # The profiler's own cost can push the operators' sum past the unprofiled wall time; not far past.
    assert 0 < parts < 3 * p["talker_ms_per_frame"]
    assert p["weight_bytes_per_frame"] > 0 and p["weight_gb_per_s"] > 0
    assert set(p["code2wav_ms_per_frame_by_chunk"]) == {"1", "4", "8"}
    assert all(ms > 0 for ms in p["code2wav_ms_per_frame_by_chunk"].values())
    table = subprocess.run([sys.executable, str(SCRIPT), "--table", str(out.parent)], capture_output=True, text=True)
    assert table.returncode == 0 and "| tiny | 1 |" in table.stdout
