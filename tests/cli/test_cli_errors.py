"""Every command that fails says why in one line, exits non-zero, and shows no traceback."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge_infer.cli import main
from edge_infer.models.checkpoint import demo_model_dir
from edge_infer.hardware import cpu as cpu_mod

# (command line before the model, after it); {out} is a fresh output path.
COMMANDS = {
    "generate": (["generate"], ["-p", "hi", "--max-tokens", "2"]),
    "chat": (["chat"], []),
    "serve": (["serve"], ["--port", "0"]),
    "plan": (["plan"], []),
    "bench pp-tg": (["bench", "pp-tg"], ["--pp", "8", "--tg", "2", "--reps", "1"]),
    "bench init-memory": (["bench", "init-memory"], ["--out", "{out}"]),
    "quantize": (["quantize"], ["{out}"]),
    "tts": (["tts"], ["hello", "-o", "{out}.wav"]),
}


@pytest.fixture(scope="module")
def corrupt_model(tmp_path_factory) -> Path:
    """The demo model with its weights file cut short."""
    out = tmp_path_factory.mktemp("corrupt") / "demo"
    shutil.copytree(demo_model_dir(), out)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 1 << 20])
    return out


@pytest.fixture
def no_avx2(monkeypatch):
    """This process sees an x86 CPU without AVX2, where edge-infer's int8 kernels have no variant; PyTorch's own
    dispatch variables are restored afterwards."""
    for name, value in (("ATEN_CPU_CAPABILITY", "default"), ("ONEDNN_MAX_CPU_ISA", "SSE41"),
                        ("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(cpu_mod.MASK_ENV, "fma,f16c")
    cpu_mod.detect.cache_clear()
    yield
    cpu_mod.detect.cache_clear()


def run(name: str, model: Path, tmp_path: Path, capsys, extra: list[str] = ()) -> tuple[int, str]:
    """(exit code, stdout + stderr) of one command."""
    before, after = COMMANDS[name]
    argv = [*before, str(model), *[a.format(out=tmp_path / "out") for a in after], *extra]
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def assert_one_line_error(code: int, err: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    assert any(line.startswith(("error:", "edge-infer")) and "error" in line for line in err.splitlines()), err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_missing_checkpoint(name, tmp_path, capsys):
    code, err = run(name, tmp_path / "no-such-model", tmp_path, capsys)
    assert_one_line_error(code, err)
    assert "no-such-model" in err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_corrupt_checkpoint(name, corrupt_model, tmp_path, capsys):
    code, err = run(name, corrupt_model, tmp_path, capsys)
    assert_one_line_error(code, err)
    assert "model.safetensors" in err or "config.json" in err  # tts: not a Qwen3-TTS checkpoint


@pytest.mark.parametrize("name", ["generate", "chat", "serve", "plan", "bench pp-tg", "bench init-memory"])
def test_an_option_this_cpu_cannot_run(name, no_avx2, tmp_path, capsys):
    code, err = run(name, demo_model_dir(), tmp_path, capsys, ["--quantization", "cpu_w4a8"])
    assert code == 1 and "cpu-w4a8 needs avx2 (its avx2 variant)" in err and "Traceback" not in err
    if name == "plan":  # the plan's table on stdout
        return
    assert_one_line_error(code, err)
    assert "cpu-w4a8 needs avx2" in err and "cpu_int4" in err


def test_the_talker_refuses_a_kernel_this_cpu_cannot_run(no_avx2, tmp_path, capsys):
    tts = tmp_path / "tts"
    assert main(["synth", str(tts), "--family", "qwen3-tts", "--preset", "tiny"]) == 0
    capsys.readouterr()
    code, err = run("tts", tts, tmp_path, capsys, ["--stage-overrides", '{"0": {"engine": {"quantization": "cpu_w4a8"}}}'])
    assert_one_line_error(code, err)
    assert "cpu-w4a8 needs avx2" in err
