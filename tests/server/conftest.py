"""Fixtures for the server tests: a tiny checkpoint and a real server process per module."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from .serverutil import ServerProcess

# A ChatML template that renders tools the way Qwen2.5's does (only used until the demo model lands).
_BRIDGE_TEMPLATE = (
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
)


def _bridge_base(root: Path) -> Path:
    """A byte-level BPE tokenizer dir standing in for the demo model's (synth copies its tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["The weather in Paris is sunny today.", "What is the weather like in Berlin?", "Hello, how are you?"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": _BRIDGE_TEMPLATE}))
    return root


@pytest.fixture(scope="session")
def served_model(request, tmp_path_factory) -> Path:
    from edge_infer.engine.frontend import demo_model_dir

    if (demo_model_dir() / "tokenizer.json").is_file():
        return request.getfixturevalue("tiny_model")
    from edge_infer.models import synth

    base = _bridge_base(tmp_path_factory.mktemp("bridge-tokenizer"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synth, "_base_tokenizer_dir", lambda: base)
        return synth.write_checkpoint(tmp_path_factory.mktemp("synth") / "tiny-qwen2", "qwen2", "tiny", dtype="float32")


@pytest.fixture(scope="module")
def server(served_model):
    """One server for a test module (tests must leave it usable for the next)."""
    with ServerProcess(served_model, "--max-num-seqs", "4", "--max-model-len", "512") as proc:
        yield proc
