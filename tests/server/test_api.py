"""End-to-end: the real server process driven by the official openai client."""
from __future__ import annotations

import json

import httpx
import pytest

from .conftest import SPECIALS
from .serverutil import ServerProcess

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "What is the weather like in Paris?"}]


def model_name(server) -> str:
    return server.client().models.list().data[0].id


def test_model_list(server, served_model):
    models = server.client().models.list().data
    assert [m.id for m in models] == [served_model.name]
    assert models[0].max_model_len == 512
    runtime = models[0].runtime  # what it runs on here: the plan's dtype and the kernel of each linear kind
    assert runtime["cpu_isa"].split()[0] in ("x86_64", "aarch64") and runtime["dtype"] in ("bfloat16", "float32")
    assert set(runtime["kernels"]) == {"decoder linears", "output head", "embedding lookup"}


def test_chat_stream_equals_non_stream_at_temperature_0(server, tokenizer):
    client = server.client()
    full = client.chat.completions.create(model=model_name(server), messages=HELLO, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(
        model=model_name(server), messages=HELLO, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [full.choices[0].finish_reason]
    # usage: the prompt as the chat template renders it, every generated token counted
    prompt_tokens = len(tokenizer.encode_chat(HELLO)[1])
    assert full.usage.prompt_tokens == prompt_tokens
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(chunks[-1].usage, k) for k in counts] == [getattr(full.usage, k) for k in counts]
    # the second request found the first one's full prompt blocks cached
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (prompt_tokens - 1) // 16 * 16
    assert full.usage.total_tokens == prompt_tokens + full.usage.completion_tokens


def test_streamed_logprobs_equal_the_whole_response_s_with_several_choices(server):
    """A stream sends each token's logprobs once and lets them go (generation.Sample.take_logprobs): the choices'
    events interleave, and each chunk still carries its own tokens' logprobs."""
    client = server.client()
    args = dict(model=model_name(server), messages=HELLO, max_tokens=12, temperature=1.0, seed=5, n=3, logprobs=True,
                top_logprobs=2, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    streamed = {i: [] for i in range(3)}
    for c in client.chat.completions.create(stream=True, **args):
        for choice in c.choices:
            streamed[choice.index] += choice.logprobs.content if choice.logprobs else []
    for choice in whole.choices:
        got, want = streamed[choice.index], choice.logprobs.content
        assert [(t.token, [a.token for a in t.top_logprobs]) for t in got] == \
            [(t.token, [a.token for a in t.top_logprobs]) for t in want] and len(got) == 12
        # another batch composition: the same values up to the order of fp32 sums
        assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(got, want))


def test_stream_ends_with_done(server):
    body = {"messages": HELLO, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_completion_counts_tokens_and_stops_at_length(server, tokenizer):
    out = server.client().completions.create(
        model=model_name(server), prompt="The weather in Berlin", max_tokens=7, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens == len(tokenizer.encode("The weather in Berlin"))


def test_completion_batch_of_prompts_with_n(server):
    out = server.client().completions.create(
        model=model_name(server), prompt=[[72, 101, 108], [87, 104]], n=2, max_tokens=3, seed=1, temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert [c.finish_reason for c in out.choices] == ["length"] * 4
    assert out.usage.completion_tokens == 12


def sampled(server, **kw) -> list[str]:
    params = dict(model=model_name(server), messages=HELLO, max_tokens=30, temperature=1.0, seed=1234,
                  extra_body={"ignore_eos": True})
    params.update(kw)
    out = server.client().chat.completions.create(**params)
    return [c.message.content for c in sorted(out.choices, key=lambda c: c.index)]


def test_seed_reproduces_the_output(server):
    assert sampled(server) == sampled(server)


def test_n_samples_with_a_seed_are_reproducible(server):
    first = sampled(server, n=3)
    assert len(first) == 3
    assert sampled(server, n=3) == first
    assert first[0] == sampled(server)[0]  # sample 0 of n uses the request's seed itself


def test_stop_string_ends_the_output_before_it(server):
    text = sampled(server)[0]
    stop = next(text[i : i + 2] for i in range(5, len(text) - 2) if text[i : i + 2].strip())
    out = server.client().chat.completions.create(
        model=model_name(server), messages=HELLO, max_tokens=30, temperature=1.0, seed=1234, stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].message.content == text[: text.index(stop)]
    assert out.choices[0].finish_reason == "stop"


def test_chat_logprobs(server):
    out = server.client().chat.completions.create(
        model=model_name(server), messages=HELLO, max_tokens=5, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-4  # the best alternative is at least as likely


def test_completion_logprobs(server):
    # Greedy: a sampled reply may split a character's UTF-8 bytes between two tokens, and each token's own
    # decode then reads U+FFFD where the text holds the character once (the tokens' text_offset and chat's
    # bytes place them: test_logprobs_place_the_tokens_of_a_character_split_between_them).
    out = server.client().completions.create(model=model_name(server), prompt="Hello", max_tokens=4, logprobs=2,
                                             temperature=0, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    # logprobs name special tokens too (ignore_eos may sample one); the text skips them
    assert "".join(t for t in lp.tokens if t not in SPECIALS) == out.choices[0].text


PROMPT = "What is the weather like in Berlin?"
SPLIT = "Grüße aus 東京 🦜"  # the test vocabulary spells each non-ASCII character in byte tokens


def test_logprobs_place_the_tokens_of_a_character_split_between_them(server, tokenizer):
    """Each such token's own text reads U+FFFD: chat logprobs carry its bytes (as OpenAI's do), and a completion's
    text_offset puts it where its character begins in the text."""
    client, name = server.client(), model_name(server)
    chat = client.chat.completions.create(model=name, messages=HELLO, max_tokens=40, logprobs=True, top_logprobs=2,
                                          extra_body={"guided_choice": [SPLIT]})
    entries = chat.choices[0].logprobs.content
    assert chat.choices[0].message.content == SPLIT and sum(e.token == "\ufffd" for e in entries) >= 4
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8") == SPLIT
    assert all(len(t.bytes) >= 1 for e in entries for t in e.top_logprobs)

    ids = tokenizer.encode(SPLIT)
    for stream in (False, True):
        out = client.completions.create(model=name, prompt=SPLIT, max_tokens=0, echo=True, logprobs=1, stream=stream)
        lp = out.choices[0].logprobs if not stream else next(c.choices[0].logprobs for c in out if c.choices[0].logprobs)
        # A token begins at the characters completed before it (an incomplete one is not yet counted).
        starts = [len(b"".join(map(tokenizer.token_bytes, ids[:i])).decode("utf-8", errors="ignore")) for i in range(len(ids))]
        assert lp.text_offset == starts
        assert {SPLIT[o] for t, o in zip(lp.tokens, lp.text_offset) if t == "\ufffd"} == {"ü", "ß", "東", "京", "🦜"}


def test_echo_with_logprobs_scores_the_prompt_as_evaluators_ask(server, tokenizer, served_model):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs, nothing generated."""
    import torch
    from transformers import AutoModelForCausalLM

    out = server.client().completions.create(model=model_name(server), prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    choice, ids = out.choices[0], tokenizer.encode(PROMPT)
    lp = choice.logprobs
    assert choice.text == PROMPT and "".join(lp.tokens) == PROMPT and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(ids)
    # The model's scores: what transformers computes for the same tokens (the server runs fp32).
    model = AutoModelForCausalLM.from_pretrained(served_model, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0], dim=-1)
    expected = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=1e-3)
    for i, top in enumerate(lp.top_logprobs[1:]):
        # keyed by token text, as in OpenAI's format: two byte tokens shown as U+FFFD share a key (the likelier kept)
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(ref[i].max().item(), abs=1e-3)


def test_an_echoed_prompts_offsets_leave_out_the_bos_the_tokenizer_added(tmp_path):
    """Llama 3's tokenizer puts <|begin_of_text|> before a prompt; the echo is the text as sent, without it."""
    from edge_infer.models.synth import write_checkpoint

    model = write_checkpoint(tmp_path / "llama", "llama", "tiny", dtype="float32")
    with ServerProcess(model, "--max-model-len", "128") as proc:
        client, name = proc.client(), model_name(proc)
        for stream in (False, True):
            out = client.completions.create(model=name, prompt=SPLIT, max_tokens=2, echo=True, logprobs=1,
                                            temperature=0, stream=stream, extra_body={"ignore_eos": True})
            chunks = list(out) if stream else [out]
            text = "".join(c.choices[0].text for c in chunks)
            lp = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
            tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
            assert tokens[0] == "<|begin_of_text|>" and lp[:2] == [0, 0]  # the BOS covers nothing
            assert lp == sorted(lp) and lp[-2] == len(SPLIT) <= lp[-1] <= len(text)  # the generated tokens
            assert {SPLIT[o] for t, o in zip(tokens, lp) if t == "\ufffd"} <= set("üß東京🦜")


def test_echo_with_logprobs_then_generated_tokens_streamed_and_not(server):
    client, name = server.client(), model_name(server)
    args = dict(model=name, prompt=PROMPT, max_tokens=3, echo=True, logprobs=1, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0]
    assert whole.text.startswith(PROMPT) and "".join(whole.logprobs.tokens) == whole.text
    assert len(whole.logprobs.tokens) == len(whole.logprobs.token_logprobs)
    assert all(v <= 0 for v in whole.logprobs.token_logprobs[1:])
    chunks = list(client.completions.create(stream=True, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    logprobs = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert text == whole.text and [t for lp in logprobs for t in lp.tokens] == whole.logprobs.tokens
    assert [o for lp in logprobs for o in lp.text_offset] == whole.logprobs.text_offset
    assert whole.logprobs.text_offset[len(whole.logprobs.tokens) - 3] == len(PROMPT)  # the first generated token


def test_a_resent_conversation_reuses_its_cached_prefix(server):
    """Chat clients resend the whole history: the second request computes only what is new."""
    client, name = server.client(), model_name(server)
    history = [{"role": "system", "content": "You are a weather assistant. " * 6}, *HELLO]
    first = client.chat.completions.create(model=name, messages=history, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=name, messages=history, max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < again.usage.prompt_tokens
    assert again.choices[0].message.content == first.choices[0].message.content
    metrics = httpx.get(f"{server.base_url}/metrics").text
    hits = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("edge_infer_prefix_cache_hit_tokens"))
    assert hits >= cached


def test_json_object_response_format_is_enforced_and_the_result_reported(server):
    out = server.client().chat.completions.create(
        model=model_name(server), messages=HELLO, max_tokens=5, response_format={"type": "json_object"},
    )
    report = out.choices[0].model_extra["edge_infer"]["response_format"]
    assert report["type"] == "json_object" and out.choices[0].message.content.startswith("{")
    assert report["valid"] == _is_json_object(out.choices[0].message.content)
    assert report["valid"] or (report["error"] and out.choices[0].finish_reason == "length")


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (TypeError, json.JSONDecodeError):
        return False


def test_tools_are_accepted_and_the_response_is_well_formed(server):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    out = server.client().chat.completions.create(model=model_name(server), messages=HELLO, tools=tools, max_tokens=8)
    choice = out.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)


def test_a_temperature_past_fp32s_range_is_served_and_an_infinite_one_refused(server):
    """The fuzz test's 500: a guided choice at temperature 1.18e308 (finite in JSON, inf in fp32) made the sampler
    divide a masked token's -inf by inf. It is served now, one of the choices; 1e999 (inf once parsed) is a 400
    naming the field."""
    body = {"model": model_name(server), "prompt": "Hello", "max_tokens": 3, "guided_choice": ["Z", "yes"]}
    ok = httpx.post(f"{server.base_url}/v1/completions", json={**body, "temperature": 1.178422569620432e308}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] in ("Z", "yes")
    raw = json.dumps(body)[:-1] + ', "temperature": 1e999}'
    refused = httpx.post(f"{server.base_url}/v1/completions", content=raw, timeout=60,
                         headers={"Content-Type": "application/json"})
    assert refused.status_code == 400 and "temperature" in refused.text, refused.text
    assert server.client().models.list().data  # still serving


def test_vllm_s_sampling_extras(server, tokenizer):
    """stop_token_ids, min_tokens, include_stop_str_in_output and skip_special_tokens, as vLLM takes them (they were
    ignored, found by a client probe), each shown on a token logit_bias forces."""
    client = server.client()
    [weather] = tokenizer.encode(" weather", add_special_tokens=False)
    end, pad = (tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>"))
    body = dict(model=model_name(server), prompt="The", max_tokens=6, temperature=0)

    def complete(**extra):
        return client.completions.create(**body, **extra).choices[0]

    forced = {"logit_bias": {str(weather): 100}}
    assert complete(extra_body=forced).text == " weather" * 6
    stopped = complete(extra_body={**forced, "stop_token_ids": [weather]})
    assert stopped.text == " weather" and stopped.finish_reason == "stop"  # kept, as vLLM keeps a stop token not special
    assert complete(stop=["weather"], extra_body=forced).text == " "
    assert complete(stop=["weather"], extra_body={**forced, "include_stop_str_in_output": True}).text == " weather"
    ending = {"logit_bias": {str(end): 100}}
    assert client.completions.create(**body, extra_body=ending).usage.completion_tokens == 1  # the end, at once
    held = client.completions.create(**body, extra_body={**ending, "min_tokens": 4})
    assert held.usage.completion_tokens == 5 and held.choices[0].finish_reason == "stop"
    special = {"logit_bias": {str(pad): 100}}
    assert complete(extra_body=special).text == ""
    assert complete(extra_body={**special, "skip_special_tokens": False}).text == "<|endoftext|>" * 6


def test_structured_outputs_and_response_format_on_completions(server):
    """vLLM's newer structured_outputs object, and response_format on /v1/completions (both were ignored)."""
    client = server.client()
    body = dict(model=model_name(server), prompt="Answer:", max_tokens=30, temperature=1.0, n=3, seed=3)
    out = client.completions.create(**body, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert {c.text for c in out.choices} <= {"yes", "no"}
    schema = {"type": "object", "properties": {"sky": {"enum": ["clear", "grey"]}}, "required": ["sky"]}
    out = client.completions.create(**body, extra_body={"response_format": {
        "type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}})
    assert all(json.loads(c.text)["sky"] in ("clear", "grey") for c in out.choices)


def test_chat_template_kwargs_reach_the_template(server):
    client = server.client()
    plain = client.chat.completions.create(model=model_name(server), messages=HELLO, max_tokens=1)
    quiet = client.chat.completions.create(model=model_name(server), messages=HELLO, max_tokens=1,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert quiet.usage.prompt_tokens > plain.usage.prompt_tokens  # the empty thought


@pytest.mark.parametrize("field, value", [
    ("functions", [{"name": "f", "parameters": {}}]), ("function_call", "auto"), ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}), ("add_generation_prompt", False), ("continue_final_message", True),
    ("bad_words", ["Paris"]), ("use_beam_search", True), ("truncate_prompt_tokens", 10), ("prompt_logprobs", 1),
    ("echo", True), ("chat_template", "{{ messages }}"), ("chat_template_kwargs", {"tools": []}),
    ("chat_template_kwargs", {"bos_token": "x"}), ("chat_template_kwargs", {"mm_processor_kwargs": {}}),
])
def test_fields_that_would_change_the_output_and_are_not_served_are_400s_naming_them(server, field, value):
    """Found by a client probe: these were accepted and ignored (logged once per process), answering as if unsent."""
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                   json={"messages": HELLO, "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    harmless = {"modalities": ["text"], "add_generation_prompt": True, "functions": [], "bad_words": [],
                "function_call": "none", "documents": []}
    if field in harmless:  # what clients send by default
        r = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                       json={"messages": HELLO, "max_tokens": 2, field: harmless[field]})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param", [
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ({"messages": HELLO + [{"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}]},
     "messages.1.assistant.function_call"),  # the role names the message kind, as in every error
])
def test_nested_fields_that_are_not_served_are_400s_naming_them(server, body, param):
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=30, json={"messages": HELLO, "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_chat_template_kwarg_cannot_hide_the_template_s_functions(server):
    """A review found raise_exception=1 made a template's error call a 500 ('int' object is not callable)."""
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=30, json={
        "messages": HELLO, "max_tokens": 2, "chat_template_kwargs": {"raise_exception": 1}})
    assert r.status_code == 400 and "raise_exception" in r.json()["error"]["message"], r.text


def test_every_response_carries_a_request_id(server):
    """As OpenAI's do: the openai client shows it on a response and on an error, for the user to quote. A
    gateway's own X-Request-Id is echoed when it is short and plain; anything else gets a new id."""
    import openai

    client = server.client()
    raw = client.chat.completions.with_raw_response.create(model=model_name(server), messages=HELLO, max_tokens=2)
    first = raw.headers["x-request-id"]
    assert first.startswith("req_") and raw.parse()._request_id == first
    again = client.chat.completions.with_raw_response.create(model=model_name(server), messages=HELLO, max_tokens=2)
    assert again.headers["x-request-id"] != first
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model_name(server), messages=HELLO, max_tokens=-1)
    assert refused.value.request_id.startswith("req_")
    ours = client.with_options(default_headers={"X-Request-Id": "gateway-7f3a:1"})
    assert ours.models.with_raw_response.list().headers["x-request-id"] == "gateway-7f3a:1"
    for hostile in ("a" * 129, "two words", "é"):
        got = httpx.get(server.base_url + "/health", headers={"X-Request-Id": hostile.encode()}).headers["x-request-id"]
        assert got.startswith("req_")
    assert httpx.post(server.base_url + "/v1/completions", content=b"x=1",
                      headers={"Content-Type": "application/x-www-form-urlencoded"}).headers["x-request-id"]
