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


@pytest.mark.slow
def test_chat_attaches_a_picture_for_the_demo_model_to_see(tmp_path):
    """`/image PATH question` sends the file with the question (the embedded demo model can see); a file that cannot
    be read, or a kind the model does not take, is an error line and the conversation goes on."""
    from PIL import Image, ImageDraw

    picture = Image.new("RGB", (96, 96), "white")
    ImageDraw.Draw(picture).ellipse((16, 16, 80, 80), fill="red")
    picture.save(tmp_path / "my picture.png")
    lines = ['/image "my picture.png" What is in this picture?', "/image missing.png hi", '/audio "my picture.png"',
             "What colour was it?", ""]
    res = subprocess.run([sys.executable, "-m", "edge_infer.cli", "chat", "--max-tokens", "12", "--temperature", "0"],
                         input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    replies = [r.split("you>")[0] for r in res.stdout.split("model> ")[1:]]
    assert len(replies) == 2 and "red" in replies[0].lower() and "red" in replies[1].lower()
    assert "error: cannot read missing.png: No such file or directory" in res.stderr
    assert "(audio_url): this model (demo-vl-model) takes image input, not audio" in res.stderr
    # one-shot, the same way
    seen = edge_infer("generate", "--image", str(tmp_path / "my picture.png"), "-p", "What is in this picture?",
                      "--max-tokens", "8")
    assert seen.returncode == 0 and "red" in seen.stdout.lower(), seen.stderr
    missing = edge_infer("generate", "--image", str(tmp_path / "missing.png"), "-p", "hi")
    assert missing.returncode == 2 and "error: cannot read" in missing.stderr and "Traceback" not in missing.stderr
