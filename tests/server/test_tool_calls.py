"""Tool calls through the whole serving path: a scripted engine writes the text a model would.

The app, protocol, extractor and metrics are the real ones; only the engine
is replaced by one that emits a given text piece by piece, so that the
streamed tool-call deltas, the non-streamed ``message.tool_calls`` and the
recovery reports can be checked for exact model outputs. (The demo model
test at the end checks a real model's call.)
"""
from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient

from edge_infer.engine.frontend import Frontend
from edge_infer.engine.media_gate import MediaGate
from edge_infer.models.checkpoint import demo_model_dir
from edge_infer.engine.protocol import CoreStats
from edge_infer.engine.streams import RequestStream, StreamEvent
from edge_infer.server.app import build_app
from edge_infer.server.service import ServeSettings
from edge_infer.server.text_service import TextService

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER_TOOL]}
HERMES = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GLM = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"


class ScriptedEngine:
    """Stands in for AsyncEngine: every request 'generates' ``text`` in 3-character pieces, then ends for
    ``finish_reason``."""

    def __init__(self, text: str, finish_reason: str = "stop"):
        self.text = text
        self.finish_reason = finish_reason
        self.params = []  # of each request
        self.healthy = True
        self.dead_reason = self.hung_reason = self.down_reason = None
        self.core_stats = CoreStats()
        self.media_gate = MediaGate(1)

    def add_request(self, prompt, params, request_id=None, max_chunks=None, media_slots=None) -> RequestStream:
        stream = RequestStream(request_id, max_chunks, lambda n: None)
        self.params.append(params)
        loop = asyncio.get_running_loop()
        for i in range(0, len(self.text), 3):
            loop.call_soon(stream.push, StreamEvent("token", request_id, self.text[i : i + 3], [i]))
        loop.call_soon(stream.push, StreamEvent("finished", request_id, finish_reason=self.finish_reason))
        return stream

    def cancel_nowait(self, request_id: str) -> None:
        pass

    async def refresh_stats(self) -> CoreStats:
        return self.core_stats

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def frontend(served_model) -> Frontend:
    return Frontend.create(served_model)


def client_for(frontend: Frontend, text: str, parser: str = "hermes", finish_reason: str = "stop") -> TestClient:
    service = TextService(frontend, ServeSettings(served_model_name="m", tool_call_parser=parser))
    service.engine = ScriptedEngine(text, finish_reason)

    async def ready() -> None:
        service.phase = "ready"

    client = TestClient(build_app([service], ready))
    client.engine = service.engine
    return client


def stream_chunks(client: TestClient, body: dict) -> list[dict]:
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("parser, text", [("hermes", HERMES), ("glm45", GLM)])
def test_tool_call_in_the_message_and_in_the_stream(frontend, parser, text):
    with client_for(frontend, text, parser) as client:
        full = client.post("/v1/chat/completions", json=ASK).json()
        chunks = stream_chunks(client, ASK)
    choice = full["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert "edge_infer" not in choice  # nothing was repaired, nothing to report

    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed_calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [(tc["index"], tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in streamed_calls] == [
        (0, "get_weather", {"city": "Paris"})
    ]
    assert "".join(d.get("content") or "" for d in deltas) == (choice["message"]["content"] or "")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


CALL = HERMES.split("\n", 1)[1]


@pytest.mark.parametrize("text, content", [
    ("\n" + CALL + "\n\n" + CALL.replace("Paris", "Rome") + "\n", None),
    (CALL + "\n", None),
    ("Sure.\n\n" + CALL + "\n", "Sure.\n\n\n"),
    ("\n" + CALL + "\n\nDone.", "\n\n\nDone."),
    ("\n\n", "\n\n"),
], ids=["blank-lines-around-calls", "blank-line-after-a-call", "text-then-a-call", "a-call-then-text", "no-call"])
def test_the_stream_s_content_is_the_message_s(frontend, text, content):
    """Blank lines beside calls are no content (the message's is null); a stream sent them as content deltas, so
    clients (openai's stream helpers, langchain-openai) read a content of "\n" beside the calls. Text still streams
    before the call, with the whitespace the message has."""
    with client_for(frontend, text) as client:
        message = client.post("/v1/chat/completions", json=ASK).json()["choices"][0]["message"]
        chunks = stream_chunks(client, ASK)
    assert message["content"] == content
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == (content or "")
    if content and content.startswith("Sure."):
        first_call = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
        assert "".join(d.get("content") or "" for d in deltas[:first_call]) == content[:-1]


def test_malformed_call_is_recovered_reported_and_counted(frontend):
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"'  # cut off: no braces, no end tag
    with client_for(frontend, broken) as client:
        choice = client.post("/v1/chat/completions", json=ASK).json()["choices"][0]
        streamed = stream_chunks(client, ASK)
        metrics = client.get("/metrics").text
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    problems = [r["problem"] for r in choice["edge_infer"]["tool_call_recovery"]]
    assert any("missing </tool_call>" in p for p in problems) and any("unterminated JSON" in p for p in problems)
    assert all(r["recovered"] and r["index"] == 0 and r["parser"] == "hermes" for r in choice["edge_infer"]["tool_call_recovery"])
    final = streamed[-1]["choices"][0]
    assert final["finish_reason"] == "tool_calls"
    assert final["edge_infer"]["tool_call_recovery"] == choice["edge_infer"]["tool_call_recovery"]
    assert 'edge_infer_tool_call_recoveries_total{outcome="recovered",parser="hermes"} 4.0' in metrics


def test_unrecoverable_call_stays_text_and_is_reported(frontend):
    with client_for(frontend, "<tool_call>call the weather tool</tool_call>") as client:
        choice = client.post("/v1/chat/completions", json=ASK).json()["choices"][0]
        metrics = client.get("/metrics").text
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "<tool_call>call the weather tool</tool_call>"
    (report,) = choice["edge_infer"]["tool_call_recovery"]
    assert report["recovered"] is False and report["index"] is None
    assert 'edge_infer_tool_call_recoveries_total{outcome="unrecoverable",parser="hermes"} 1.0' in metrics


def test_a_call_cut_off_by_max_tokens_is_text_and_the_finish_is_length(frontend):
    """Found by a client probe: the cut-off call was repaired into arguments "{}" and reported as finish "tool_calls",
    so a client would run a call whose arguments the model never wrote."""
    cut = 'Let me check.\n<tool_call>\n{"name": "get_weather",'
    with client_for(frontend, cut, finish_reason="length") as client:
        choice = client.post("/v1/chat/completions", json=ASK).json()["choices"][0]
        streamed = stream_chunks(client, ASK)
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == cut
    (report,) = choice["edge_infer"]["tool_call_recovery"]
    assert not report["recovered"] and "cut off by max_tokens" in report["problem"]
    deltas = [c["choices"][0]["delta"] for c in streamed if c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == cut and not any(d.get("tool_calls") for d in deltas)
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("parser, text", [("hermes", HERMES), ("glm45", GLM)])
def test_calls_complete_at_max_tokens_are_calls(frontend, parser, text):
    with client_for(frontend, text + "\n", parser, finish_reason="length") as client:
        choice = client.post("/v1/chat/completions", json=ASK).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 1
    with client_for(frontend, text + "\nAnd then", parser, finish_reason="length") as client:
        choice = client.post("/v1/chat/completions", json=ASK).json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["message"]["tool_calls"]) == 1  # cut off in its text


def test_without_parallel_tool_calls_a_second_call_is_dropped_and_reported(frontend):
    """The hermes format is held to one call by its grammar while decoding (tests/server/test_tool_parsers.py); a
    format without one keeps the first call."""
    with client_for(frontend, GLM + "\n" + GLM.replace("Paris", "Rome"), "glm45") as client:
        choice = client.post("/v1/chat/completions", json={**ASK, "parallel_tool_calls": False}).json()["choices"][0]
        streamed = stream_chunks(client, {**ASK, "parallel_tool_calls": False})
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    (report,) = choice["edge_infer"]["tool_call_recovery"]
    assert report["action"] == "dropped it" and "parallel_tool_calls is false" in report["problem"]
    assert len([tc for c in streamed if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]) == 1


def test_calls_answer_a_response_format_request_without_a_format_report(frontend):
    """Calls answer instead of the JSON content; the blank lines around them are no invalid JSON (a review found
    the stream's report said so)."""
    body = {**ASK, "response_format": {"type": "json_object"}}
    with client_for(frontend, "\n" + HERMES.split("\n", 1)[1] + "\n\n") as client:
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        final = stream_chunks(client, body)[-1]["choices"][0]
    assert choice["message"]["tool_calls"] and "edge_infer" not in choice
    assert "edge_infer" not in final or "response_format" not in final["edge_infer"]


def test_a_request_s_grammar_is_checked_once_before_its_samples_start(frontend):
    """Each sample of n gets the grammar checked while the request was prepared (engine/grammar.CheckedGrammar)."""
    from edge_infer.engine.grammar import CheckedGrammar

    with client_for(frontend, HERMES) as client:
        assert client.post("/v1/chat/completions", json={**ASK, "n": 3, "tool_choice": "required"}).status_code == 200
    specs = [params.structured_outputs for params in client.engine.params]
    assert len(specs) == 3 and all(isinstance(spec, CheckedGrammar) and spec is specs[0] for spec in specs)


def test_tool_choice_none_leaves_the_text_alone(frontend):
    with client_for(frontend, HERMES) as client:
        choice = client.post("/v1/chat/completions", json={**ASK, "tool_choice": "none"}).json()["choices"][0]
    assert choice["message"]["content"] == HERMES and choice["finish_reason"] == "stop"


def test_required_tool_choice_is_reported_when_not_met(frontend):
    with client_for(frontend, "It is sunny.") as client:
        choice = client.post("/v1/chat/completions", json={**ASK, "tool_choice": "required"}).json()["choices"][0]
    assert choice["edge_infer"]["tool_choice"] == {"requested": "required", "met": False}


@pytest.mark.slow
def test_demo_model_calls_the_weather_tool():
    from .serverutil import ServerProcess

    with ServerProcess(demo_model_dir(), "--max-model-len", "1024") as server:
        client = server.client()
        out = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=ASK["messages"], tools=[WEATHER_TOOL], temperature=0, max_tokens=96,
        )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments), dict)
