"""One process serves a text and a speech model (`serve TEXT --speech TTS`) behind one set of shared routes."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from .serverutil import ServerProcess

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
        metrics = both.metrics()
        assert metrics["edge_infer_requests_total{path=/v1/audio/speech,status=200}"] == 1
        assert metrics["edge_infer_requests_total{path=/v1/chat/completions,status=200}"] == 1
        # A text model's name on the speech route is not a model that route serves.
        wrong = httpx.post(both.base_url + "/v1/audio/speech", json={"model": served_model.name, "voice": "ryan", "input": "x"})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
