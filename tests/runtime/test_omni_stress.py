"""~500 requests mixing completion, abort, request errors and a worker crash."""
import asyncio
import os
import signal

import pytest

from edge_infer.runtime.omni import AsyncOmni
from edge_infer.runtime.transport import list_segments
from omni_helpers import write_config
from runtime.toys.executors import toy_ar_tokens
from testutil import live_children, wait_until

pytestmark = pytest.mark.slow

PIPELINE = """
base_config: toy_speech.yaml
connectors:
  shared_memory: {inline_threshold_bytes: 0, max_unacked_per_producer: 4}
stages:
  - stage_id: 0
    engine: {max_num_seqs: 16}
    executor_options: {fail_on_token: 250}
  - stage_id: 1
    engine: {max_num_seqs: 16}
    executor_options: {chunk_tokens: 2, samples_per_token: 64}
"""
N, WAVE, CRASH_WAVE = 500, 50, 5


def kind_of(i):
    return "abort" if i % 5 == 0 else "error" if i % 7 == 0 else "ok"


async def one(omni, i):
    prompt = [250, i % 200] if kind_of(i) == "error" else [i % 200, 3]
    events = []
    async for event in omni.generate(prompt, request_id=f"s{i}", sampling_params_list=[{"max_tokens": 6}, None]):
        events.append(event)
        if kind_of(i) == "abort" and event.kind == "output":
            await omni.abort(f"s{i}")
    return events


async def crash_stage(omni, stage_id):
    while omni.health().stages[stage_id].inflight < 5:
        await asyncio.sleep(0.002)
    os.kill(omni.worker_pids()[stage_id], signal.SIGKILL)


def test_mixed_load_with_a_crash_leaves_no_segment_and_no_process(tmp_path):
    before = {p.pid for p in live_children()}
    omni = AsyncOmni(write_config(tmp_path, PIPELINE))

    async def scenario():
        await omni.start()
        prefix = omni._orchestrator.prefix
        results = {}
        for start in range(0, N, WAVE):
            wave = range(start, start + WAVE)
            jobs = [one(omni, i) for i in wave]
            if start // WAVE == CRASH_WAVE:
                jobs.append(crash_stage(omni, 1))
            done = await asyncio.gather(*jobs)
            results.update(zip(wave, done))
            if not omni.health().healthy:
                await omni.retire_worker(1)  # replace the crashed worker
        for _ in range(100):  # releases are processed by the producers asynchronously
            idle_segments = list_segments(prefix)
            if not idle_segments:
                break
            await asyncio.sleep(0.05)
        await omni.shutdown()
        return prefix, results, idle_segments

    prefix, results, idle_segments = asyncio.run(scenario())
    crash = range(CRASH_WAVE * WAVE, (CRASH_WAVE + 1) * WAVE)
    crashed = 0
    for i, events in results.items():
        last = events[-1]
        assert [e.kind for e in events].count(last.kind) == 1 and last.kind != "output", i
        if last.kind == "error" and "SIGKILL" in (last.error or ""):
            assert i in crash
            crashed += 1
        elif kind_of(i) == "ok":
            assert last.kind == "finished", (i, last.error)
            assert [int(e.payload.data[0]) for e in events if e.stage_id == 0 and e.payload is not None] == toy_ar_tokens([i % 200, 3], 6)
        elif kind_of(i) == "error":
            assert last.kind == "error" and "fail_on_token" in last.error
        else:
            assert last.kind in ("aborted", "finished")  # it may finish before the abort lands
    assert crashed > 0
    assert sum(r[-1].kind == "aborted" for r in results.values()) > N // 10
    assert idle_segments == [] and list_segments(prefix) == []
    assert wait_until(lambda: {p.pid for p in live_children()} <= before)
