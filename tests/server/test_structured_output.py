"""End-to-end: structured output through the real server, driven by the official openai client and by
langchain-openai; on a random checkpoint (the tags are plain text to its tokenizer) and on the demo model
(the tags are tokens of their own)."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from .serverutil import ServerProcess

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "celsius": {"type": "integer", "minimum": -40, "maximum": 50},
                   "sky": {"enum": ["sunny", "cloudy", "rain"]}},
    "required": ["city", "celsius", "sky"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "set_wifi", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}},
]


@pytest.fixture(scope="module")
def demo_server():
    from edge_infer.models.checkpoint import demo_model_dir

    with ServerProcess(demo_model_dir(), "--max-num-seqs", "4", "--max-model-len", "1024") as proc:
        yield proc


@pytest.fixture(params=["random", "demo"])
def any_server(request, server, demo_server):
    return server if request.param == "random" else demo_server


def _model(server) -> str:
    return server.client().models.list().data[0].id


def _max_model_len(server) -> int:
    return server.client().models.list().data[0].max_model_len


def test_json_schema_response_format_always_validates(any_server):
    client = any_server.client()
    for seed in range(3):
        out = client.chat.completions.create(
            model=_model(any_server), messages=ASK, temperature=1.0, seed=seed, max_tokens=120,
            response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}},
        )
        choice = out.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), WEATHER)
        assert choice.model_extra["edge_infer"]["response_format"] == {"type": "json_schema", "valid": True}


def test_streamed_structured_output_equals_the_non_streamed(any_server):
    client = any_server.client()
    body = dict(model=_model(any_server), messages=ASK, temperature=0, max_tokens=120,
                response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}})
    whole = client.chat.completions.create(**body).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**body, stream=True)
                       if c.choices)
    assert streamed == whole and json.loads(whole)


def test_guided_extensions_on_completions_and_chat(any_server):
    client = any_server.client()
    out = client.completions.create(model=_model(any_server), prompt="Code:", max_tokens=20, temperature=1.0, n=3,
                                    seed=1, extra_body={"guided_regex": r"[A-Z]{2}-[0-9]{3}"})
    assert all(re.fullmatch(r"[A-Z]{2}-[0-9]{3}", c.text) and c.finish_reason == "stop" for c in out.choices)
    out = client.chat.completions.create(model=_model(any_server), messages=ASK, max_tokens=20, temperature=1.0, n=4,
                                         seed=2, extra_body={"guided_choice": ["wifi on", "wifi off"]})
    assert {c.message.content for c in out.choices} <= {"wifi on", "wifi off"}
    grammar = 'root ::= "turn " ("on" | "off") " the " ("wifi" | "clock")'
    out = client.chat.completions.create(model=_model(any_server), messages=ASK, max_tokens=20,
                                         extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"turn (on|off) the (wifi|clock)", out.choices[0].message.content)


def test_required_and_strict_tool_calls_match_their_schemas(any_server):
    client = any_server.client()
    # the random checkpoint's small vocabulary spells the tools' JSON in many tokens: one tool fits its context
    tools = TOOLS if _max_model_len(any_server) > 512 else TOOLS[:1]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        for seed, parallel in ((0, False), (1, True)):
            out = client.chat.completions.create(model=_model(any_server), messages=ASK, tools=tools, tool_choice=choice,
                                                 temperature=1.0, seed=seed, parallel_tool_calls=parallel)  # max_tokens: what fits
            calls = out.choices[0].message.tool_calls
            assert calls, out.choices[0].message.content
            if parallel:  # the random model may write calls until the context is full: then it was cut off
                assert out.choices[0].finish_reason in ("tool_calls", "length")
            else:  # one call, and then the grammar lets the output end only
                assert len(calls) == 1 and out.choices[0].finish_reason == "tool_calls"
            for call in calls:  # a call was required: every call's arguments follow its tool's parameters
                params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
                jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
            if isinstance(choice, dict):
                assert [c.function.name for c in calls] == ["get_weather"]


def test_response_format_beside_tools_shapes_the_content_and_leaves_the_calls(demo_server):
    """Found by a client probe: response_format silenced the tools (and tool_choice "required" was not met). Now the
    answer is the JSON or calls; a required call is a call, whose turn has no content to shape."""
    client = demo_server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    kinds = set()
    for seed in range(4):
        out = client.chat.completions.create(model=_model(demo_server), messages=ASK, tools=TOOLS, response_format=fmt,
                                             temperature=1.0, seed=seed, max_tokens=150)
        message = out.choices[0].message
        if message.tool_calls:
            kinds.add("calls")
            assert not message.content and out.choices[0].finish_reason == "tool_calls"
        else:
            kinds.add("json")
            jsonschema.validate(json.loads(message.content), WEATHER)
    assert "calls" in kinds  # the demo model was trained to call the weather tool for this question
    out = client.chat.completions.create(model=_model(demo_server), messages=[{"role": "user", "content": "Hello!"}],
                                         tools=TOOLS, tool_choice="required", response_format=fmt, max_tokens=150)
    assert out.choices[0].message.tool_calls and out.choices[0].model_extra["edge_infer"]["tool_choice"]["met"]


@pytest.mark.parametrize("parallel", [False, None])
def test_auto_tool_choice_with_a_strict_tool_may_answer_in_text_but_its_calls_follow_the_schema(demo_server, parallel):
    """With parallel calls allowed too: their grammar was not valid Lark (a 400 found by a client probe)."""
    client = demo_server.client()
    saw_call = False
    for seed in range(4):
        out = client.chat.completions.create(model=_model(demo_server), messages=ASK, tools=TOOLS, temperature=1.0,
                                             seed=seed, max_tokens=150, parallel_tool_calls=parallel)
        choice = out.choices[0]
        assert choice.finish_reason in ("stop", "tool_calls")
        calls = choice.message.tool_calls or []
        assert (parallel is not False or len(calls) <= 1) and "<tool_call>" not in (choice.message.content or "")
        for call in calls:
            saw_call = True
            if call.function.name == "get_weather":
                jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    assert saw_call  # the demo model was trained to call the weather tool for this question


def test_logit_bias_forces_and_bans_a_token(server, tokenizer):
    client = server.client()
    [weather] = tokenizer.encode(" weather", add_special_tokens=False)
    body = dict(model=_model(server), prompt="The", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    forced = client.completions.create(**body, logit_bias={str(weather): 100}).choices[0].text
    assert forced == " weather" * 3
    banned = client.completions.create(**body, logit_bias={str(weather): -100, "0": 0}).choices[0].text
    assert " weather" not in banned


def test_an_unusable_schema_is_a_400_and_the_server_serves_on(any_server):
    client = any_server.client()
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=_model(any_server), messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "minProperties": 3, "maxProperties": 1}}})
    assert "structured output" in exc.value.body["message"]
    assert client.chat.completions.create(model=_model(any_server), messages=ASK, max_tokens=3).choices[0].message


def _objects(n: int) -> dict:
    return {"anyOf": [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(n)]}


def test_a_schema_past_llguidance_s_parser_limits_is_a_400_or_ends_as_grammar_limit(demo_server):
    """More than 2,000 object alternatives at one point: llguidance meets its limit only on the "{" that opens one,
    so the request ended after its first token with grammar_dead_end and the reason only in the server's log. The
    check finds it on a walk into the output (a 400 before anything runs); past the walk (behind a long key), the
    output ends with finish_reason grammar_limit, its text kept, in a stream too."""
    client = demo_server.client()

    def ask(schema: dict, **kwargs):
        response_format = {"type": "json_schema", "json_schema": {"name": "many", "schema": schema}}
        return client.chat.completions.create(model=_model(demo_server), messages=ASK, max_tokens=200, temperature=0,
                                              response_format=response_format, **kwargs)

    with pytest.raises(openai.BadRequestError, match="keep well under 2,000") as first:
        ask(_objects(3000))
    assert "Current row has 3000 items; max is 2000" in first.value.body["message"]
    assert first.value.body["code"] == "grammar_limit"
    behind = {"type": "object", "properties": {"k" * 90: _objects(3000)}, "required": ["k" * 90],
              "additionalProperties": False}
    late = ask(behind).choices[0]
    assert late.finish_reason == "grammar_limit" and '"' + "k" * 90 + '"' in late.message.content
    streamed = list(ask(behind, stream=True))
    assert streamed[-1].choices[0].finish_reason == "grammar_limit"
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == late.message.content
    assert ask(_objects(1000)).choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("grammar", ["", "  \n"])
def test_an_empty_grammar_is_a_400_naming_it(any_server, grammar):
    """Found by the fuzzer (tests/server/test_fuzz.py): an empty guided_grammar was a 500."""
    client = any_server.client()
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=_model(any_server), messages=ASK, extra_body={"guided_grammar": grammar})
    assert "grammar for structured output is empty" in exc.value.body["message"]
    assert client.chat.completions.create(model=_model(any_server), messages=ASK, max_tokens=3).choices[0].message


def test_instructor_gets_its_response_model_in_tools_and_json_schema_modes(demo_server):
    import instructor

    class Weather(BaseModel):  # no additionalProperties: the schema is read closed, as OpenAI's strict mode reads it
        city: str = Field(max_length=10)
        celsius: int = Field(ge=-40, le=50)

    raw = demo_server.client()
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(raw, mode=mode)
        result = client.chat.completions.create(model=_model(demo_server), response_model=Weather, max_retries=0,
                                                max_tokens=120, messages=ASK)
        assert isinstance(result, Weather) and -40 <= result.celsius <= 50


def test_langchain_with_structured_output_parses_into_the_model(demo_server):
    from langchain_openai import ChatOpenAI

    class Weather(BaseModel):
        city: str = Field(max_length=10)
        celsius: int = Field(ge=-40, le=50)

    llm = ChatOpenAI(base_url=demo_server.base_url + "/v1", api_key="none", model=_model(demo_server), temperature=0,
                     max_tokens=80)
    for method in ("json_schema", "function_calling"):
        result = llm.with_structured_output(Weather, method=method, strict=True).invoke("What is the weather in Paris?")
        assert isinstance(result, Weather) and -40 <= result.celsius <= 50
