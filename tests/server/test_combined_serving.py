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
        assert f"text model {served_model.name}" in both.output()  # booked in the speech plan: one free memory
        metrics = both.metrics()
        assert metrics["edge_infer_requests_total{path=/v1/audio/speech,status=200}"] == 1
        assert metrics["edge_infer_requests_total{path=/v1/chat/completions,status=200}"] == 1
        # A text model's name on the speech route is not a model that route serves.
        wrong = httpx.post(both.base_url + "/v1/audio/speech", json={"model": served_model.name, "voice": "ryan", "input": "x"})
        assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"


def test_a_speech_model_beside_a_text_model_is_planned_against_what_the_text_model_leaves(served_model, monkeypatch,
                                                                                           capsys):
    """The two plans book one free memory: with room for either alone but not both, serve refuses before loading
    anything, naming the text model's share and its levers. Each was checked alone against all of it before."""
    import argparse

    import edge_infer.hardware.memory as memory
    import edge_infer.memory.device as device
    from edge_infer.cli import serve

    def serve_args(*extra: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        serve.configure(parser)
        return parser.parse_args([str(served_model), "--speech", str(TINY_TTS), "--kv-cache-memory-bytes", str(8 << 20),
                                  "--max-num-seqs", "2", *extra])

    args = serve_args()
    args.max_body_bytes_in_flight = 2 * args.max_body_bytes
    from edge_infer.server.metrics import SharedMetrics

    text = serve._text_service(args, SharedMetrics()).frontend.plan
    speech = serve._speech_service(args, SharedMetrics(), str(TINY_TTS), [serve._booked(text, str(served_model))])
    speech_bytes = sum(s.reservation.total_bytes for s in speech.omni.plan.stages)
    assert any(r.owner.startswith(f"text model {served_model.name}") for r in speech.omni.plan.beside)
    available = max(text.peak_bytes, speech_bytes) + (1 << 20)
    assert available < text.steady_bytes + speech_bytes  # either fits alone
    real = memory.meminfo
    squeezed = lambda: {**real(), "MemAvailable": available}  # noqa: E731
    monkeypatch.setattr(memory, "meminfo", squeezed)
    monkeypatch.setattr(device, "meminfo", squeezed)
    capsys.readouterr()
    assert serve.run(serve_args()) == 1
    err = capsys.readouterr().err
    assert f"text model {served_model.name}" in err and "--kv-cache-memory-bytes" in err
    assert "stage 0" in err and "together overrun" in err and "DOES NOT FIT" in err
