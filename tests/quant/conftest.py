"""Fixtures for the cpu_int4 tests: tiny checkpoints (tied and untied heads) and engine cores."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from edge_infer.config import QuantConfig

# qwen2: tied head, hidden 80 (not a multiple of any group size: padded); llama: separate head.
TIED, UNTIED = "qwen2", "llama"


@pytest.fixture(scope="session")
def tied_model(hf_checkpoints) -> Path:
    return hf_checkpoints[TIED]


@pytest.fixture(scope="session")
def untied_model(hf_checkpoints) -> Path:
    return hf_checkpoints[UNTIED]


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory, hf_checkpoints) -> Path:
    """The tied tiny model with a small byte-level BPE tokenizer, for commands that take text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("chat") / "tiny"
    shutil.copytree(hf_checkpoints[TIED], out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["What is the capital of France? Count from one to ten. Hello there!"] * 20, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return out


@pytest.fixture
def make_core() -> Callable:
    """An in-process engine core for ``model`` (bf16 unless told), planned like the frontends plan it."""
    from edge_infer.engine.core import EngineCore
    from edge_infer.memory.plan import plan_text_session

    def make(model: Path, quant: QuantConfig | str | None = None, dtype: str = "bfloat16", **plan_kw) -> EngineCore:
        settings = dict(max_model_len=128, max_num_seqs=2, max_num_batched_tokens=64, kv_cache_memory_bytes=1 << 20)
        plan = plan_text_session(model, quantization=quant, dtype=dtype, **{**settings, **plan_kw})
        assert plan.admitted, plan.table()
        core = EngineCore(plan.engine_config)
        core.plan = plan
        return core

    return make


@pytest.fixture
def greedy() -> Callable:
    from edge_infer.bench.measures.fidelity_metrics import greedy_tokens

    def run(core, prompt: list[int], n: int = 12) -> list[int]:
        return greedy_tokens(core, prompt, n, stop_at_eos=False)

    return run
