"""The text-model commands as a user runs them: synth, generate, chat."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edge_infer.models.config import ModelConfig


def edge_infer(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_infer.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_synth_writes_a_loadable_checkpoint_of_each_family(tmp_path, family):
    out = tmp_path / family
    res = edge_infer("synth", str(out), "--family", family, "--preset", "tiny", "--shard-bytes", "400000")
    assert res.returncode == 0, res.stderr
    cfg = ModelConfig.from_dir(out)
    assert cfg.family == family
    assert (out / "model.safetensors.index.json").exists()  # small shards exercise the index
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    res = edge_infer("generate", str(out), "-p", "Hello", "--max-tokens", "5", "--ignore-eos", "--chat", "--worker", "thread")
    assert res.returncode == 0, res.stderr
    assert "[5 tokens, finish_reason=length]" in res.stderr


def test_synth_rejects_an_unknown_preset(tmp_path):
    res = edge_infer("synth", str(tmp_path / "x"), "--family", "qwen2", "--preset", "huge")
    assert res.returncode == 2 and "error: unknown preset 'huge'" in res.stderr and "Traceback" not in res.stderr


def test_generate_reports_errors_without_a_traceback(tmp_path):
    res = edge_infer("generate", str(tmp_path / "missing"), "-p", "hi")
    assert res.returncode == 2
    assert "error: model" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_chat_streams_a_reply_and_keeps_history(tiny_model):
    res = edge_infer("chat", str(tiny_model), "--max-tokens", "6", "--temperature", "0", stdin="Hello\nAnd again\n\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("model> ") == 2
