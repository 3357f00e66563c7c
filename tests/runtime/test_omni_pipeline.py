"""End-to-end behaviour of a two-stage toy pipeline (toy AR -> toy vocoder) in real processes."""
import asyncio
import os
import signal
import threading

import numpy as np
import psutil
import pytest

from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.omni import AsyncOmni
from edge_infer.runtime.transport import list_segments
from omni_helpers import collect, segments_of, write_config
from runtime.toys.executors import toy_ar_tokens
from testutil import live_children, wait_until

pytestmark = pytest.mark.slow

# Every payload (even one token) travels through shared memory; at most 4 unacknowledged.
PIPELINE = """
base_config: toy_speech.yaml
connectors:
  shared_memory: {inline_threshold_bytes: 0, max_unacked_per_producer: 4}
stages:
  - stage_id: 0
    engine: {max_num_seqs: 8}
    executor_options: {step_delay_s: 0.01, fail_on_token: 250}
  - stage_id: 1
    nice: 4
    engine: {max_num_seqs: 8}
"""


@pytest.fixture(scope="module")
def omni(loop_thread, tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("pipeline"), PIPELINE)
    before = {p.pid for p in live_children()}
    omni = AsyncOmni(path)
    loop_thread.run(omni.start())
    prefix = omni._orchestrator.prefix
    yield omni
    loop_thread.run(omni.shutdown())
    assert list_segments(prefix) == []
    assert wait_until(lambda: {p.pid for p in live_children()} <= before)


def params(max_tokens):
    return [{"max_tokens": max_tokens}, None]


def tokens_of(events, stage=0):
    return [int(t) for e in events if e.stage_id == stage and e.payload is not None for t in e.payload.data]


def expected_pcm(tokens, chunk=4):
    import torch

    from runtime.toys.vocoder_model import build_toy_vocoder

    model = build_toy_vocoder(256, 8, 240, 0)
    with torch.inference_mode():
        parts = [model(torch.tensor(tokens[i:i + chunk]).reshape(-1, 1)).numpy() for i in range(0, len(tokens), chunk)]
    return np.concatenate(parts)


def test_outputs_stream_in_production_order_and_interleave(loop_thread, omni):
    events = loop_thread.run(collect(omni, [5, 6, 7], request_id="order", sampling_params_list=params(24)))
    assert events[-1].kind == "finished" and all(e.kind == "output" for e in events[:-1])
    assert tokens_of(events) == toy_ar_tokens([5, 6, 7], 24)
    pcm = np.concatenate([e.payload.data for e in events if e.stage_id == 1 and e.payload is not None])
    np.testing.assert_allclose(pcm, expected_pcm(toy_ar_tokens([5, 6, 7], 24)), atol=1e-6)
    first_audio = min(i for i, e in enumerate(events) if e.stage_id == 1)
    last_token = max(i for i, e in enumerate(events) if e.stage_id == 0)
    assert first_audio < last_token  # audio of early tokens arrives while later tokens are produced
    metrics = events[-1].metrics
    assert (metrics[0].tokens_out, metrics[1].tokens_in, metrics[1].chunks_out) == (24, 24, 6)
    assert all(e.stage_id in e.metrics for e in events[:-1])


def test_producer_never_holds_more_than_max_unacked_buffers(loop_thread, omni):
    prefix = omni._orchestrator.prefix
    seen = {0: 0, 1: 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            names = list_segments(prefix)
            for sid in seen:
                seen[sid] = max(seen[sid], sum(f"_s{sid}g" in n for n in names))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        async def many():
            return await asyncio.gather(*(collect(omni, [i, 1], sampling_params_list=params(16)) for i in range(8)))

        results = loop_thread.run(many())
    finally:
        done.set()
        sampler.join()
    assert all(r[-1].kind == "finished" and tokens_of(r) == toy_ar_tokens([i, 1], 16) for i, r in enumerate(results))
    assert 0 < seen[0] <= 4 and seen[1] <= 4


def test_abort_is_a_fence_across_stages(loop_thread, omni):
    async def scenario():
        stream = omni.generate([1, 2, 3], request_id="abort-me", sampling_params_list=params(300))
        while True:
            event = await stream.__anext__()
            if event.stage_id == 1:  # audio is flowing: both stages hold the request
                break
        report = await omni.abort("abort-me")
        rest = [e async for e in stream]
        await asyncio.sleep(0.3)
        return report, rest

    report, rest = loop_thread.run(scenario())
    assert report.found and report.confirmed_stages == (0, 1)
    assert [e.kind for e in rest] == ["aborted"]
    assert all(s.inflight == 0 for s in omni.health().stages)
    assert wait_until(lambda: not segments_of(omni))
    after = loop_thread.run(collect(omni, [1, 2, 3], sampling_params_list=params(5)))
    assert after[-1].kind == "finished" and tokens_of(after) == toy_ar_tokens([1, 2, 3], 5)


def test_request_error_names_the_stage_and_spares_other_requests(loop_thread, omni):
    async def both():
        return await asyncio.gather(
            collect(omni, [7, 250], request_id="bad", sampling_params_list=params(8)),
            collect(omni, [7, 8], request_id="good", sampling_params_list=params(8)),
        )

    bad, good = loop_thread.run(both())
    assert bad[-1].kind == "error" and "stage 0" in bad[-1].error and "fail_on_token" in bad[-1].error
    assert good[-1].kind == "finished" and tokens_of(good) == toy_ar_tokens([7, 8], 8)


def test_prompt_of_a_contract_the_source_does_not_accept_is_refused(loop_thread, omni):
    image = Payload("image/1", np.zeros((1, 1, 3), np.uint8), {"mode": "RGB"})
    with pytest.raises(ValueError, match="accepts text/1, token_ids/1; the prompt is image/1"):
        loop_thread.run(collect(omni, image))


def test_a_stage_runs_at_its_configured_lower_priority(omni):
    ours = os.nice(0)
    if ours > 15:
        pytest.skip(f"this test process already runs at nice {ours}: a further 4 cannot be told apart")
    pids = omni.worker_pids()
    assert psutil.Process(pids[0]).nice() == ours
    assert psutil.Process(pids[1]).nice() == min(19, ours + 4)


def test_sigkill_of_each_stage_errors_its_requests_and_leaves_no_segment(loop_thread, omni):
    for sid in (0, 1):
        async def scenario():
            stream = omni.generate([9, 9], request_id=f"kill-{sid}", sampling_params_list=params(400))
            while (await stream.__anext__()).stage_id != 1:
                pass  # both stages are working on it
            os.kill(omni.worker_pids()[sid], signal.SIGKILL)

            async def rest():
                return [e async for e in stream]

            return await asyncio.wait_for(rest(), timeout=5)  # an explicit error within 5 s

        rest = loop_thread.run(scenario())
        assert rest[-1].kind == "error"
        assert f"stage {sid}" in rest[-1].error and "SIGKILL" in rest[-1].error
        health = omni.health()
        assert not health.healthy and health.dead_stages == [sid]
        refused = loop_thread.run(collect(omni, [1]))
        assert refused[-1].kind == "error" and f"stage {sid}" in refused[-1].error and "retire_worker" in refused[-1].error
        assert wait_until(lambda: not segments_of(omni)), segments_of(omni)
        report = loop_thread.run(omni.retire_worker(sid))  # replacing a dead worker restarts the stage
        assert report.old_pid is None and report.new_pid is not None
        assert omni.health().healthy
        again = loop_thread.run(collect(omni, [4], sampling_params_list=params(6)))
        assert again[-1].kind == "finished" and tokens_of(again) == toy_ar_tokens([4], 6)


def test_a_stopped_stage_is_unresponsive_within_seconds_and_running_again_when_continued(loop_thread, omni):
    """SIGSTOP: no exit to see. The worker's heartbeat goes silent; its requests end with an error naming the
    silence, new ones are refused, and the stage runs again once the process continues."""
    from edge_infer.runtime.orchestrator import HEARTBEAT_TIMEOUT_S

    pid = omni.worker_pids()[1]

    async def scenario():
        stream = omni.generate([9, 9], request_id="stopped", sampling_params_list=params(400))
        while (await stream.__anext__()).stage_id != 1:
            pass  # both stages are working on it
        os.kill(pid, signal.SIGSTOP)

        async def rest():
            return [e async for e in stream]

        return await asyncio.wait_for(rest(), timeout=HEARTBEAT_TIMEOUT_S + 5)

    try:
        rest = loop_thread.run(scenario())
        assert rest[-1].kind == "error" and "stage 1" in rest[-1].error and "no heartbeat" in rest[-1].error
        (stage,) = [s for s in omni.health().stages if s.stage_id == 1]
        assert stage.state == "unresponsive" and stage.pid == pid and stage.silent_s > HEARTBEAT_TIMEOUT_S
        refused = loop_thread.run(collect(omni, [1]))
        assert refused[-1].kind == "error" and "stopped responding" in refused[-1].error
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_until(lambda: omni.health().healthy)
    again = loop_thread.run(collect(omni, [4], sampling_params_list=params(6)))
    assert again[-1].kind == "finished" and tokens_of(again) == toy_ar_tokens([4], 6)


def test_retirement_drains_without_losing_requests(loop_thread, omni):
    import psutil

    async def scenario():
        # 3 s of 10 ms steps: all six still run when the replacement is ready (its start took 0.6 s here)
        tasks = [asyncio.ensure_future(collect(omni, [i, 2], request_id=f"ret-{i}", sampling_params_list=params(300)))
                 for i in range(6)]
        while omni.health().stages[0].inflight < 6:
            await asyncio.sleep(0.01)
        old = omni.worker_pids()[0]
        report = await omni.retire_worker(0, replace=True)
        return old, report, await asyncio.gather(*tasks)

    old, report, results = loop_thread.run(scenario())
    assert report.old_pid == old and report.new_pid not in (None, old) and report.drained_requests == 6
    for i, events in enumerate(results):
        assert events[-1].kind == "finished" and tokens_of(events) == toy_ar_tokens([i, 2], 300)
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE
    assert omni.worker_pids()[0] == report.new_pid

    # Stopping a stage: its in-flight requests finish, new ones are refused until it is replaced.
    async def stop_stage():
        task = asyncio.ensure_future(collect(omni, [3], request_id="last", sampling_params_list=params(40)))
        while omni.health().stages[0].inflight < 1:
            await asyncio.sleep(0.01)
        report = await omni.retire_worker(0, replace=False)
        return report, await task, await collect(omni, [3])

    report, finished, refused = loop_thread.run(stop_stage())
    assert report.new_pid is None and report.drained_requests == 1
    assert finished[-1].kind == "finished" and tokens_of(finished) == toy_ar_tokens([3], 40)
    assert refused[-1].kind == "error" and "stopped" in refused[-1].error
    loop_thread.run(omni.retire_worker(0))
    assert omni.health().healthy


def test_retirement_that_times_out_keeps_draining_then_stops_the_old_worker(loop_thread, omni):
    import psutil

    async def scenario():
        task = asyncio.ensure_future(collect(omni, [8], request_id="slow", sampling_params_list=params(250)))
        while omni.health().stages[0].inflight < 1:
            await asyncio.sleep(0.01)
        old = omni.worker_pids()[0]
        with pytest.raises(TimeoutError, match="keeps draining"):
            await omni.retire_worker(0, drain_timeout_s=0.1)
        return old, await task

    old, events = loop_thread.run(scenario())
    assert events[-1].kind == "finished" and tokens_of(events) == toy_ar_tokens([8], 250)
    assert omni.worker_pids()[0] != old
    assert wait_until(lambda: not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE)
    assert omni.health().healthy


def test_a_worker_replaced_while_draining_must_fit_beside_what_else_the_process_holds(loop_thread, tmp_path):
    """The deploy plan books what it is told the process holds besides the stages (serve's text model beside a speech
    pipeline), and so does the ledger a replacement is checked against: the old and the new worker must fit beside
    it too, not only beside each other. Room for the stages, the text model and no replacement: refused, clearly."""
    from edge_infer.memory.device import DeviceProfile, MachineProfile, MemoryPool
    from edge_infer.memory.ledger import Reservation
    from edge_infer.runtime.deploy_plan import plan_deploy
    from edge_infer.runtime.config import load_deploy_config

    path = write_config(tmp_path, PIPELINE)
    stages = plan_deploy(load_deploy_config(path)).stages
    capacity = sum(s.reservation.total_bytes for s in stages) + stages[0].reservation.total_bytes + (1 << 20)
    profile = MachineProfile("tight", (MemoryPool("ram", capacity, capacity),), (DeviceProfile("cpu", True, "ram"),),
                             source="test")
    text = Reservation(owner="text model t", pool="ram", device="cpu", weights_bytes=2 << 20)

    async def replace(omni):
        await omni.start()
        try:
            return await omni.retire_worker(0, replace=True)
        finally:
            await omni.shutdown()

    beside = AsyncOmni(path, profile=profile, beside=[text])  # alone, the same replacement fits (by the arithmetic)
    assert beside.plan.admitted and beside.plan.beside == [text]
    with pytest.raises(RuntimeError, match=r"cannot replace .* while its worker drains: .*text model t"):
        loop_thread.run(replace(beside))
