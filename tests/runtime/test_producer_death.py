"""A producer's death spares requests it already finished, and their shared buffers."""
import asyncio
import os
import signal

import pytest

from edge_infer.runtime.omni import AsyncOmni
from edge_infer.runtime.transport import list_segments
from omni_helpers import write_config
from runtime.toys.executors import toy_ar_tokens

pytestmark = pytest.mark.slow

# Two torch-free stages; stage 1 steps slowly, so stage 0's tokens wait in shared memory for it.
PIPELINE = """
base_config: toy_text.yaml
connectors: {shared_memory: {inline_threshold_bytes: 0, max_unacked_per_producer: 16}}
stages:
  - {stage_id: 0}
  - stage_id: 1
    kind: ar
    executor: toy_ar
    engine: {max_num_seqs: 4, max_model_len: 512}
    executor_options: {step_delay_s: 0.2}
routes: [{from: 0, to: 1, contract: token_ids/1}]
final_outputs: [0, 1]
"""


def stage_tokens(events, stage):
    return [int(t) for e in events if e.stage_id == stage and e.payload is not None for t in e.payload.data]


def test_killing_a_producer_after_it_finished_a_request_does_not_fail_that_request(tmp_path):
    omni = AsyncOmni(write_config(tmp_path, PIPELINE))

    async def scenario():
        await omni.start()
        prefix = omni._orchestrator.prefix
        first = omni.generate([1], request_id="A", sampling_params_list=[{"max_tokens": 2}, {"max_tokens": 10}])
        a_events = []
        while not a_events or a_events[-1].stage_id != 1:
            a_events.append(await first.__anext__())  # stage 1 is now busy stepping A
        b_events = []
        async for event in omni.generate([2], request_id="B", sampling_params_list=[{"max_tokens": 5}, {"max_tokens": 3}]):
            b_events.append(event)
            if event.stage_id == 0 and event.finished:
                os.kill(omni.worker_pids()[0], signal.SIGKILL)  # B's tokens may still sit unread
        a_events += [e async for e in first]
        health = omni.health()
        for _ in range(100):
            if not list_segments(prefix):
                break
            await asyncio.sleep(0.05)
        leftover = list_segments(prefix)
        await omni.shutdown()
        return a_events, b_events, health, leftover

    a_events, b_events, health, leftover = asyncio.run(scenario())
    for events, prompt, n0, n1 in ((a_events, [1], 2, 10), (b_events, [2], 5, 3)):
        assert events[-1].kind == "finished", events[-1].error
        assert stage_tokens(events, 0) == toy_ar_tokens(prompt, n0)
        assert stage_tokens(events, 1) == toy_ar_tokens(toy_ar_tokens(prompt, n0), n1)
    assert health.dead_stages == [0] and "SIGKILL" in health.stages[0].detail
    assert leftover == []
