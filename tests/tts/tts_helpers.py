"""Helpers shared by the speech tests (a unique module name: tests/ has no packages)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
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


class LoopThread:
    """An event loop on its own thread, so a pipeline can outlive one test."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=180):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def wait_until(predicate, timeout=30.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
