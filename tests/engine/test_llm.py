"""The offline LLM API on a tiny synthetic checkpoint: prompts, sampling, stops, budgets, errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import psutil
import pytest
import torch

from edge_infer import LLM, SamplingParams
from edge_infer.errors import CheckpointError, InvalidRequestError

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model):
    with LLM(tiny_model, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64, worker="thread") as engine:
        yield engine


def test_text_and_token_id_prompts_give_the_same_tokens(llm):
    params = SamplingParams(max_tokens=16, **GREEDY)
    by_text = llm.generate("The quick brown fox", params)[0]
    by_ids = llm.generate({"prompt_token_ids": by_text.prompt_token_ids}, params)[0]
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    assert len(by_text.outputs[0].token_ids) == 16 and by_text.finish_reason == "length"
    assert by_text.outputs[0].text == llm.get_tokenizer().decode(by_text.outputs[0].token_ids)
    # token ids as a tokenizer hands them over: a tuple, a numpy array, a tensor (one prompt), rows of a 2-D array
    ids = by_text.prompt_token_ids
    for prompt in (tuple(ids), np.array(ids), torch.tensor(ids), {"prompt_token_ids": np.array(ids)}):
        assert [o.outputs[0].token_ids for o in llm.generate(prompt, params)] == [by_text.outputs[0].token_ids]
    assert len(llm.generate(np.array([ids, ids]), params)) == 2
    stop = by_text.outputs[0].token_ids[3]
    stopped = llm.generate("The quick brown fox", SamplingParams(max_tokens=16, stop_token_ids=np.array([stop, 99999]),
                                                                  **GREEDY))[0].outputs[0]
    assert stopped.token_ids[-1] == stop and stopped.finish_reason == "stop"


def test_seed_reproducible_and_n_samples_differ(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=123, n=3, ignore_eos=True)
    a = llm.generate("Hello", params)[0]
    b = llm.generate("Hello", params)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len(a.outputs) == 3 and len({tuple(o.token_ids) for o in a.outputs}) == 3
    other = llm.generate("Hello", params.clone(seed=124))[0]
    assert other.outputs[0].token_ids != a.outputs[0].token_ids


def _boundary_stop(llm, text_tokens: list[int]) -> tuple[str, int]:
    """A stop string that starts inside one token's text and ends inside the next one."""
    tok = llm.get_tokenizer()
    text = tok.decode(text_tokens)
    pos = 0
    for i in range(3, len(text_tokens) - 1):
        piece, nxt = tok.decode(text_tokens[: i + 1]), tok.decode(text_tokens[: i + 2])
        if len(piece) >= 2 and len(nxt) - len(piece) >= 2 and nxt.startswith(piece):
            stop = piece[-2:] + nxt[len(piece) : len(piece) + 2]
            pos = text.find(stop)
            if pos == len(piece) - 2:
                return stop, pos
    pytest.skip("no token boundary with two characters on each side in this output")
    return "", pos


def test_stop_string_across_token_boundary(llm):
    base = llm.generate("Once upon a time", SamplingParams(max_tokens=40, **GREEDY))[0].outputs[0]
    stop, pos = _boundary_stop(llm, base.token_ids)
    out = llm.generate("Once upon a time", SamplingParams(max_tokens=40, stop=[stop], **GREEDY))[0].outputs[0]
    assert out.text == base.text[:pos]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    kept = llm.generate("Once upon a time", SamplingParams(max_tokens=40, stop=stop, include_stop_str_in_output=True, **GREEDY))[0]
    assert kept.outputs[0].text == base.text[: pos + len(stop)]


def test_stop_token_ids_end_the_request(llm):
    base = llm.generate("Once upon a time", SamplingParams(max_tokens=30, **GREEDY))[0].outputs[0]
    stop_id = base.token_ids[6]
    first = base.token_ids.index(stop_id)
    out = llm.generate("Once upon a time", SamplingParams(max_tokens=30, stop_token_ids=[stop_id], **GREEDY))[0].outputs[0]
    assert out.token_ids == base.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id


def test_eos_ends_unless_ignored(llm, tiny_model):
    eos = json.loads((tiny_model / "generation_config.json").read_text())["eos_token_id"][0]
    base = llm.generate("Hi", SamplingParams(max_tokens=8, **GREEDY))[0].outputs[0]
    # Make the 3rd greedy token count as EOS via stop_token_ids: same path as the model's EOS.
    out = llm.generate("Hi", SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[base.token_ids[2]]))[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) <= 3
    assert eos in llm.frontend.engine_config.eos_token_ids


def test_logprobs_are_reported_per_token(llm):
    out = llm.generate("Hello", SamplingParams(max_tokens=5, logprobs=3, **GREEDY))[0].outputs[0]
    assert len(out.logprobs) == 5
    for tok, entry in zip(out.token_ids, out.logprobs):
        assert tok in entry and len(entry) >= 3
        assert entry[tok].logprob <= 0
        assert max(e.logprob for e in entry.values()) == entry[tok].logprob  # greedy picks the top one
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_chat_uses_the_checkpoint_template(llm):
    out = llm.chat([{"role": "user", "content": "Hello there"}], SamplingParams(max_tokens=4, **GREEDY))[0]
    rendered = llm.get_tokenizer().decode(out.prompt_token_ids, skip_special_tokens=False)
    assert rendered.startswith("<|im_start|>system") and rendered.endswith("<|im_start|>assistant\n")
    assert "Hello there" in rendered


def test_bad_requests_are_refused_clearly_and_the_engine_keeps_serving(llm):
    with pytest.raises(InvalidRequestError, match="max_tokens must be at least 0"):
        SamplingParams(max_tokens=-1)
    with pytest.raises(InvalidRequestError, match=r"300 tokens but max_model_len is 256"):
        llm.generate({"prompt_token_ids": [5] * 300}, SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError, match=r"prompt \(200 tokens\) \+ max_tokens \(100\).*max_model_len \(256\)"):
        llm.generate({"prompt_token_ids": [5] * 200}, SamplingParams(max_tokens=100))
    assert llm.generate("still fine", SamplingParams(max_tokens=3, **GREEDY))[0].finish_reason == "length"


@pytest.mark.parametrize("field, value, says", [
    ("seed", 2**64, r"seed must be in \[-2\*\*63, 2\*\*64 - 1\]"), ("seed", -(2**63) - 1, "seed must be in"),
    ("seed", 1.5, "seed must be a whole number"), ("top_k", 2.5, "top_k must be a whole number"),
    ("logprobs", 2.5, "logprobs must be a whole number"), ("max_tokens", 1.5, "max_tokens must be a whole number"),
    ("n", True, "n must be a whole number"), ("repetition_penalty", float("nan"), "repetition_penalty must be a finite"),
    ("temperature", "0.7", "temperature must be a number"),
])
def test_parameters_the_worker_cannot_take_are_refused_up_front(llm, field, value, says):
    """A seed out of the generators' range took the engine worker down (EngineDeadError, the LLM unusable); a float
    top_k failed in the sampler; a NaN penalty failed every step."""
    with pytest.raises(InvalidRequestError, match=says):
        SamplingParams(**{field: value})
    assert llm.generate("still fine", SamplingParams(max_tokens=2, **GREEDY))[0].finish_reason == "length"


@pytest.mark.parametrize("call, says", [
    (lambda llm: llm.generate(None), r"prompts must be a string, a list of token ids, a prompt dict or a list of "
                                     r"those, not NoneType"),
    (lambda llm: llm.generate({"prompt_token_ids": [5, 6.7]}), r"^prompt_token_ids holds 6\.7 at index 1; token ids"),
    (lambda llm: llm.generate([[5, 6], [5, True]]), r"^prompt 1: the prompt's token ids holds True at index 1"),
    (lambda llm: llm.generate(["fine", 7]), r"^prompt 1: a prompt must be a string, a list of token ids or a dict"),
    (lambda llm: llm.chat({"role": "user", "content": "hi"}), r"messages must be a list of message dicts .* not dict"),
    (lambda llm: llm.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]]), r"^conversation 1: "),
    (lambda llm: SamplingParams(stop_token_ids=[2.5]), r"^stop_token_ids holds 2\.5 at index 0"),
], ids=["none", "float-id", "bool-id-in-batch", "int-in-batch", "message-dict", "media-in-batch", "float-stop-id"])
def test_prompts_of_the_wrong_type_are_refused_naming_which(llm, call, says):
    """generate(None) and chat(a message dict) were bare TypeErrors and KeyErrors, float token ids were truncated
    (6.7 became token 6), and an error about one of several prompts did not say which."""
    with pytest.raises(InvalidRequestError, match=says):
        call(llm)
    assert llm.generate("still fine", SamplingParams(max_tokens=2, **GREEDY))[0].finish_reason == "length"


def test_a_seed_at_the_top_of_the_range_seeds_all_n_samples(llm):
    """Sample k is seeded seed + k modulo 2**64 (as the server does): seed 2**64 - 1 with n=2 took the worker down."""
    import numpy as np

    out = llm.generate("Hello", SamplingParams(max_tokens=4, n=2, seed=2**64 - 1, temperature=1.0, ignore_eos=True))[0]
    again = llm.generate("Hello", SamplingParams(max_tokens=4, n=2, seed=2**64 - 1, temperature=1.0, ignore_eos=True))[0]
    assert [o.token_ids for o in out.outputs] == [o.token_ids for o in again.outputs]
    assert SamplingParams(seed=np.int64(3), top_k=np.int32(5)).top_k == 5  # numpy's whole numbers are whole numbers



def test_a_seed_changed_after_its_check_fails_its_request_not_the_worker(llm):
    from edge_infer.engine.protocol import AddRequest, Deltas

    params = SamplingParams(seed=1, max_tokens=2)
    params.seed = 2**70  # past SamplingParams' check, straight to the core (as LocalTextEngine's submit sends it)
    llm._client.send(AddRequest(llm.frontend.request("bad-seed", llm.frontend.prepare("x"), params)))
    deltas = []
    while not any(d.finished for d in deltas):
        deltas += [d for r in llm._client.receive(timeout_s=5.0) if isinstance(r, Deltas) for d in r.deltas]
    assert "cannot seed a generator" in deltas[-1].error and deltas[-1].request_id == "bad-seed"
    assert llm.generate("still fine", SamplingParams(max_tokens=2, **GREEDY))[0].finish_reason == "length"


def test_a_command_that_cannot_be_sent_fails_in_the_caller_and_the_engine_keeps_serving(llm):
    """Commands are queued for a sender thread (a busy worker never blocks the caller); they are pickled before
    that, so what cannot be sent raises here instead of silently stopping every later command."""
    with pytest.raises(Exception, match="pickle"):
        llm._client.send(lambda: None)
    assert llm.generate("still fine", SamplingParams(max_tokens=3, **GREEDY))[0].finish_reason == "length"


def test_a_long_prompt_list_goes_to_the_worker_as_it_has_room(llm):
    """generate() keeps at most 2 x max_num_seqs samples in the worker (what runs and as much again queued): a list of
    thousands of long prompts never sits whole in its queue, which no plan item holds. All are checked before any
    runs, and each gets its own answer, in order."""
    prompts = [f"prompt number {i}" for i in range(30)]
    params = [SamplingParams(max_tokens=3, **GREEDY)] * 29 + [SamplingParams(max_tokens=3, n=3, seed=7, **GREEDY)]
    before = llm.core_stats.generated_tokens
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        llm.generate([*prompts, {"prompt_token_ids": [5] * 300}], SamplingParams(max_tokens=3))
    outs = llm.generate(prompts, params)
    assert [o.prompt for o in outs] == prompts and [len(o.outputs) for o in outs] == [1] * 29 + [3]
    assert all(len(c.token_ids) == 3 for o in outs for c in o.outputs)
    assert llm.core_stats.generated_tokens == before + 32 * 3  # the refused list ran nothing
    assert llm.core_stats.num_waiting_peak <= 2 * 4  # max_num_seqs=4; all 30 were queued at once before


def test_calls_from_two_threads_each_get_their_own_answers(llm):
    """Two threads on one LLM: each call read the worker's pipe and dropped the other's tokens (one got empty texts
    with finish_reason stop, the other hung). A call now waits for the one running."""
    from concurrent.futures import ThreadPoolExecutor

    params = SamplingParams(max_tokens=12, **GREEDY)
    alone = [[o.outputs[0].token_ids for o in llm.generate([p] * 4, params)] for p in ("hello", "a story")]
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda p: llm.generate([p] * 4, params), ["hello", "a story"]))
    assert [[o.outputs[0].token_ids for o in out] for out in both] == alone


def test_a_closed_llm_says_so(tiny_model):
    from edge_infer.errors import StaleSessionError

    engine = LLM(tiny_model, max_model_len=128, worker="thread")
    engine.close()
    with pytest.raises(StaleSessionError, match="this LLM is closed"):
        engine.generate("hi")


def test_kv_budget_is_allocated_exactly(tiny_model):
    budget = 3_000_000
    with LLM(tiny_model, max_model_len=256, kv_cache_memory_bytes=budget, worker="thread") as llm:
        planned = llm.plan.item("kv cache")
        assert llm.ready.kv_cache_bytes == planned <= budget
        per_block = budget // llm.ready.kv_blocks
        assert budget - planned < per_block  # whole blocks, nothing beyond the budget


def test_outgrowing_the_kv_budget_preempts_and_recomputes(tiny_model):
    """Two requests that cannot both fit: one is preempted, both finish with unchanged tokens."""
    params = SamplingParams(max_tokens=48, **GREEDY)
    prompts = [{"prompt_token_ids": list(range(10, 26))}, {"prompt_token_ids": list(range(40, 56))}]
    with LLM(tiny_model, max_model_len=64, max_num_seqs=2, worker="thread") as roomy:
        alone = [roomy.generate(p, params)[0].outputs[0].token_ids for p in prompts]
        one_seq = roomy.plan.item("kv cache") // (roomy.ready.kv_blocks) * 4  # 4 blocks of 16 = 64 tokens
    with LLM(tiny_model, max_model_len=64, max_num_seqs=2, kv_cache_memory_bytes=one_seq, worker="thread") as tight:
        outs = tight.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert all(o.finish_reason == "length" for o in outs)
    assert max(o.metrics.num_preemptions for o in outs) >= 1


def test_checkpoint_errors_name_the_problem(tmp_path, tiny_model):
    with pytest.raises(CheckpointError, match="not a directory"):
        LLM(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        LLM(tmp_path / "empty")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        LLM(broken)
    cfg = json.loads((tiny_model / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckpointError, match="unsupported architecture.*supports"):
        LLM(broken)
    (broken / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + 1}))
    with pytest.raises(CheckpointError, match="lacks model.layers.2"):
        LLM(broken)


def test_default_worker_is_a_separate_process_and_close_leaves_none(tiny_model):
    me = psutil.Process()
    with LLM(tiny_model, max_model_len=128) as llm:
        assert llm.ready.pid != me.pid
        assert llm.ready.pid in [c.pid for c in me.children(recursive=True)]
        assert llm.generate("Hi", SamplingParams(max_tokens=3, **GREEDY))[0].finish_reason == "length"
        pid = llm.ready.pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
