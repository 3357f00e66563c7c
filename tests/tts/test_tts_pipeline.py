"""The two-stage Qwen3-TTS pipeline (Talker -> Code2Wav) in real stage processes, through Omni/AsyncOmni.

The audio of a greedy request must equal the reference's PCM for the
reference's codes (atol 1e-5, see test_tts_stage_executors.py), streamed in
chunks of the configured sizes.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edge_infer.runtime.omni import AsyncOmni, Omni
from edge_infer.runtime.transport import list_segments
from edge_infer.quant.native import missing_requirement
from edge_infer.tts.deploy import SpeechPipeline
from tts_helpers import CASES, REFERENCE, SAMPLES_PER_FRAME, STAGE_OVERRIDES, TINY, greedy

pytestmark = pytest.mark.slow
PCM_ATOL = 1e-5


@pytest.fixture(scope="module")
def pipeline() -> SpeechPipeline:
    return SpeechPipeline.for_checkpoint(TINY, STAGE_OVERRIDES)


@pytest.fixture(scope="module")
def omni(loop_thread, pipeline):
    omni = AsyncOmni(pipeline.config)
    loop_thread.run(omni.start())
    prefix = omni._orchestrator.prefix
    yield omni
    loop_thread.run(omni.shutdown())
    assert list_segments(prefix) == []


@pytest.fixture(scope="module")
def reference_pcm() -> np.ndarray:
    with np.load(TINY.parent / "reference_pcm.npz") as data:
        return data["talker_case"]


async def collect(omni, pipeline, text, params, **kwargs):
    return [e async for e in omni.generate(text, sampling_params_list=pipeline.params_list(params), **kwargs)]


def test_async_omni_streams_the_reference_audio_in_chunks(loop_thread, omni, pipeline, reference_pcm) -> None:
    case = CASES[REFERENCE["code2wav"]["talker_case"]]
    events = loop_thread.run(collect(omni, pipeline, case["text"], greedy(case)))
    assert events[-1].kind == "finished", events[-1].error
    chunks = [e.payload for e in events if e.kind == "output" and e.payload is not None]
    assert all(e.stage_id == pipeline.audio_stage and e.contract == "pcm_audio/1" for e in events if e.payload is not None)
    # The Talker sends 1 frame, then 4 at a time; Code2Wav decodes each chunk as it arrives (at most 8 frames).
    sizes = [len(c.data) // SAMPLES_PER_FRAME for c in chunks]
    assert sizes[0] == 1 and sum(sizes) == len(case["codes"]) and max(sizes) <= 8
    assert all(c.metadata == {"sample_rate": 24000, "channels": 1} for c in chunks)
    np.testing.assert_allclose(np.concatenate([c.data for c in chunks]), reference_pcm, atol=PCM_ATOL, rtol=0)
    metrics = events[-1].metrics
    assert metrics[pipeline.talker_stage].tokens_out == len(case["codes"])  # frames
    assert metrics[pipeline.audio_stage].tokens_in == len(case["codes"])
    assert all(m.time_in_stage_s > 0 for m in metrics.values())


def test_concurrent_requests_are_batched_and_each_gets_its_own_audio(loop_thread, omni, pipeline) -> None:
    names = [n for n, c in CASES.items() if not c["sampled"]][:4]

    async def all_at_once():
        return await asyncio.gather(*(collect(omni, pipeline, CASES[n]["text"], greedy(CASES[n])) for n in names))

    results = loop_thread.run(all_at_once())
    for name, events in zip(names, results):
        assert events[-1].kind == "finished", events[-1].error
        samples = sum(len(e.payload.data) for e in events if e.payload is not None)
        assert samples == len(CASES[name]["codes"]) * SAMPLES_PER_FRAME, name


def test_ignore_eos_speaks_exactly_max_tokens_frames(loop_thread, omni, pipeline) -> None:
    events = loop_thread.run(collect(omni, pipeline, "Benchmark text.", {"voice": "vivian", "max_tokens": 30, "ignore_eos": True}))
    audio = np.concatenate([e.payload.data for e in events if e.payload is not None])
    assert audio.shape == (30 * SAMPLES_PER_FRAME,) and np.isfinite(audio).all()


def assert_stages_within_reservations(omni) -> None:
    # RssAnon of each stage process after serving, against its planned reservation (shared-memory
    # payload buffers are RssShmem, not RssAnon: the transport item is left out).
    for sid, pid in omni.worker_pids().items():
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
        measured = int(status["RssAnon"].split()[0]) * 1024
        reservation = omni.plan.stage(sid).reservation
        assert measured <= reservation.total_bytes - reservation.transport_bytes, (sid, measured, reservation)


def test_stage_processes_stay_within_their_reservations(loop_thread, omni, pipeline) -> None:
    loop_thread.run(collect(omni, pipeline, "Fill the buffers.", {"voice": "ryan", "max_tokens": 40, "ignore_eos": True}))
    assert_stages_within_reservations(omni)


@pytest.mark.parametrize("quantization", [None, "cpu_w4a8"])
def test_the_default_layout_in_bf16_stays_within_its_reservations(loop_thread, quantization) -> None:
    # What a user runs on a CPU with bf16: prompts on every core, frame steps and Code2Wav on half each
    # (bf16 set explicitly, so that a CPU without it checks the same thing); bf16 or W4A8 Talker weights.
    if quantization == "cpu_w4a8" and missing_requirement() is not None:
        pytest.skip(missing_requirement())
    both = {"engine": {"dtype": "bfloat16"}}
    talker = {"engine": {"dtype": "bfloat16", "quantization": quantization}}
    default = SpeechPipeline.for_checkpoint(TINY, {"0": talker, "1": both})
    omni = AsyncOmni(default.config)
    loop_thread.run(omni.start())
    try:
        loop_thread.run(collect(omni, default, "Fill the buffers.", {"voice": "ryan", "max_tokens": 40, "ignore_eos": True}))
        assert_stages_within_reservations(omni)
    finally:
        loop_thread.run(omni.shutdown())


def test_a_code2wav_decoding_every_length_stays_within_its_reservation(loop_thread) -> None:
    # 15-frame chunks arrive, each decoded as 8, 4, 2 and 1 frames: every shape whose oneDNN primitives the
    # plan books, in bf16 (on AMX tiles where the CPU has them: the costliest per shape).
    layout = SpeechPipeline.for_checkpoint(TINY, {"0": {"executor_options": {"chunk_frames": 15}},
                                                  "1": {"engine": {"dtype": "bfloat16"}}})
    omni = AsyncOmni(layout.config)
    loop_thread.run(omni.start())
    try:
        events = loop_thread.run(collect(omni, layout, "Every length.", {"voice": "ryan", "max_tokens": 31, "ignore_eos": True}))
        chunks = [len(e.payload.data) // SAMPLES_PER_FRAME for e in events if e.payload is not None]
        assert set(chunks) <= {1, 2, 4, 8} and 8 in chunks and sum(chunks) == 31
        assert_stages_within_reservations(omni)
    finally:
        loop_thread.run(omni.shutdown())


def test_sync_omni_generates_a_batch(pipeline) -> None:
    case = CASES["english_ryan"]
    with Omni(pipeline.config) as omni:
        results = omni.generate([case["text"], case["text"]], sampling_params_list=pipeline.params_list(greedy(case)))
    assert [r.status for r in results] == ["finished", "finished"]
    first, second = (r.joined(pipeline.audio_stage) for r in results)
    assert first.shape == (len(case["codes"]) * SAMPLES_PER_FRAME,)
    # Code2Wav decodes whatever frames have arrived, so the two streams may be cut into different
    # chunks; carried-state joins equal a whole decode within PCM_ATOL, not bit for bit.
    np.testing.assert_allclose(first, second, rtol=0, atol=PCM_ATOL)
