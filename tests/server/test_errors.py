"""End-to-end: every error status, in the OpenAI error shape, and none of them disturbs other requests."""
from __future__ import annotations

import gzip

import httpx
import openai
import pytest

from .serverutil import ServerProcess, wait_until

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Hello"}]
API_KEY = "test-key-123"


def post(server, path: str, body, **kw) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60, **kw)


def assert_error(r: httpx.Response, status: int, *fragments: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for fragment in fragments:
        assert fragment in error["message"]
    return error


def test_negative_max_tokens_is_400_naming_the_field(server):
    with pytest.raises(openai.BadRequestError) as exc:
        server.client().chat.completions.create(model=server.client().models.list().data[0].id, messages=HELLO, max_tokens=-1)
    assert exc.value.body["param"] == "max_tokens"
    assert exc.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({"messages": []}, "messages"),
        ({"messages": HELLO, "temperature": -1}, "temperature"),
        ({"messages": HELLO, "top_p": 0}, "top_p"),
        ({"messages": HELLO, "n": 0}, "n"),
        ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs needs logprobs"),
        ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "needs a json_schema object"),
        ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "Invalid type: strin"),
        ({"messages": HELLO, "guided_regex": "(", "guided_choice": ["a"]}, "at most one"),
        ({"messages": HELLO, "guided_regex": "(unclosed"}, "unclosed group"),
        ({"messages": HELLO, "logit_bias": {"one": 5}}, "token ids written as strings"),
        # found by a client probe: str.isdigit() took these, and int() then failed (a 500) or read "12"
        ({"messages": HELLO, "logit_bias": {"\u00b2": 5}}, "token ids written as strings"),
        ({"messages": HELLO, "logit_bias": {"9" * 5000: 5}}, "token ids written as strings"),
        ({"messages": HELLO, "logit_bias": {"\u0661\u0662": 5}}, "token ids written as strings"),
        ({"messages": HELLO, "logit_bias": {"1": 500}}, "logit_bias"),
        ({"messages": HELLO, "logit_bias": {"99999999": 5}}, "outside the vocabulary"),
        ({"messages": HELLO, "tool_choice": "required"}, "no tools"),
        ({"messages": "hello"}, "messages"),
    ],
)
def test_invalid_chat_parameters_are_400_not_422(server, body, fragment):
    error = assert_error(post(server, "/v1/chat/completions", body), 400, fragment)
    assert error["code"] is not None  # a logit_bias id outside the vocabulary had none


@pytest.mark.parametrize("body, message", [
    # found by a client probe: "stop.constrained-str: Input should be a valid string; stop: List should have ..."
    ({"stop": ["a"] * 17}, "stop: List should have at most 16 items after validation, not 17"),
    ({"messages": [{"role": "user", "content": None}]},
     "messages.0.user.content: Input should be a valid string or a valid list"),
    # a field's own type error went missing beside a bad union elsewhere in the body
    ({"temperature": "x", "stop": 5}, "temperature: Input should be a valid number; stop: Input should be a valid "
                                      "string or a valid list"),
    ({"stop": ""}, "stop: String should have at least 1 character"),
    ({"tool_choice": "bogus"}, "tool_choice: Input should be 'none', 'auto' or 'required'"),
    ({"tool_choice": {"type": "function"}}, "tool_choice: Input should be 'none', 'auto' or 'required'; "
                                            "tool_choice.function: Field required"),
])
def test_a_union_field_is_named_once_in_the_users_terms(server, body, message):
    error = assert_error(post(server, "/v1/chat/completions", {"messages": HELLO, **body}), 400)
    assert error["message"] == message


BOGUS_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}


@pytest.mark.parametrize("body, param, says", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format", "Invalid type: nonsense"),
    ({"guided_regex": "(unclosed"}, "guided_regex", "unclosed group"),
    # beside tools, response_format's schema goes into the calls' grammar: it was blamed on the tools
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
      "tools": [{"type": "function", "function": {"name": "g"}}]}, "response_format", "Invalid type: nonsense"),
    # the calls' grammar quoted llguidance's whole grammar text back (444 characters of it)
    ({"tools": [{"type": "function", "function": {"name": "g"}}, BOGUS_TOOL], "tool_choice": "required"},
     "tools[1].function.parameters", "tools[1].function.parameters is not a JSON Schema the arguments can be held "
                                     "to: Invalid type: bogus"),
])
def test_an_unusable_output_spec_names_its_field(server, body, param, says):
    error = assert_error(post(server, "/v1/chat/completions", {"messages": HELLO, **body}), 400, says)
    assert error["param"] == param and error["code"] == "invalid_parameter"
    assert "%json" not in error["message"]


def test_an_unknown_route_or_method_is_named_and_health_answers_head(server):
    """Starlette's bare "Not Found" and "Method Not Allowed" told a client pointed at /v1/embeddings nothing;
    load balancers' HEAD health checks got 405."""
    error = assert_error(post(server, "/v1/embeddings", {"input": "hi"}), 404, "/v1/embeddings is not served here",
                         "/v1/chat/completions")
    assert error["code"] == "unknown_route"
    r = httpx.put(server.base_url + "/v1/chat/completions", json={}, timeout=10)
    assert assert_error(r, 405, "/v1/chat/completions takes POST, not PUT")["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    assert httpx.head(server.base_url + "/health", timeout=10).status_code == 200
    assert list(httpx.get(server.base_url + "/openapi.json").json()["paths"]["/health"]) == ["get"]  # one operation


def test_unknown_model_is_404_model_not_found_as_openai_answers(server):
    error = assert_error(post(server, "/v1/chat/completions", {"model": "gpt-9", "messages": HELLO}), 404, "gpt-9")
    assert error["code"] == "model_not_found" and error["param"] == "model"
    client = server.client()
    served = client.models.list().data[0].id
    assert client.models.retrieve(served).id == served
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_prompt_plus_max_tokens_over_max_model_len_names_both_numbers(server):
    r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 5000})
    assert assert_error(r, 400, "5000", "max_model_len (512)")["code"] == "context_length_exceeded"


@pytest.mark.parametrize("prompt", ["Hello " * 600, "x" * 10**6])  # too many tokens; too many characters to tokenize
def test_a_context_overflow_is_the_one_langchain_knows(server, prompt):
    """OpenAI's code for it, on which langchain-openai raises its ContextOverflowError (what trimming code catches)."""
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=server.base_url + "/v1", api_key="none", model=server.client().models.list().data[0].id,
                      max_retries=0)
    with pytest.raises(ContextOverflowError):
        chat.invoke(prompt)


def test_token_ids_beyond_the_vocabulary_are_400(server):
    assert_error(post(server, "/v1/completions", {"prompt": [1, 10**6]}), 400, "vocabulary")


def test_malformed_json_and_unknown_routes(server):
    r = httpx.post(server.base_url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400)
    assert_error(httpx.get(server.base_url + "/v1/nothing-here"), 404)
    assert_error(httpx.get(server.base_url + "/v1/chat/completions"), 405)


def test_bad_requests_leave_the_server_serving(server):
    assert post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2}).status_code == 200


@pytest.fixture(scope="module")
def guarded(served_model):
    """One sequence at a time, no queue, an API key."""
    with ServerProcess(served_model, "--max-num-seqs", "1", "--max-queue", "0", "--max-model-len", "512", api_key=API_KEY) as proc:
        yield proc


def test_missing_or_wrong_api_key_is_401(guarded):
    assert_error(post(guarded, "/v1/chat/completions", {"messages": HELLO}), 401, "API key")
    with pytest.raises(openai.AuthenticationError):
        guarded.client(api_key="wrong").models.list()
    assert guarded.client().models.list().data  # the right key works
    assert httpx.get(guarded.base_url + "/health").status_code == 200  # health and metrics need no key
    # Before any body is read: a keyless client's 10 MB body, a form or a gzip body is a 401 (the body was read
    # and parsed first, spending the budget of bodies in flight), and the header's scheme is Bearer's, any case.
    for headers, body in (({}, b"[" * 10_000_000), ({"Content-Type": "text/plain"}, b"x"),
                          ({"Content-Encoding": "gzip"}, b"x"), ({"Authorization": "Basic " + API_KEY}, b"{}")):
        refused = httpx.post(guarded.base_url + "/v1/completions", content=body, headers=headers, timeout=60)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", refused.text
    lower = httpx.get(guarded.base_url + "/v1/models", headers={"Authorization": f"bearer {API_KEY}"})
    assert lower.status_code == 200


def test_full_admission_queue_is_429_with_retry_after(guarded):
    from concurrent.futures import ThreadPoolExecutor

    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"messages": HELLO, "max_tokens": 400, "ignore_eos": True}
    with ThreadPoolExecutor(6) as pool:  # six at once against one slot: the first is served, the others refused
        responses = list(pool.map(lambda _: post(guarded, "/v1/chat/completions", body, headers=headers), range(6)))
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) == {200, 429}, statuses
    for r in responses:
        if r.status_code == 429:
            assert_error(r, 429, "queue")
            assert int(r.headers["Retry-After"]) >= 1
    assert f"edge_infer_admission_rejections_total {statuses.count(429)}.0" in httpx.get(guarded.base_url + "/metrics").text


@pytest.mark.parametrize("headers, body, status, says", [
    ({"Content-Type": "text/plain"}, b'{"prompt": "hi"}', 415, "Content-Type: application/json"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, b"prompt=hi", 415, "Content-Type: application/json"),
    ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, gzip.compress(b'{"prompt": "hi"}', mtime=0), 415,
     "uncompressed"),
    ({"Content-Type": "application/json", "Content-Encoding": "br"}, b'{"prompt": "hi"}', 415, "uncompressed"),
    ({"Content-Type": "application/json"}, b'{"prompt": "\xff\xfe"}', 400, "not UTF-8"),
    ({"Content-Type": "application/json"}, b"", 400, "body is empty"),
    ({}, b'{"prompt": "Hello", "max_tokens": 2}', 200, ""),  # no type at all (requests' data=): read as JSON
    ({"Content-Type": "Application/JSON; charset=UTF-8"}, b'{"prompt": "Hello", "max_tokens": 2}', 200, ""),
], ids=["text", "form", "gzip", "br", "not-utf8", "empty", "no-type", "json-charset"])  # the same on every xdist worker
def test_a_body_the_server_cannot_read_says_what_to_send(server, headers, body, status, says):
    """Found by a client probe: a form, a gzip body and invalid UTF-8 got "Input should be a valid dictionary" or
    "There was an error parsing the body" (and a br-encoded body was read as plain)."""
    r = httpx.post(server.base_url + "/v1/completions", content=body, headers=headers, timeout=30)
    assert r.status_code == status, r.text
    if status != 200:
        error = r.json()["error"]
        assert says in error["message"] and error["type"] == "invalid_request_error", r.text
    assert post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2}).status_code == 200


def test_two_tools_of_one_name_are_refused(server):
    tool = {"type": "function", "function": {"name": "f"}}
    assert_error(post(server, "/v1/chat/completions", {"messages": HELLO, "tools": [tool, tool]}), 400, "named 'f'")
