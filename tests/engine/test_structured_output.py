"""Structured output through the offline API: what the grammar admits is what comes out, on the trained demo
model and on a random checkpoint, sampled as well as greedy; bad specs are refused before decoding."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_infer import LLM, SamplingParams, StructuredOutputsParams
from edge_infer.engine.grammar import CheckedGrammar, compile_grammar, grammar_text
from edge_infer.engine.protocol import GRAMMAR_DEAD_END, GRAMMAR_LIMIT
from edge_infer.errors import InvalidRequestError

ASK = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]


@pytest.fixture(scope="module", params=["demo", "random"])
def llm(request, demo_model, tiny_model):
    model = demo_model if request.param == "demo" else tiny_model
    with LLM(model, max_model_len=512, max_num_seqs=4, worker="thread") as engine:
        yield engine


def generate(llm, spec: StructuredOutputsParams, n: int = 1, **params) -> list:
    params = {"temperature": 1.0, "seed": 7, "max_tokens": 400, **params}
    out = llm.chat(ASK, SamplingParams(n=n, structured_outputs=spec, **params))[0]
    return out.outputs


# Schemas whose documents are bounded (strings, arrays and numbers have limits), so a complete document always
# fits max_tokens and every sample must end with "stop" and validate.
_names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
_leaves = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-1000, 1000), st.integers(0, 5000)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
    st.builds(lambda n: {"type": "string", "minLength": 1, "maxLength": n, "pattern": "^[a-z]+$"}, st.integers(1, 6)),
    st.lists(st.text(alphabet="xyz é\"", min_size=1, max_size=4), min_size=1, max_size=3, unique=True).map(
        lambda vs: {"enum": vs}),
    st.integers(-9, 9).map(lambda v: {"const": v}),
)


def _object(children):
    def build(props, data):
        names = list(props)
        required = data.draw(st.lists(st.sampled_from(names), unique=True)) if names else []
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}

    return st.builds(build, st.dictionaries(_names, children, max_size=3), st.data())


_schemas = st.recursive(
    _leaves,
    lambda children: st.one_of(
        _object(children),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(0, 3)),
    ),
    max_leaves=4,
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_object(_schemas), seed=st.integers(0, 2**31))
def test_sampled_outputs_always_validate_against_generated_schemas(llm, schema, seed):
    for out in generate(llm, StructuredOutputsParams(json=schema), n=2, seed=seed):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)


def test_objects_with_properties_are_closed_unless_the_schema_opens_them(llm):
    listed = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}
    for out in generate(llm, StructuredOutputsParams(json=listed), n=3):
        assert list(json.loads(out.text)) == ["a"]
    # keys by pattern, and no word on others: the object stays open to any key. Other keys are strings of any
    # length, so a sample may run to max_tokens (the trained demo model often writes a sentence as a key, more
    # so the colder it samples); of 16 at temperature 0.5, some complete (a quarter, on the demo model), and
    # what completes matches the schema.
    opened = {**listed, "patternProperties": {"^x[0-9]$": {"type": "boolean"}}, "maxProperties": 3}
    keys = set()
    for out in generate(llm, StructuredOutputsParams(json=opened), n=16, temperature=0.5, max_tokens=60):
        if out.finish_reason == "stop":
            value = json.loads(out.text)
            jsonschema.validate(value, opened)
            keys |= set(value)
    assert "a" in keys


def test_json_object_regex_choice_and_grammars_shape_the_output(llm):
    [obj] = generate(llm, StructuredOutputsParams(json_object=True), temperature=0, max_tokens=200)
    assert obj.finish_reason != "stop" or isinstance(json.loads(obj.text), dict)
    assert obj.text.startswith("{")
    for out in generate(llm, StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,4}"), n=3):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", out.text) and out.finish_reason == "stop"
    choices = ["wifi on", "wifi off", 'say "hi"\n', "中文"]
    seen = {out.text for out in generate(llm, StructuredOutputsParams(choice=choices), n=8)}
    assert seen <= set(choices) and len(seen) > 1
    gbnf = 'root ::= "set " item " " ("on" | "off")\nitem ::= "wifi" | "airplane"'
    for out in generate(llm, StructuredOutputsParams(grammar=gbnf), n=3):
        assert re.fullmatch(r"set (wifi|airplane) (on|off)", out.text), out.text
    lark = 'start: "level=" /[1-5]/'
    assert {o.text for o in generate(llm, StructuredOutputsParams(grammar=lark), n=3)} <= {f"level={i}" for i in range(1, 6)}


def test_greedy_structured_output_is_reproducible_and_logprobs_stay_the_models(llm):
    spec = StructuredOutputsParams(choice=["alpha", "beta"])
    a = generate(llm, spec, temperature=0, logprobs=2)[0]
    b = generate(llm, spec, temperature=0, logprobs=2)[0]
    assert a.text == b.text and a.text in ("alpha", "beta")
    # logprobs are of the raw distribution: the grammar's mask does not renormalise them
    assert all(lp.logprob <= 0 for step in a.logprobs for lp in step.values())


@pytest.mark.parametrize(
    "spec, fragment",
    [
        (dict(json={"type": "strin"}), "strin"),
        (dict(json={"type": "object", "properties": 5}), "properties"),
        (dict(json={"type": "integer", "minimum": 5, "maximum": 2}), "minimum (5) is greater than maximum (2)"),
        (dict(json="{not json"), "not valid JSON"),
        (dict(regex="(unclosed"), "unclosed group"),
        (dict(grammar="start: missing_rule"), "missing_rule"),
        (dict(grammar='root ::= "a" ( "b"'), "GBNF"),
    ],
)
def test_unusable_specs_are_refused_before_decoding_naming_the_problem(llm, spec, fragment):
    with pytest.raises(InvalidRequestError, match=re.escape(fragment)):
        llm.chat(ASK, SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(**spec)))


def test_a_spec_takes_exactly_one_constraint():
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(InvalidRequestError, match="exactly one"):
        StructuredOutputsParams()


def test_a_complete_grammar_ends_the_request_even_before_min_tokens(llm):
    [out] = generate(llm, StructuredOutputsParams(choice=["done"]), min_tokens=20)
    assert out.text == "done" and out.finish_reason == "stop"


def test_logit_bias_bans_and_forces_tokens(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    base = llm.generate("The weather in Paris is", greedy)[0].outputs[0].token_ids
    banned = llm.generate("The weather in Paris is", greedy.clone(logit_bias={base[0]: -100}))[0].outputs[0].token_ids
    assert banned[0] != base[0] and base[0] not in banned
    forced_id = llm.get_tokenizer().encode("!", add_special_tokens=False)[0]
    forced = llm.generate("The weather in Paris is", greedy.clone(logit_bias={forced_id: 100}))[0].outputs[0].token_ids
    assert forced == [forced_id] * 6
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate("Hi", greedy.clone(logit_bias={10**7: 1}))
    with pytest.raises(InvalidRequestError, match=r"\[-100, 100\]"):
        SamplingParams(logit_bias={1: 101})


def test_a_grammar_that_cannot_be_completed_ends_with_a_dead_end_not_a_hang(llm):
    """After "x" the grammar wants a character that is both a digit and a letter: no token can follow."""
    spec = StructuredOutputsParams(grammar='start: "x" A\nA: /[0-9]/ & /[a-z]/')
    for out in generate(llm, spec, n=2, max_tokens=50):
        assert out.finish_reason == GRAMMAR_DEAD_END and out.text == "x"
    [empty] = generate(llm, StructuredOutputsParams(grammar="start: A\nA: /a+/ & /b+/"))
    assert empty.finish_reason == GRAMMAR_DEAD_END and empty.token_ids == []


def _objects(n: int) -> dict:
    return {"anyOf": [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(n)]}


def test_a_spec_beyond_llguidance_s_parser_limits_is_refused_naming_the_limit():
    """3,000 object alternatives passed the check (validate_grammar, a matcher, its first mask) and ended the request
    after its first token with grammar_dead_end: llguidance's max_items_in_row (2,000) is met only on the "{"."""
    compile_grammar(StructuredOutputsParams(json=_objects(2000)))
    compile_grammar(StructuredOutputsParams(json={"enum": [f"v{i}" for i in range(3000)]}))  # one lexeme: no limit
    for schema in (_objects(2001), {"type": "object", "properties": {"x": _objects(2001)}, "required": ["x"]}):
        with pytest.raises(InvalidRequestError,
                           match=r"parser limits \(Parser Error: Current row has 200[12] items; max is 2000.*at most 2,000"):
            compile_grammar(StructuredOutputsParams(json=schema))


def test_a_parser_limit_met_mid_output_ends_it_as_grammar_limit_with_its_text(llm):
    """Off the check's walk (or in a right-recursive rule 2,000 items deep, which no walk can reach) the output ends
    as a dead end does, its text kept, under a reason of its own (the server's log says which limit)."""
    unchecked = CheckedGrammar(grammar=grammar_text(StructuredOutputsParams(json=_objects(3000))))  # past the check
    out = llm.chat(ASK, SamplingParams(max_tokens=20, structured_outputs=unchecked))[0]
    assert out.outputs[0].finish_reason == GRAMMAR_LIMIT and out.error is None
    assert out.outputs[0].text == llm.get_tokenizer().decode(out.outputs[0].token_ids)


def test_thousands_of_choices_are_one_lexeme(llm):
    choices = [f"c{i}" for i in range(3000)]
    for out in generate(llm, StructuredOutputsParams(choice=choices), n=2, max_tokens=20):
        assert out.finish_reason == "stop" and out.text in choices


def test_a_checked_grammar_is_not_checked_again(monkeypatch):
    """The server checks a request's spec once, on its preparation thread (server/generation.build_params): a large
    schema took seconds per check, on the event loop, once per sample (n), stalling every stream meanwhile."""
    import llguidance

    from edge_infer.engine.grammar import checked_grammar, compile_grammar

    checks = []
    validate = llguidance.LLMatcher.validate_grammar
    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar", lambda g: checks.append(g) or validate(g))
    spec = checked_grammar(StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}))
    assert len(checks) == 1
    assert compile_grammar(spec) == spec.grammar and len(checks) == 1
    with pytest.raises(InvalidRequestError, match="not usable"):  # and a bad one is refused by the first check
        checked_grammar(StructuredOutputsParams(grammar="start: (((("))


def test_a_deep_schema_is_walked_once_a_level(monkeypatch):
    """closed_objects walked each object's properties twice, 2**depth walks in all: 45 levels of nested objects
    held the preparation thread for minutes (found by a review)."""
    from edge_infer.engine import grammar

    calls = []
    walk = grammar._closed
    monkeypatch.setattr(grammar, "_closed", lambda schema: calls.append(1) or walk(schema))
    schema = {"type": "string"}
    for _ in range(45):
        schema = {"type": "object", "properties": {"a": schema}}
    closed = grammar.closed_objects(schema)
    assert len(calls) < 10 * 45  # a few walks a level
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
