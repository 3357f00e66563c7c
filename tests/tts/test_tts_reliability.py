"""Reliability of the speech pipeline (SPEC D/E): slow consumers, abort fences, a dead Code2Wav worker."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import psutil
import pytest

from edge_infer.runtime.omni import AsyncOmni
from edge_infer.runtime.orchestrator import HEARTBEAT_TIMEOUT_S
from edge_infer.runtime.transport import list_segments
from edge_infer.tts.deploy import SpeechPipeline
from testutil import wait_until
from tts_helpers import SAMPLES_PER_FRAME, STAGE_OVERRIDES, TINY

pytestmark = pytest.mark.slow

# Long enough to be in flight across several chunks whatever the random weights say.
LONG = {"voice": "ryan", "max_tokens": 120, "ignore_eos": True, "seed": 11}


@pytest.fixture(scope="module")
def pipeline() -> SpeechPipeline:
    # PCM chunks (7680 B a frame) are over the bundled inline threshold: they travel through shared memory.
    return SpeechPipeline.for_checkpoint(TINY, STAGE_OVERRIDES)


@pytest.fixture(scope="module")
def omni(loop_thread, pipeline):
    omni = AsyncOmni(pipeline.config)
    loop_thread.run(omni.start())
    prefix = omni._orchestrator.prefix
    yield omni
    loop_thread.run(omni.shutdown())
    assert list_segments(prefix) == []


def audio_of(events) -> np.ndarray:
    return np.concatenate([e.payload.data for e in events if e.payload is not None])


def test_a_slow_consumer_still_gets_complete_finite_audio(loop_thread, omni, pipeline) -> None:
    async def consume(pause_s: float):
        events = []
        async for event in omni.generate("Slow reader.", sampling_params_list=pipeline.params_list(LONG)):
            events.append(event)
            await asyncio.sleep(pause_s)
        return events

    fast = loop_thread.run(consume(0))
    slow = loop_thread.run(consume(0.1))
    assert fast[-1].kind == slow[-1].kind == "finished"
    audio = audio_of(slow)
    assert audio.shape == (LONG["max_tokens"] * SAMPLES_PER_FRAME,) and np.isfinite(audio).all()
    # Same seed, same codes; Code2Wav may cut the two streams into different chunks, and carried-state
    # joins equal a whole decode within 1e-5 (fp32), not bit for bit.
    np.testing.assert_allclose(audio, audio_of(fast), rtol=0, atol=1e-5)


def test_abort_after_the_first_chunk_is_a_fence_and_the_next_request_works(loop_thread, omni, pipeline) -> None:
    async def scenario():
        stream = omni.generate("Abort me.", request_id="abort-me", sampling_params_list=pipeline.params_list(LONG))
        first = await stream.__anext__()
        report = await omni.abort("abort-me")
        rest = [e async for e in stream]
        return first, report, rest

    first, report, rest = loop_thread.run(scenario())
    assert first.kind == "output" and first.payload is not None
    assert report.found and not report.unconfirmed_stages
    assert [e.kind for e in rest] == ["aborted"]  # nothing produced after the abort reaches the caller
    assert wait_until(lambda: all(s.inflight == 0 for s in omni.health().stages))
    after = loop_thread.run(_collect(omni, pipeline, {**LONG, "max_tokens": 10}))
    assert after[-1].kind == "finished" and audio_of(after).shape == (10 * SAMPLES_PER_FRAME,)


async def _collect(omni, pipeline, params):
    return [e async for e in omni.generate("Next one.", sampling_params_list=pipeline.params_list(params))]


def test_killing_code2wav_gives_an_explicit_error_within_5_s_and_no_leaked_segment(loop_thread, omni, pipeline) -> None:
    audio_stage = pipeline.audio_stage

    async def scenario():
        stream = omni.generate("Kill the vocoder.", sampling_params_list=pipeline.params_list(LONG))
        await stream.__anext__()  # audio is flowing
        os.kill(omni.worker_pids()[audio_stage], signal.SIGKILL)
        killed = time.monotonic()
        rest = await asyncio.wait_for(_drain(stream), timeout=5)
        return rest, time.monotonic() - killed

    rest, waited = loop_thread.run(scenario())
    assert rest[-1].kind == "error" and waited < 5
    assert f"stage {audio_stage}" in rest[-1].error and "SIGKILL" in rest[-1].error
    assert omni.health().dead_stages == [audio_stage]
    assert wait_until(lambda: not list_segments(omni._orchestrator.prefix)), list_segments(omni._orchestrator.prefix)
    loop_thread.run(omni.retire_worker(audio_stage))  # restart the stage: the pipeline serves again
    again = loop_thread.run(_collect(omni, pipeline, {**LONG, "max_tokens": 6}))
    assert again[-1].kind == "finished" and audio_of(again).shape == (6 * SAMPLES_PER_FRAME,)


async def _drain(stream):
    return [e async for e in stream]


def test_the_speech_server_kills_a_stage_silent_past_its_policy_and_replaces_it(pipeline) -> None:
    """A stopped stage worker is unresponsive within seconds; past RestartPolicy.kill_unresponsive_s the server kills
    it, and the dead worker is replaced like any other."""
    from edge_infer.server.service import RestartPolicy, ServeSettings
    from edge_infer.server.speech_service import SpeechService

    # The stage is unresponsive after HEARTBEAT_TIMEOUT_S of silence and killed past kill_unresponsive_s: the gap
    # between them must be wider than this loop's poll for the state to be seen (a 1 s policy left one supervisor tick).
    kill_after_s = HEARTBEAT_TIMEOUT_S + 1.5
    service = SpeechService(pipeline, ServeSettings(served_model_name="tiny"),
                            restart=RestartPolicy(kill_unresponsive_s=kill_after_s))

    async def scenario() -> tuple[str, int, int | None]:
        await service.load()
        try:
            stopped = service.omni.worker_pids()[1]
            os.kill(stopped, signal.SIGSTOP)
            seen = set()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                seen.add(service.health_status)
                pid = service.omni.worker_pids()[1]
                if pid not in (None, stopped) and service.omni.health().healthy:
                    return ",".join(sorted(seen)), stopped, pid
            raise AssertionError(f"the stopped stage was not replaced within 60 s: {service.omni.health()}")
        finally:
            await service.close()

    seen, stopped, replacement = asyncio.run(scenario())
    assert "engine_unresponsive" in seen and replacement != stopped
    assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == psutil.STATUS_ZOMBIE
