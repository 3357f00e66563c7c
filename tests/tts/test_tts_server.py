"""End-to-end: ``edge-infer serve`` on the tiny Qwen3-TTS checkpoint, the speech endpoints over HTTP."""
from __future__ import annotations

import base64
import io
import json
import os
import signal

import httpx
import numpy as np
import pytest
import soundfile

from server.serverutil import ServerProcess, wait_until
from tts_helpers import SAMPLES_PER_FRAME, TINY

pytestmark = pytest.mark.slow

VOICES = ["aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian"]
MAX_CHARS = 200


@pytest.fixture(scope="module")
def server():
    with ServerProcess(TINY, "--max-input-chars", str(MAX_CHARS), "--max-model-len", "512") as proc:
        yield proc


def speech(server, **body) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/audio/speech", json={"model": TINY.name, "voice": "ryan", **body}, timeout=120)


def test_wav_decodes_at_24_khz_with_one_frame_of_samples_per_code_frame(server) -> None:
    response = speech(server, input="Hello from the edge.", max_tokens=12, ignore_eos=True)
    assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
    audio, rate = soundfile.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 24000 and audio.shape == (12 * SAMPLES_PER_FRAME,) and np.isfinite(audio).all()


def test_the_openai_client_gets_audio_of_plausible_length(server) -> None:
    client = server.client()
    with client.audio.speech.with_streaming_response.create(
        model=TINY.name, input="The openai client.", voice="vivian", response_format="wav", extra_body={"seed": 3},
    ) as response:
        data = response.read()
    audio, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    # Frames of 80 ms: eos is masked for the first two; at most max_model_len minus the prompt.
    assert rate == 24000 and len(audio) % SAMPLES_PER_FRAME == 0 and 2 <= len(audio) // SAMPLES_PER_FRAME < 512
    assert np.isfinite(audio).all()


def test_pcm_flac_and_sse_carry_the_same_samples(server) -> None:
    body = dict(input="Same seed, same audio.", seed=5, max_tokens=8, ignore_eos=True)
    wav, _ = soundfile.read(io.BytesIO(speech(server, **body).content), dtype="int16")
    pcm = np.frombuffer(speech(server, response_format="pcm", **body).content, dtype="<i2")
    flac_response = speech(server, response_format="flac", **body)
    assert flac_response.headers["content-type"] == "audio/flac"
    flac, rate = soundfile.read(io.BytesIO(flac_response.content), dtype="int16")
    assert rate == 24000
    np.testing.assert_array_equal(pcm, wav)
    np.testing.assert_array_equal(flac, wav)
    events = [json.loads(line[6:]) for line in speech(server, response_format="pcm", stream_format="sse", **body).text.splitlines()
              if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 8
    sse = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), dtype="<i2")
    np.testing.assert_array_equal(sse, wav)


def test_audio_streams_while_the_request_runs_and_a_disconnect_cancels_it(server) -> None:
    with httpx.Client(timeout=120) as client:
        body = {"model": TINY.name, "voice": "ryan", "input": "A long one.", "max_tokens": 400, "ignore_eos": True}
        with client.stream("POST", server.base_url + "/v1/audio/speech", json=body) as response:
            chunks = response.iter_bytes()  # held: dropping the iterator would close the connection
            first = next(chunks)
            assert first[:4] == b"RIFF" and response.status_code == 200
            assert server.metrics()["edge_infer_requests_in_flight"] == 1  # audio arrived before the request ended
    wait_until(lambda: server.metrics()["edge_infer_requests_in_flight"] == 0, "the disconnected request to end")
    assert server.metrics()['edge_infer_request_finish_total{reason=cancelled}'] >= 1


def test_greedy_over_http_is_greedy_in_every_codebook(server) -> None:
    """The residual codebooks sample unless subtalker_temperature is 0: the field was read by the Python API and
    dropped over HTTP (any value gave the same audio, and temperature 0 alone was not reproducible)."""
    body = dict(input="Greedy.", response_format="pcm", max_tokens=8, ignore_eos=True, temperature=0)
    greedy = [speech(server, subtalker_temperature=0, **body).content for _ in range(2)]
    assert greedy[0] == greedy[1]
    assert speech(server, subtalker_temperature=1.5, seed=1, **body).content != greedy[0]
    refused = speech(server, subtalker_temperature="hot", **body)
    assert refused.status_code == 400 and "subtalker_temperature" in refused.text
    speech(server, made_up_field=1, **body)
    assert "ignoring request fields edge-infer does not know: made_up_field" in server.output()


def test_a_client_gone_before_the_first_audio_is_cancelled_quietly(server) -> None:
    """Closing the events while their cancelled read still unwound raised in a task nobody awaited: a traceback
    ("Task exception was never retrieved") in the log for every such disconnect. The request still ends."""
    import socket

    body = json.dumps({"voice": "ryan", "input": "A long one.", "max_tokens": 400, "ignore_eos": True,
                       "response_format": "flac"}).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: server.metrics()["edge_infer_requests_in_flight"] == 1, "the request to start")
    wait_until(lambda: server.metrics()["edge_infer_requests_in_flight"] == 0, "the disconnected request to end")
    wait_until(lambda: httpx.get(server.base_url + "/health").json()["stages"][0]["inflight"] == 0, "the abort")
    assert "never retrieved" not in server.output() and "already running" not in server.output()


def test_the_plan_books_the_request_bodies_in_flight(server) -> None:
    """A speech model served alone: its deploy plan holds the server's bodies in flight (2 x --max-body-bytes)."""
    from edge_infer.memory.ledger import format_bytes
    from edge_infer.memory.sizing import request_bodies_bytes

    (row,) = [line for line in server.output().splitlines() if line.startswith("server: request bodies")]
    assert format_bytes(request_bodies_bytes(2 * (16 << 20))) in row


def test_voices_and_models(server) -> None:
    voices = httpx.get(server.base_url + "/v1/audio/voices").json()
    assert [v["id"] for v in voices["data"]] == VOICES and "english" in voices["languages"]
    assert [m.id for m in server.client().models.list().data] == [TINY.name]


@pytest.mark.parametrize("fmt, media_type, floor", [("mp3", "audio/mpeg", 0.9), ("opus", "audio/ogg", 0.6)])
def test_mp3_and_opus_carry_the_same_speech_lossily(server, fmt, media_type, floor) -> None:
    # OpenAI's default format and its Opus-in-Ogg, for clients that never ask for wav. At libsndfile's default
    # bitrates (~50 and ~38 kbit/s) the tiny model's noise-like audio keeps a correlation of 0.93 and 0.73 with
    # the wav (real speech keeps more); another seed's audio is near 0.
    body = dict(input="Same seed, same audio.", max_tokens=8, ignore_eos=True)
    wav, _ = soundfile.read(io.BytesIO(speech(server, seed=5, **body).content), dtype="float32")
    other, _ = soundfile.read(io.BytesIO(speech(server, seed=6, **body).content), dtype="float32")
    response = speech(server, response_format=fmt, seed=5, **body)
    assert response.headers["content-type"] == media_type
    lossy, rate = soundfile.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 24000 and abs(len(lossy) - len(wav)) <= 1152  # within one MP3 frame of encoder padding
    assert len(response.content) < len(speech(server, response_format="flac", seed=5, **body).content)
    n = min(len(lossy), len(wav), len(other))
    assert np.corrcoef(lossy[:n], wav[:n])[0, 1] > floor > abs(np.corrcoef(lossy[:n], other[:n])[0, 1])


@pytest.mark.parametrize("body, param, fragment", [
    ({"input": ""}, "input", "empty"),
    ({"input": "   \n"}, "input", "empty"),
    ({"input": "x" * (MAX_CHARS + 1)}, "input", f"at most {MAX_CHARS}"),
    ({"input": "hi", "voice": "bob"}, "voice", ", ".join(VOICES)),
    ({"input": "hi", "speed": 1.25}, "speed", "speed 1.25 is not supported"),
    ({"input": "hi", "response_format": "aac"}, "response_format", "wav, pcm, flac, mp3, opus"),
    ({"input": "hi", "response_format": "mp3", "stream_format": "sse"}, "stream_format", "use stream_format audio for mp3"),
    ({"input": "\u200b \ufeff\u200d"}, "input", "input is empty"),  # zero-width characters speak nothing
    ({"input": "\x00\x01\u0301"}, "input", "input is empty"),  # nor control or lone combining characters
    ({"input": "hi", "instructions": "calm " * 200_000}, "instructions", "instructions has 1000000 characters"),
    ({"input": "hi", "language": "klingon"}, "language", "english"),
    ({"input": "hi", "response_format": "flac", "stream_format": "sse"}, "stream_format", "flac"),
])
def test_bad_requests_are_400_with_the_reason(server, body, param, fragment) -> None:
    response = httpx.post(server.base_url + "/v1/audio/speech", json={"voice": "ryan", **body}, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"] and error["code"]  # a code to act on


def test_an_unknown_model_is_404_model_not_found(server) -> None:
    response = httpx.post(server.base_url + "/v1/audio/speech", json={"voice": "ryan", "input": "hi", "model": "other"}, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "model_not_found" and "is not served here" in error["message"]


def test_text_routes_say_this_is_a_speech_model(server) -> None:
    response = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": []})
    assert response.status_code == 404 and "/v1/audio/speech" in response.json()["error"]["message"]


def test_metrics_report_ttfp_rtf_and_stage_times(server) -> None:
    assert speech(server, input="Measure me.", max_tokens=6, ignore_eos=True).status_code == 200
    metrics = server.metrics()
    assert metrics["edge_infer_tts_time_to_first_packet_seconds_count"] >= 1
    assert metrics["edge_infer_tts_real_time_factor_count"] >= 1
    for stage in ("talker", "code2wav"):
        assert metrics[f"edge_infer_tts_stage_time_seconds_count{{stage={stage}}}"] >= 1
        assert metrics[f"edge_infer_memory_reserved_bytes{{stage={stage}}}"] > 0
        assert metrics[f"edge_infer_stage_up{{stage={stage}}}"] == 1


def test_a_stopped_stage_is_unhealthy_within_seconds_and_healthy_again_when_continued(server) -> None:
    """A request the silence ends, and one sent during it, are 503 engine_unresponsive, as /health says; not
    engine_dead with "restart the server" (the server restarts a stage itself)."""
    from concurrent.futures import ThreadPoolExecutor

    talker = httpx.get(server.base_url + "/health").json()["stages"][0]["pid"]
    with ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(speech, server, input="Long.", response_format="flac", max_tokens=400, ignore_eos=True)
        wait_until(lambda: httpx.get(server.base_url + "/health").json()["stages"][0]["inflight"] == 1, "a request")
        os.kill(talker, signal.SIGSTOP)
        try:
            wait_until(lambda: httpx.get(server.base_url + "/health").status_code == 503, "health to report the silence")
            health = httpx.get(server.base_url + "/health").json()
            assert health["status"] == "engine_unresponsive" and "no heartbeat" in health["detail"]
            response = speech(server, input="Anyone there?")
            assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unresponsive"
            ended = inflight.result().json()["error"]
            assert ended["code"] == "engine_unresponsive" and "restarts it" in ended["message"]
        finally:
            os.kill(talker, signal.SIGCONT)
    wait_until(lambda: httpx.get(server.base_url + "/health").status_code == 200, "health to recover")
    assert speech(server, input="Back.", max_tokens=4, ignore_eos=True).status_code == 200


def test_a_dead_code2wav_worker_cuts_the_stream_and_is_replaced(server) -> None:
    """A wav stream cut by the failure must read as cut (no last chunk), not as a short, complete file; the stage's
    worker is then replaced, as the text server's worker is restarted."""
    stages = {s["stage_id"]: s for s in httpx.get(server.base_url + "/health").json()["stages"]}
    assert stages[1]["state"] == "running" and "code2wav" in stages[1]["label"]
    body = {"voice": "ryan", "input": "A long answer.", "max_tokens": 400, "ignore_eos": True, "response_format": "wav"}
    with httpx.stream("POST", server.base_url + "/v1/audio/speech", json=body, timeout=60) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()
        assert next(chunks)  # the header and the first audio are out
        os.kill(stages[1]["pid"], signal.SIGKILL)
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in chunks:
                pass

    def replaced() -> bool:
        health = httpx.get(server.base_url + "/health")
        return health.status_code == 200 and health.json()["stages"][1]["pid"] != stages[1]["pid"]

    wait_until(replaced, "the dead stage to be replaced")
    assert speech(server, input="Anyone there?", max_tokens=4, ignore_eos=True).status_code == 200
    assert server.metrics()["edge_infer_stage_restarts_total{stage=code2wav}"] == 1
    assert "restarting it" in server.output()


def test_without_restarts_a_dead_stage_stops_the_server_with_a_nonzero_status() -> None:
    with ServerProcess(TINY, "--no-restart", "--max-model-len", "512") as server:
        talker = httpx.get(server.base_url + "/health").json()["stages"][0]["pid"]
        os.kill(talker, signal.SIGKILL)
        assert server.proc.wait(30) == 3
        assert "not restarting: restarts are off (--no-restart)" in server.output()

