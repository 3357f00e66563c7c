"""A thinker's media towers as their own stage (media_encoder -> text): the tokens of the thinker in one process,
embeddings through shared memory, per-request errors, a dead encoder's requests ended, towers planned on one side.

The pipeline runs the bundled `thinker_encoder` config on a tiny synth Qwen2.5-Omni thinker (fp32), with a low
inline threshold so that every item's embeddings travel through shared memory.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time

import numpy as np
import pytest

from media_files import audio_file, data_url, frames_of, png, sine, video_file
from omni_helpers import collect, segments_of, write_config
from testutil import LoopThread, wait_until
from edge_infer import LLM, SamplingParams
from edge_infer.engine.protocol import MediaEmbeddings, MediaInput
from edge_infer.errors import InvalidRequestError
from edge_infer.memory.measure import rss_anon_bytes
from edge_infer.runtime.config import load_deploy_config
from edge_infer.runtime.contracts import Payload, validate
from edge_infer.runtime.deploy_plan import plan_deploy
from edge_infer.runtime.executors import StageRequestError
from edge_infer.runtime.media_io import media_from_payload, media_payload
from edge_infer.runtime.omni import AsyncOmni
from edge_infer.runtime.transport import list_segments

INLINE_THRESHOLD = 1024
# What the cases carry, within what a 2048-token context holds
LIMITS = {"max_images": 1, "max_image_pixels": 160 * 120, "max_audio_seconds": 3, "max_video_frames": 8,
          "max_video_seconds": 3}
ENGINE = {"dtype": "float32", "max_model_len": 2048, "media_limits": LIMITS}
PIPELINE = """
base_config: thinker_encoder
connectors:
  shared_memory: {{inline_threshold_bytes: {threshold}, max_unacked_per_producer: 4}}
stages:
  - {{stage_id: 0, model: "{model}", engine: {{dtype: float32, max_model_len: 2048, media_limits: {limits}}}}}
  - {{stage_id: 1, model: "{model}", engine: {{dtype: float32, max_model_len: 2048, max_num_seqs: 2, media_limits: {limits}}}}}
"""
GREEDY = dict(max_tokens=8, temperature=0.0, ignore_eos=True)

IMAGE = {"type": "image_url", "image_url": {"url": data_url(png(width=160, height=120), "image/png")}}  # 24 rows
AUDIO = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio_file(sine(0.8, 16000), 16000, "WAV"))
                                                .decode(), "format": "wav"}}
# 2 s of video with its sound: interleaved in two chunks, so the sound's rows are two runs of the prompt
VIDEO = {"type": "video_url", "video_url": {"url": data_url(video_file(frames_of(8), 4, audio=sine(2.0, 48000)[:, 0]),
                                                            "video/mp4")}}
BROKEN = {"type": "image_url", "image_url": {"url": data_url(b"this is not a picture", "image/png")}}


def chat(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


CASES = {"image": chat(IMAGE), "audio": chat(AUDIO), "image+audio": chat(IMAGE, AUDIO), "video+sound": chat(VIDEO)}


@pytest.fixture(scope="module")
def model(synth_thinkers):
    return synth_thinkers["qwen2_5_omni"]


@pytest.fixture(scope="module")
def config_path(model, tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("encoder-stage"),
                        PIPELINE.format(model=model, threshold=INLINE_THRESHOLD, limits=json.dumps(LIMITS)))


@pytest.fixture(scope="module")
def expected(model):
    """Each case's greedy tokens from LLM.chat: the towers in the thinker's own process."""
    with LLM(str(model), worker="thread", **ENGINE) as llm:
        return {name: llm.chat(messages, SamplingParams(**GREEDY))[0].outputs[0].token_ids
                for name, messages in CASES.items()}


@pytest.fixture(scope="module")
def pipeline(config_path):
    loop = LoopThread()
    omni = AsyncOmni(config_path)
    loop.run(omni.start())
    prefix = omni._orchestrator.prefix
    yield loop, omni
    loop.run(omni.shutdown())
    loop.close()
    assert list_segments(prefix) == []  # every shared payload released


def run(pipeline, messages):
    loop, omni = pipeline
    return loop.run(collect(omni, messages, sampling_params_list=[{}, GREEDY]))


def thinker_tokens(events) -> list[int]:
    assert events[-1].kind == "finished", events[-1].error
    return [int(t) for e in events if e.payload is not None and e.contract == "token_ids/1" for t in e.payload.data]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_two_stages_give_the_tokens_of_the_thinker_in_one_process(pipeline, expected, case):
    events = run(pipeline, CASES[case])
    assert thinker_tokens(events) == expected[case]
    assert all(e.stage_id == 1 for e in events if e.kind == "output")  # only the thinker's output reaches the caller
    metrics = events[-1].metrics
    assert metrics[0].chunks_out == metrics[1].chunks_in >= 3  # prompt, positions, one payload per item
    assert wait_until(lambda: segments_of(pipeline[1]) == [])  # released once the thinker copied them out


@pytest.mark.slow
def test_an_undecodable_image_fails_its_request_and_the_next_one_works(pipeline, expected):
    events = run(pipeline, chat(BROKEN))
    assert events[-1].kind == "error"
    assert "stage 0 (encoder" in events[-1].error
    assert "messages[0].content[0] (image_url): is not an image edge-infer decodes" in events[-1].error
    assert thinker_tokens(run(pipeline, CASES["image"])) == expected["image"]


@pytest.mark.slow
def test_requests_with_media_beyond_the_thinkers_sequences_wait_outside_the_pipeline(pipeline, expected):
    """Five image requests at once; the thinker runs two sequences: at most two are in the pipeline at a time (the
    rest wait before their media are decoded, as in every frontend: engine/media_gate.py), each with the tokens it
    gets alone."""
    loop, omni = pipeline

    async def scenario() -> tuple[int, list]:
        runs = [asyncio.ensure_future(collect(omni, CASES["image"], sampling_params_list=[{}, GREEDY]))
                for _ in range(5)]
        most = 0
        while not all(run.done() for run in runs):
            most = max(most, *(stage.inflight for stage in omni.health().stages))
            await asyncio.sleep(0.002)
        return most, [run.result() for run in runs]

    most, results = loop.run(scenario())
    assert 1 <= most <= 2
    assert [thinker_tokens(events) for events in results] == [expected["image"]] * 5
    assert omni._media_gate.in_use == 0


@pytest.mark.slow
def test_the_thinker_stage_stays_within_its_reservation(pipeline):
    """The thinker holds no towers and plans none. (The encoder stage's reservation has no buffers item yet: the
    towers' activations and the media decode are sized by the encoders' memory plan, see its plan().)"""
    loop, omni = pipeline
    run(pipeline, CASES["image+audio"])
    reservation = omni.plan.stage(1).reservation
    # shared payload buffers are RssShmem, not RssAnon: the transport item is left out
    assert rss_anon_bytes(omni.worker_pids()[1]) <= reservation.total_bytes - reservation.transport_bytes, reservation


@pytest.mark.slow
def test_killing_the_encoder_stage_ends_its_requests_with_an_error(config_path):
    loop = LoopThread()
    omni = AsyncOmni(config_path)
    try:
        loop.run(omni.start())
        encoder = omni.worker_pids()[0]
        os.kill(encoder, signal.SIGSTOP)  # the request waits in it
        pending = asyncio.run_coroutine_threadsafe(collect(omni, CASES["image"], sampling_params_list=[{}, GREEDY]),
                                                   loop.loop)
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(encoder, signal.SIGKILL)
        events = pending.result(timeout=5)
        assert time.monotonic() - killed < 5
        assert events[-1].kind == "error" and "stage 0 (encoder" in events[-1].error
        assert omni.health().dead_stages == [0]
    finally:
        loop.run(omni.shutdown())
        loop.close()


# --- the plan ------------------------------------------------------------------


def test_the_bundled_config_runs_the_thinker_without_towers(model):
    config = load_deploy_config("thinker_encoder", {"0": {"model": str(model)}, "1": {"model": str(model)}})
    assert config.stage(1).executor_options["load_encoders"] is False  # implied by the hidden_states/1 route
    kept = load_deploy_config("thinker_encoder", {"0": {"model": str(model)},
                                                  "1": {"model": str(model), "executor_options": {"load_encoders": True}}})
    assert kept.stage(1).executor_options["load_encoders"] is True  # what the config sets wins


def test_the_plan_gives_the_towers_to_the_encoder_stage_and_none_to_the_thinker(config_path, model):
    import torch

    from edge_infer.models.encoders import load_encoders
    from edge_infer.runtime.text_executor import TextEngineExecutor

    plan = plan_deploy(load_deploy_config(config_path))
    assert plan.admitted
    encoder, thinker = plan.stage(0).reservation, plan.stage(1).reservation
    towers = load_encoders(model, torch.float32)
    assert encoder.weights_bytes == sum(t.resident_bytes() for t in towers if t is not None)
    assert encoder.kv_bytes == 0
    stage = load_deploy_config(config_path).stage(1)
    executor = TextEngineExecutor()
    executor.start(stage)  # the thinker stage's engine, in this process
    assert executor.core.model.towers() == {} and executor.core.model.encoders == {}
    assert thinker.weights_bytes == executor.core.ready_info.weight_bytes
    assert plan.stage(0).max_payload_bytes == 2048 * 4 * executor.core.model.cfg.hidden_size
    # one encode's activations and the media decode are booked where the towers run, not on the thinker
    from edge_infer.memory.plan import plan_text_session

    whole = plan_text_session(model, **{**ENGINE, "max_num_seqs": 2})
    encode = sum(whole.item(n) for n in ("encoder activations", "block cache", "media preprocessing"))
    assert encode > 0 and encoder.buffers_bytes >= encode
    assert thinker.buffers_bytes == whole.steady_bytes - whole.weight_bytes - whole.item("kv cache") \
        - whole.item("runtime overhead") - encode


def test_the_thinker_stage_places_embeddings_and_checks_what_came_with_them(config_path, model):
    """In process: a prompt with an item's embeddings runs; positions that disagree with the items, metadata that
    does not place an item, and features for towers it does not have are refused naming the problem."""
    from edge_infer.engine.frontend import Frontend
    from edge_infer.runtime.text_executor import TextEngineExecutor

    frontend = Frontend.create(str(model), dtype="float32", max_model_len=512)
    prepared = frontend.prepare_chat(chat(IMAGE))
    request = frontend.request("r", prepared, frontend.default_params(max_tokens=1))
    (item,) = request.media
    hidden = frontend.plan.model_config.hidden_size
    rows = np.random.default_rng(0).standard_normal((item.features.num_tokens, hidden)).astype(np.float32)
    payload = media_payload(item, rows)
    assert validate(payload).valid and payload.nbytes > INLINE_THRESHOLD
    back = media_from_payload(payload)
    assert back.kind == "image" and back.digest == item.digest and np.array_equal(back.positions, item.positions)
    assert back.features.grid_thw == tuple(item.features.grid_thw) and back.features.rows is payload.data

    executor = TextEngineExecutor()
    executor.start(load_deploy_config(config_path).stage(1))
    ids = Payload("token_ids/1", np.asarray(request.prompt_token_ids, dtype=np.int64))

    def submit(rid, *payloads):
        executor.submit(rid, dict(GREEDY))
        for p in payloads:
            executor.feed(rid, p)
        executor.end_input(rid)

    positions = Payload("mrope_positions/1", request.mrope_positions, {"delta": request.mrope_delta})
    submit("ok", ids, positions, payload)
    tokens = []
    while executor.has_work():
        tokens += [int(t) for o in executor.step() if o.payload is not None and o.payload.contract == "token_ids/1"
                   for t in o.payload.data]
    assert len(tokens) == GREEDY["max_tokens"]
    shifted = Payload("mrope_positions/1", request.mrope_positions + 1, {"delta": request.mrope_delta})
    with pytest.raises(StageRequestError, match="M-RoPE positions sent with the prompt differ"):
        submit("shifted", ids, shifted, payload)
    with pytest.raises(StageRequestError, match="needs metadata digest"):
        submit("no-digest", ids, Payload("hidden_states/1", rows, {**payload.metadata, "digest": ""}))
    # a conversation with an image, prepared here into features: there is no tower to encode them
    with pytest.raises(StageRequestError, match=r"no image encoder .*\(it runs without its towers, load_encoders false"):
        submit("features", Payload("chat/1", json.dumps(chat(IMAGE))))


def test_embeddings_of_the_wrong_width_are_refused(model):
    from edge_infer.engine.frontend import Frontend

    frontend = Frontend.create(str(model), dtype="float32", max_model_len=512)
    prepared = frontend.prepare_chat(chat(IMAGE))
    (item,) = prepared.media
    wrong = MediaInput("image", MediaEmbeddings(np.zeros((item.features.num_tokens, 3), np.float32),
                                                item.features.grid_thw), item.positions, item.digest)
    prepared.media = [wrong]
    with pytest.raises(InvalidRequestError, match=r"embeddings must be \[tokens, \d+\] \(the model's hidden size\)"):
        frontend.request("r", prepared, frontend.default_params(max_tokens=1))


def test_an_encoder_stage_loads_towers_stored_as_codes(model, tmp_path):
    """`edge-infer quantize --towers`: the encoder stage's towers load as the stored codes (auto -> same), and its
    reservation is what they hold."""
    import torch

    from edge_infer.config import QuantConfig
    from edge_infer.engine.core import tower_installer
    from edge_infer.models.encoders import load_encoders
    from edge_infer.quant.export import quantize_checkpoint
    from edge_infer.runtime.encoder_executor import MediaEncoderExecutor

    out = quantize_checkpoint(model, tmp_path / "q", QuantConfig.named("cpu_int4"), towers=True).out_dir
    config = load_deploy_config(write_config(tmp_path, PIPELINE.format(model=out, threshold=INLINE_THRESHOLD,
                                                                        limits=json.dumps(LIMITS))))
    plan = plan_deploy(config)
    assert plan.admitted, plan.reasons
    executor = MediaEncoderExecutor()
    executor.start(config.stage(0))
    engine_config = executor.frontend.engine_config
    assert engine_config.encoder_quantization == "same" and engine_config.encoder_quant().name == "cpu_int4"
    towers = [t for t in load_encoders(out, torch.float32, tower_installer(engine_config)) if t is not None]
    assert plan.stage(0).reservation.weights_bytes == sum(t.resident_bytes() for t in towers)
    dense = sum(t.resident_bytes() for t in load_encoders(model, torch.float32) if t is not None)
    assert plan.stage(0).reservation.weights_bytes < dense / 2
