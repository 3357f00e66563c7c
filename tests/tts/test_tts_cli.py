"""``edge-infer synth --family qwen3-tts`` and ``edge-infer tts`` as a user runs them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

import edge_infer
from edge_infer.cli import main
from tts_helpers import SAMPLES_PER_FRAME


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tts") / "tiny-tts"
    assert main(["synth", str(out), "--family", "qwen3-tts", "--preset", "tiny", "--seed", "3"]) == 0
    return out


def test_synth_writes_both_sub_models_configs_tokenizer_and_speakers(checkpoint: Path, capsys) -> None:
    for name in ("config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt",
                 "tokenizer_config.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors"):
        assert (checkpoint / name).is_file(), name
    assert main(["tts", str(checkpoint), "--list-voices"]) == 0
    out = capsys.readouterr().out
    assert "voices: aiden, dylan" in out and "languages: auto, chinese, english" in out


def test_tts_without_text_says_how_to_call_it(checkpoint: Path, capsys) -> None:
    assert main(["tts", str(checkpoint)]) == 2
    assert "give the text to speak" in capsys.readouterr().err


def test_tts_writes_only_wav_or_flac(checkpoint: Path, capsys) -> None:
    assert main(["tts", str(checkpoint), "hello", "-o", "hello.mp3"]) == 2
    assert ".wav or .flac" in capsys.readouterr().err


def test_tts_on_a_directory_that_is_not_a_checkpoint(tmp_path: Path, capsys) -> None:
    assert main(["tts", str(tmp_path), "hello"]) == 2
    assert "config.json not found" in capsys.readouterr().err


@pytest.mark.slow
def test_tts_writes_a_wav_and_reports_latency(checkpoint: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(edge_infer.__file__).resolve().parents[1]))
    out = tmp_path / "hello.wav"
    cmd = [sys.executable, "-m", "edge_infer.cli", "tts", str(checkpoint), "Hello from the edge.", "-o", str(out),
           "--voice", "vivian", "--language", "english", "--seed", "1", "--max-tokens", "16",
           "--stage-overrides", '{"0": {"executor_options": {"num_threads": 1}}, "1": {"executor_options": {"num_threads": 1}}}']
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    audio, rate = soundfile.read(out, dtype="float32")
    assert rate == 24000 and np.isfinite(audio).all()
    assert len(audio) % SAMPLES_PER_FRAME == 0 and 2 <= len(audio) // SAMPLES_PER_FRAME <= 16
    assert "voice vivian" in done.stdout and "real-time factor" in done.stdout
