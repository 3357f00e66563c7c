"""Helpers shared by the speech tests (a unique module name: tests/ has no packages)."""
from __future__ import annotations

import json
from pathlib import Path

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts" / "tiny"
REFERENCE = json.loads((TINY.parent / "reference.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["talker_cases"]}
SAMPLES_PER_FRAME = 1920
# Exact fp32 weights; one compute thread per stage (the tiny model's ops are microseconds: threads only contend).
STAGE_OVERRIDES = {
    "0": {"engine": {"dtype": "float32", "max_model_len": 512}, "executor_options": {"num_threads": 1}},
    "1": {"engine": {"dtype": "float32"}, "executor_options": {"num_threads": 1}},
}


def greedy(case: dict, **extra) -> dict:
    """Talker parameters reproducing a reference case's greedy codes."""
    return {"voice": case["speaker"], "language": case["language"], "temperature": 0, "subtalker_temperature": 0,
            "max_tokens": case["max_new_tokens"] - 1, **extra}
