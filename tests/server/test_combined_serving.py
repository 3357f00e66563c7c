"""One process serves a text and a speech model (`serve TEXT --speech TTS`) behind one set of shared routes."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from .serverutil import ServerProcess, wait_until

pytestmark = pytest.mark.slow
TINY_TTS = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts" / "tiny"


def test_one_process_serves_a_text_and_a_speech_model(served_model):
    with ServerProcess(served_model, "--speech", str(TINY_TTS)) as both:
        client = both.client()
        assert sorted(m.id for m in client.models.list().data) == sorted([served_model.name, TINY_TTS.name])
        assert client.models.retrieve(TINY_TTS.name).id == TINY_TTS.name
        reply = client.chat.completions.create(model=served_model.name, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=2)
        assert reply.choices[0].message.content is not None
        audio = httpx.post(both.base_url + "/v1/audio/speech", timeout=120, json={
            "model": TINY_TTS.name, "voice": "ryan", "input": "Both at once.", "max_tokens": 4, "ignore_eos": True})
        assert audio.status_code == 200 and audio.headers["content-type"] == "audio/wav"
        health = httpx.get(both.base_url + "/health").json()
        assert health["status"] == "ok" and set(health["models"]) == {served_model.name, TINY_TTS.name}
        # One process, one budget of bodies in flight: the text model's plan holds it, the speech plan does not.
        assert "deploy plan:" in both.output() and "server: request bodies" not in both.output()
        assert f"text model {served_model.name}" in both.output()  # booked in the speech plan: one free memory
        metrics = both.metrics()
        assert metrics["edge_infer_requests_total{path=/v1/audio/speech,status=200}"] == 1
        assert metrics["edge_infer_requests_total{path=/v1/chat/completions,status=200}"] == 1
        # A text model's name on the speech route is not a model that route serves.
        wrong = httpx.post(both.base_url + "/v1/audio/speech", json={"model": served_model.name, "voice": "ryan", "input": "x"})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "not_a_speech_model"
        assert "send it to /v1/chat/completions" in wrong.json()["error"]["message"]
        with pytest.raises(openai.NotFoundError, match="is this server's speech model: send it to /v1/audio/speech"):
            client.chat.completions.create(model=TINY_TTS.name, messages=[{"role": "user", "content": "Hi"}])
        other = httpx.post(both.base_url + "/v1/audio/speech", json={"model": "nope", "voice": "ryan", "input": "x"})
        assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
        # A stalled speech stage: the server is not healthy, the text model is (a balancer can ask per model).
        talker = httpx.get(both.base_url + "/health", params={"model": TINY_TTS.name}).json()["stages"][0]["pid"]
        os.kill(talker, signal.SIGSTOP)
        try:
            wait_until(lambda: httpx.get(both.base_url + "/health").status_code == 503, "the silence to show")
            alone = httpx.get(both.base_url + "/health", params={"model": served_model.name})
            assert alone.status_code == 200 and alone.json()["status"] == "ok"
            speech = httpx.get(both.base_url + "/health", params={"model": TINY_TTS.name})
            assert speech.status_code == 503 and speech.json()["status"] == "engine_unresponsive"
            assert httpx.get(both.base_url + "/health", params={"model": "nope"}).status_code == 404
        finally:
            os.kill(talker, signal.SIGCONT)


def test_a_text_and_a_speech_model_share_one_free_memory(served_model, monkeypatch, capsys):
    """serve plans the speech stages first and the text model in what they leave; the speech plan then books the
    text model's. With room for either alone but not both, serve refuses before loading anything, saying what the
    speech model takes and naming the levers; with the KV cache left to the plan, the same room serves both.
    (Each plan was checked alone against all free memory before: 8.23 GiB admitted on 7 GiB.)"""
    import argparse

    import edge_infer.hardware.memory as memory
    import edge_infer.memory.device as device
    from edge_infer.cli import main, serve
    from edge_infer.runtime.deploy_plan import plan_deploy
    from edge_infer.server.metrics import SharedMetrics

    def serve_args(*extra: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        serve.configure(parser)
        args = parser.parse_args([str(served_model), "--speech", str(TINY_TTS), "--max-num-seqs", "2", *extra])
        args.max_body_bytes_in_flight = 2 * args.max_body_bytes  # as run() sets it
        return args

    big_kv = ("--kv-cache-memory-bytes", str(64 << 20))
    pipeline = serve.speech_pipeline(serve_args(*big_kv), str(TINY_TTS))
    speech_bytes = plan_deploy(pipeline.config).stages_bytes
    text = serve._text_service(serve_args(*big_kv), SharedMetrics()).frontend.plan
    available = speech_bytes + text.steady_bytes - (32 << 20)
    assert max(text.peak_bytes, speech_bytes) < available  # either fits alone
    real = memory.meminfo
    squeezed = lambda: {**real(), "MemAvailable": available}  # noqa: E731
    monkeypatch.setattr(memory, "meminfo", squeezed)
    monkeypatch.setattr(device, "meminfo", squeezed)
    monkeypatch.setattr(memory, "cgroup_memory", lambda: (None, None, "no cgroup memory limit"))
    monkeypatch.setattr(device, "cgroup_memory", lambda: (None, None, "no cgroup memory limit"))
    capsys.readouterr()
    assert main(["serve", str(served_model), "--speech", str(TINY_TTS), "--max-num-seqs", "2", *big_kv]) == 1
    err = capsys.readouterr().err
    assert f"the speech model beside it (--speech) reserves {speech_bytes / 2**20:,.1f} MiB" in err
    assert "--kv-cache-memory-bytes" in err and "(nothing was loaded)" in err

    planned = serve_args()
    text = serve._text_service(planned, SharedMetrics(), pipeline)
    speech = serve._speech_service(planned, SharedMetrics(), pipeline, text.frontend.plan)
    assert speech.omni.plan.admitted and text.frontend.plan.available_bytes == available - speech_bytes
    assert [r.owner for r in speech.omni.plan.beside] == [f"text model {served_model.name}"]
    assert "after the speech pipeline's" in capsys.readouterr().err

    # edge-infer plan --speech shows the same, before serve is run.
    plan = ["plan", str(served_model), "--speech", str(TINY_TTS), "--max-num-seqs", "2", "--available-bytes",
            str(available)]
    assert main([*plan, *big_kv]) == 1
    assert main(plan) == 0
    out = capsys.readouterr().out
    assert f"of {available / 2**20:,.1f} MiB)" in out and f"text model {served_model.name}" in out and "ADMITTED" in out


def test_a_text_and_a_speech_model_of_one_name_each_serve_on_their_routes():
    """`serve /a/model --speech /b/model` names both "model": each route must serve its own, not send the request to
    the other's route (a model of another name and kind is pointed to its route)."""
    from edge_infer.server.app import link_neighbours
    from edge_infer.server.errors import APIError
    from edge_infer.server.service import ServeSettings, Service

    text, speech, other = (Service(ServeSettings(name), None, 1) for name in ("model", "model", "tts"))
    text.kind, speech.kind, other.kind = "text", "speech", "speech"
    link_neighbours([text, speech])
    text.check_model("model")
    speech.check_model("model")
    link_neighbours([text, other])
    with pytest.raises(APIError, match="is this server's speech model: send it to /v1/audio/speech"):
        text.check_model("tts")
