"""Tool-call parsing: the formats models write, their repairs, and streaming equal to whole-text parsing."""
from __future__ import annotations

import json

import pytest

from edge_infer.server.tool_parsers import (
    Glm45Parser,
    HermesParser,
    ToolCallExtractor,
    detect_parser,
    extract,
    hermes_calls_grammar,
    parse_json_lenient,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    },
}


def hermes() -> HermesParser:
    return HermesParser([WEATHER])


def glm() -> Glm45Parser:
    return Glm45Parser([WEATHER])


def args(call) -> dict:
    return json.loads(call.arguments)


def test_hermes_well_formed_call_is_parsed_without_reports():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls, recoveries = extract(hermes(), text)
    assert content == "Let me check.\n"
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert recoveries == []


def test_hermes_several_calls_and_string_arguments():
    text = (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}</tool_call>'
    )
    content, calls, recoveries = extract(hermes(), text)
    assert [args(c) for c in calls] == [{"city": "Oslo"}, {"city": "Rome", "days": 2}]
    assert content.strip() == "" and recoveries == []


@pytest.mark.parametrize(
    "body, problem",
    [
        ('{"name": "get_weather", "arguments": {"city": "Paris"}', "unterminated JSON"),
        ('{"name": "get_weather", "arguments": {"city": "Par', "unterminated JSON"),
        ('"name": "get_weather", "arguments": {"city": "Paris"}}', "no opening brace"),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}}', "text after the JSON"),
    ],
)
def test_hermes_malformed_json_is_recovered_and_reported(body, problem):
    content, calls, recoveries = extract(hermes(), f"<tool_call>{body}</tool_call>")
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert args(calls[0])["city"].startswith("Par")
    assert recoveries and all(r.recovered and r.call_index == 0 for r in recoveries)
    assert any(problem in r.problem for r in recoveries)
    assert content == ""


def test_missing_end_tag_at_the_end_of_the_output_is_recovered_and_reported():
    content, calls, recoveries = extract(hermes(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}')
    assert [c.name for c in calls] == ["get_weather"]
    assert [r.problem for r in recoveries] == ["missing </tool_call> at the end of the output"]


def test_missing_end_tag_before_the_next_call():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}\n<tool_call>{"name": "get_weather", "arguments": {"city": "B"}}</tool_call>'
    _, calls, recoveries = extract(hermes(), text)
    assert [args(c)["city"] for c in calls] == ["A", "B"]
    assert recoveries[0].call_index == 0 and "before the next" in recoveries[0].problem


def test_unrecoverable_call_stays_as_content_and_is_reported():
    text = "Sure. <tool_call>get the weather please</tool_call>"
    content, calls, recoveries = extract(hermes(), text)
    assert calls == []
    assert content == text
    assert len(recoveries) == 1 and not recoveries[0].recovered and recoveries[0].call_index is None


def test_call_to_a_tool_not_offered_is_kept_and_reported():
    _, calls, recoveries = extract(hermes(), '<tool_call>{"name": "launch", "arguments": {}}</tool_call>')
    assert [c.name for c in calls] == ["launch"]
    assert "not among the tools" in recoveries[0].problem


def test_glm45_call_with_typed_values():
    text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    content, calls, recoveries = extract(glm(), text)
    # city is a string in the schema, so "123" stays a string; days is JSON
    assert [(c.name, args(c)) for c in calls] == [("get_weather", {"city": "123", "days": 3})]
    assert content == "" and recoveries == []


def test_glm45_unterminated_value_is_recovered_and_reported():
    _, calls, recoveries = extract(glm(), "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Paris")
    assert args(calls[0]) == {"city": "Paris"}
    problems = [r.problem for r in recoveries]
    assert "missing </tool_call> at the end of the output" in problems
    assert any("unterminated <arg_value>" in p for p in problems)


def test_glm45_without_a_name_is_kept_as_content():
    content, calls, recoveries = extract(glm(), "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>")
    assert calls == [] and "<tool_call>" in content and not recoveries[0].recovered


@pytest.mark.parametrize("parser_factory", [hermes, glm])
def test_streaming_in_any_split_gives_the_same_result(parser_factory):
    if parser_factory is hermes:
        text = 'Checking <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> done <tool_call>{"name": "get_weather"'
    else:
        text = "Checking <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call> done <tool_call>get_weather"
    whole = extract(parser_factory(), text)
    for step in (1, 2, 3, 7):
        extractor = ToolCallExtractor(parser_factory())
        content = "".join(extractor.feed(text[i : i + step]).content for i in range(0, len(text), step))
        content += extractor.finish().content
        assert (content, extractor.calls, extractor.recoveries) == whole


def test_streaming_holds_back_a_partial_start_tag_only():
    extractor = ToolCallExtractor(hermes())
    assert extractor.feed("Hello <tool").content == "Hello "
    assert extractor.feed("box>").content == "<toolbox>"


def test_lenient_json_gives_up_on_garbage():
    with pytest.raises(ValueError):
        parse_json_lenient("not json at all")


def test_detect_parser_from_chat_template():
    assert detect_parser("... <tool_call>{{ name }}<arg_key>{{ k }}</arg_key> ...") == "glm45"
    assert detect_parser("... <tool_call>\n{{ tool_call | tojson }} ...") == "hermes"
    assert detect_parser(None) == "hermes"


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'


@pytest.mark.parametrize("required", [True, False])
@pytest.mark.parametrize("parallel", [True, False])
def test_the_calls_grammar_takes_as_many_calls_as_the_request_allows(required, parallel):
    """Every tool_choice / parallel_tool_calls pair compiles (``TEXT? call+?`` did not: a strict tool under "auto"
    with parallel calls was a 400) and takes the outputs it should: content only when calls are optional, a
    second call only when parallel."""
    from tokenizers import Tokenizer

    from edge_infer.models.checkpoint import demo_model_dir

    tags_are_tokens = Tokenizer.from_file(str(demo_model_dir() / "tokenizer.json")).token_to_id("<tool_call>") is not None
    grammar = hermes_calls_grammar([{**WEATHER, "function": {**WEATHER["function"], "strict": True}}], required,
                                   parallel, tags_are_tokens)
    outputs = {"text": ("It is sunny.", not required), "one call": (CALL, True), "two calls": (CALL * 2, parallel),
               "text, then a call": ("Let me check.\n" + CALL, not required)}
    _check_outputs(grammar, outputs)
    # response_format's JSON beside the tools: the content is that JSON, or there are calls and no content
    content = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    grammar = hermes_calls_grammar([WEATHER], required, parallel, tags_are_tokens, content)
    outputs = {"the JSON": ('{"answer": "sunny"}', not required), "other JSON": ('{"reply": "sunny"}', False),
               "text": ("It is sunny.", False), "one call": (CALL, True), "two calls": (CALL * 2, parallel),
               "the JSON, then a call": ('{"answer": "sunny"}' + CALL, False)}
    _check_outputs(grammar, outputs)


def _check_outputs(grammar: str, outputs: dict[str, tuple[str, bool]]) -> None:
    """Each output is taken whole by ``grammar`` exactly when it is marked allowed."""
    from llguidance import LLMatcher
    from tokenizers import Tokenizer

    from edge_infer.engine.grammar import load_ll_tokenizer
    from edge_infer.models.checkpoint import demo_model_dir

    assert not LLMatcher.validate_grammar(grammar)
    tokenizer_file = demo_model_dir() / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ll_tokenizer = load_ll_tokenizer(tokenizer_file, tokenizer.get_vocab_size(), ())
    for name, (text, allowed) in outputs.items():
        matcher = LLMatcher(ll_tokenizer, grammar, log_level=0)
        taken = matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False).ids)
        assert (taken and matcher.is_accepting()) == allowed, (name, matcher.get_error())
