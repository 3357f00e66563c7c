"""Local text mode: back-pressure, the cancel fence, stale sessions, worker death (reference behaviours)."""
from __future__ import annotations

import asyncio
import copy
import os
import signal
import time

import psutil
import pytest

from edge_infer import LocalTextEngine, plan_text_session
from edge_infer.errors import InvalidRequestError, PlanRefusedError, StaleSessionError
from testutil import live_children

pytestmark = pytest.mark.slow
PROMPT = "Tell me a story about a small robot"


async def collect(stream) -> tuple[list[int], list[str]]:
    tokens, kinds = [], []
    async for event in stream:
        kinds.append(event.kind)
        tokens += event.token_ids
    return tokens, kinds


@pytest.fixture(scope="module")
def plan(tiny_model):
    return plan_text_session(tiny_model, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=128)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_a_stream_its_consumer_drops_cancels_its_request(plan):
    """A consumer task cancelled mid-stream, or a loop broken off and its stream let go: the request is cancelled
    (it held its slot and KV blocks, or generated into the void, until an explicit cancel); a request of n samples
    is refused (one stream is one sample: it silently gave one)."""
    import gc

    async def scenario():
        engine = LocalTextEngine(plan)
        await engine.start()
        try:
            session = engine.open_session()

            async def read_some(rid_box: list) -> None:
                rid, stream = await engine.submit(session, PROMPT, max_tokens=400, ignore_eos=True, max_chunks=4)
                rid_box.append(rid)
                async for _ in stream:
                    await asyncio.sleep(3600)  # a consumer that stops reading, then is cancelled

            boxes = [[], []]
            tasks = [asyncio.ensure_future(read_some(box)) for box in boxes]
            await asyncio.sleep(1.0)
            await asyncio.gather(*[t for t in tasks if t.cancel()], return_exceptions=True)
            del tasks  # their tracebacks hold the frames that held the streams
            rid, stream = await engine.submit(session, PROMPT, max_tokens=400, ignore_eos=True)
            async for _ in stream:
                break  # broken off, and the stream let go
            del stream
            gc.collect()
            deadline = time.monotonic() + 10
            dropped = [box[0] for box in boxes] + [rid]
            while not all(engine.records[r].finished for r in dropped) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert [engine.records[r].finish_reason for r in dropped] == ["abort"] * 3
            _, again = await engine.submit(session, PROMPT, max_tokens=5, ignore_eos=True)
            tokens, kinds = await collect(again)
            assert len(tokens) == 5 and kinds[-1] == "finished"
            with pytest.raises(InvalidRequestError, match="one sample"):
                await engine.submit(session, PROMPT, max_tokens=5, n=2)
        finally:
            await engine.close()

    run(scenario())


def test_an_engine_dropped_without_close_takes_its_worker_along(plan):
    """A LocalTextEngine let go unclosed kept its worker process (and its weights' memory) until the program ended:
    the reader thread and the watchdog held the engine."""
    import gc

    async def scenario() -> int:
        engine = LocalTextEngine(plan)
        await engine.start()
        _, stream = await engine.submit(engine.open_session(), PROMPT, max_tokens=3)
        await collect(stream)
        pid = engine.worker_pid
        del engine, stream
        gc.collect()
        return pid

    pid = run(scenario())
    try:
        psutil.Process(pid).wait(10)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_reliability_behaviours(plan):
    async def scenario():
        engine = LocalTextEngine(plan)
        await engine.start()
        try:
            session = engine.open_session()
            # baseline: exactly max_tokens tokens with ignore_eos, no error
            rid, stream = await engine.submit(session, PROMPT, max_tokens=128, ignore_eos=True)
            baseline, kinds = await collect(stream)
            record = engine.records[rid].to_dict()
            assert len(baseline) == 128 and kinds[-1] == "finished"
            assert record["finished"] and record["error"] is None and record["output_tokens"] == 128
            assert record["output_token_ids"] == baseline

            # saturation: an unread stream fills to max_chunks and stops there; draining gives the same tokens
            rid, stream = await engine.submit(session, PROMPT, max_tokens=128, ignore_eos=True, max_chunks=4)
            deadline = time.monotonic() + 30
            while stream.stats()["high_water_chunks"] < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the core must not run ahead of the consumer
            assert stream.stats()["high_water_chunks"] == 4
            assert engine.records[rid].output_tokens == 4
            drained, _ = await collect(stream)
            assert drained == baseline and stream.stats()["high_water_chunks"] == 4

            # cancel mid-stream is a fence: nothing but the cancelled event follows
            rid, stream = await engine.submit(session, PROMPT, max_tokens=400, ignore_eos=True, max_chunks=8)
            first = await stream.get()
            assert first.kind == "token"
            result = await engine.cancel(rid)
            assert result["cancelled"] and result["acknowledged"]
            _, after = await collect(stream)
            assert after == ["cancelled"]
            assert engine.records[rid].cancelled

            # a request after the cancel works normally
            rid, stream = await engine.submit(session, PROMPT, max_tokens=128, ignore_eos=True)
            again, _ = await collect(stream)
            assert again == baseline

            # a closed session's handle, or a copy of it, is rejected
            stale = copy.deepcopy(session)
            engine.close_session(session.session_id)
            for handle in (session, stale):
                with pytest.raises(StaleSessionError, match="closed"):
                    await engine.submit(handle, PROMPT, max_tokens=4)
            assert isinstance(StaleSessionError("x"), RuntimeError)

            # bad input: a clear error, and the engine keeps serving
            session = engine.open_session()
            with pytest.raises(InvalidRequestError, match="max_model_len is 512"):
                await engine.submit(session, [7] * 600, max_tokens=4)
            with pytest.raises(InvalidRequestError, match="max_tokens must be at least 0"):
                await engine.submit(session, PROMPT, max_tokens=-1)
            rid, stream = await engine.submit(session, PROMPT, max_tokens=5, ignore_eos=True)
            assert len((await collect(stream))[0]) == 5
        finally:
            await engine.close()

    run(scenario())


def test_worker_death_ends_streams_with_an_error_and_restart_works(plan):
    async def scenario():
        engine = LocalTextEngine(plan)
        await engine.start()
        try:
            worker = engine.worker_pid
            assert worker != os.getpid() and worker in [c.pid for c in psutil.Process().children(recursive=True)]
            session = engine.open_session()
            streams = [(await engine.submit(session, PROMPT, max_tokens=400, ignore_eos=True))[1] for _ in range(2)]
            assert (await streams[0].get()).kind == "token"
            killed_at = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            for stream in streams:
                _, kinds = await asyncio.wait_for(collect(stream), 5)
                assert kinds[-1] == "error"
            assert time.monotonic() - killed_at < 5
            assert not engine.healthy
            assert "SIGKILL" in engine.records[streams[0].request_id].error
            with pytest.raises(RuntimeError, match="restart"):
                await engine.submit(session, PROMPT, max_tokens=4)
            await engine.restart()
            assert engine.healthy and engine.worker_pid != worker
            _, stream = await engine.submit(session, PROMPT, max_tokens=5, ignore_eos=True)
            assert len((await collect(stream))[0]) == 5
        finally:
            new_worker = engine.worker_pid
            await engine.close()
        assert not psutil.pid_exists(worker)
        assert not psutil.pid_exists(new_worker) or psutil.Process(new_worker).status() == psutil.STATUS_ZOMBIE
        assert live_children() == []

    run(scenario())


def test_unadmitted_plan_is_refused(tiny_model):
    plan = plan_text_session(tiny_model, max_num_seqs=100000)
    assert not plan.admitted
    with pytest.raises(PlanRefusedError, match="max_num_seqs"):
        LocalTextEngine(plan)
