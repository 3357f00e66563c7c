"""Fixtures for the server tests: a tiny checkpoint and a real server process per module."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .serverutil import ServerProcess

# ChatML that renders tools the way Qwen2.5's template does: the server offers tools only to templates that take them.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call functions. Signatures within <tools></tools>:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "Return each call as <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] != 'system' %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}\n<tool_call>\n"
    "{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    # as Qwen3's template takes it (chat_template_kwargs): an empty thought
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_test_checkpoint(out: Path) -> Path:
    """A tiny Qwen2 checkpoint whose outputs vary from token to token.

    ``edge-infer synth --preset tiny`` ties its embeddings at a scale that makes
    the model repeat one token, which would let "streamed text equals
    non-streamed text" or "stop strings cut the text" pass vacuously. Here:
    transformers' random init, wide (as in the parity tests), with a small
    byte-level BPE trained on the spot and a tools-capable chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from testutil import write_hf_checkpoint

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["The weather in Paris is sunny today.", "What is the weather like in Berlin?", "Hello, how are you?"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(SPECIALS)
    write_hf_checkpoint(out, "qwen2", vocab_size=tok.get_vocab_size(), eos_token_id=tok.token_to_id("<|im_end|>"))
    tok.save(str(out / "tokenizer.json"))
    config = {"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="session")
def served_model(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("server") / "tiny-qwen2")


@pytest.fixture(scope="package")
def server(served_model):
    """The shared server (tests must leave it usable for the next). Tests that stop or break
    a server start their own. It ends with tests/server, so that suites run after it that count
    this process's children (tests/engine, tests/memory) find none of its."""
    with ServerProcess(served_model, "--max-num-seqs", "4", "--max-model-len", "512") as proc:
        yield proc


@pytest.fixture(scope="session")
def tokenizer(served_model):
    from edge_infer.models.tokenizer import Tokenizer

    return Tokenizer(served_model)
