"""Tool-call extraction: each source in its order of precedence, with the repairs reported."""
from __future__ import annotations

import pytest

from edge_infer.agent.actions import TOOLS
from edge_infer.agent.chat import Reply
from edge_infer.agent.tool_parse import extract_tool_call, visible_text


def parse(content: str = "", calls=(), recoveries=()):
    return extract_tool_call(Reply(content, list(calls), list(recoveries)), TOOLS)


def test_the_servers_parsed_call_comes_first_with_its_repairs():
    call = parse("<tool_call>{\"name\": \"swipe\"}</tool_call>", [("tap", '{"index": 3}')],
                 ["missing </tool_call> at the end of the output: ended the call there"])
    assert (call.name, call.args, call.source) == ("tap", {"index": 3}, "tool_calls")
    assert call.repairs == ["missing </tool_call> at the end of the output: ended the call there"]


def test_several_server_calls_run_the_first_and_say_so():
    call = parse("", [("tap", '{"index": 1}'), ("tap", '{"index": 2}')])
    assert call.args == {"index": 1} and call.repairs == ["the reply made 2 calls; ran the first"]


def test_broken_server_arguments_are_repaired_or_fall_through_to_the_text():
    call = parse("", [("tap", '{"index": 3')])
    assert call.source == "tool_calls" and call.args == {"index": 3} and "unterminated JSON" in call.repairs[0]
    fallback = parse('{"name": "press_key", "arguments": {"key": "back"}}', [("tap", "not json")])
    assert (fallback.source, fallback.name) == ("bare_json", "press_key")


def test_glm45_blocks():
    call = parse("<tool_call>type_text\n<arg_key>index</arg_key>\n<arg_value>2</arg_value>\n"
                 "<arg_key>text</arg_key>\n<arg_value>30</arg_value>\n</tool_call>")
    # The schema says text is a string, so "30" stays one; index is read as JSON.
    assert (call.name, call.args, call.source, call.repairs) == ("type_text", {"index": 2, "text": "30"}, "glm_block", [])
    bare = parse("<tool_call>task_complete</tool_call>")
    assert (bare.name, bare.args, bare.source) == ("task_complete", {}, "glm_block")


def test_bracketed_calls_with_repaired_braces():
    call = parse('Opening it.\n<tool_call>\n{"name": "open_app", "arguments": {"name": "Clock"}\n</tool_call>')
    assert (call.name, call.args, call.source) == ("open_app", {"name": "Clock"}, "bracketed")
    assert call.repairs == ["unterminated JSON (missing '}'): appended '}'"]
    cut = parse('<tool_call>{"name": "tap", "arguments": {"index": 4')
    assert cut.args == {"index": 4}
    assert cut.repairs[0] == "missing </tool_call>: took the text to the end" and "unterminated JSON" in cut.repairs[1]


def test_bare_json_with_prose_and_string_arguments():
    call = parse('I will tap it: {"name": "tap", "arguments": "{\\"index\\": 5}"}')
    assert (call.name, call.args, call.source) == ("tap", {"index": 5}, "bare_json")
    assert call.repairs == ["text before the JSON: 'I will tap it:': ignored it"]
    assert parse('{"name": "swipe", "parameters": {"direction": "up"}}').args == {"direction": "up"}


@pytest.mark.parametrize("content", [
    "",
    "I think Wi-Fi is already on.",
    '{"index": 3}',  # JSON without a name is not a call
    '{"name": "tap", "arguments": [1]}',
    "<tool_call>not a call at all, just words</tool_call>",
    "<think>tap(3) would do it</think>",
])
def test_no_call(content):
    call = parse(content)
    assert (call.name, call.args, call.source) == ("", {}, "none")


def test_reasoning_is_not_read_as_a_call():
    call = parse('<think>maybe {"name": "swipe", "arguments": {"direction": "up"}}</think>\n'
                 '{"name": "tap", "arguments": {"index": 1}}')
    assert (call.name, call.source) == ("tap", "bare_json")
    assert visible_text("<think>unfinished reasoning") == ""


def test_call_keys_identify_actions():
    assert parse("", [("tap", '{"index": 1}')]).key == parse('{"name": "tap", "arguments": {"index": 1}}').key
    assert parse("", [("tap", '{"index": 1}')]).key != parse("", [("tap", '{"index": 2}')]).key
