"""Bad input to quantizing and to quantized loading: clear errors, before any work."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from edge_infer.cli import main
from edge_infer.config import QuantConfig
from edge_infer.engine.llm import LLM
from edge_infer.errors import CheckpointError, InvalidRequestError
from edge_infer.quant.native import missing_requirement
from edge_infer.memory.plan import plan_text_session
from edge_infer.quant.export import quantize_checkpoint


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, hf_checkpoints):
    return quantize_checkpoint(hf_checkpoints["qwen2"], tmp_path_factory.mktemp("q") / "g32", QuantConfig(group_size=32)).out_dir


def test_quantizing_a_quantized_checkpoint_is_refused(tmp_path, quantized, capsys):
    assert main(["quantize", str(quantized), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert "already quantized" in err and "original" in err
    assert not (tmp_path / "again").exists()


def test_unsupported_family_is_refused_before_writing(tmp_path, tied_model, capsys):
    src = tmp_path / "gpt2"
    shutil.copytree(tied_model, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    assert main(["quantize", str(src), str(tmp_path / "out")]) == 2
    assert "unsupported architecture" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("group_size", [16, 48, 100])
def test_group_size_the_kernel_rejects_is_refused(tmp_path, tied_model, capsys, group_size):
    assert main(["quantize", str(tied_model), str(tmp_path / "out"), "--group-size", str(group_size)]) == 2
    assert "32, 64, 128, 256" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(InvalidRequestError, match="group size"):
        plan_text_session(tied_model, quantization=QuantConfig(group_size=group_size))


@pytest.mark.parametrize("group", ["row", "tensor"])
def test_groups_the_kernel_cannot_run_need_simulate(tmp_path, tied_model, capsys, group):
    assert main(["quantize", str(tied_model), str(tmp_path / "out"), "--group-size", group]) == 2
    assert "--simulate" in capsys.readouterr().err
    assert main(["quantize", str(tied_model), str(tmp_path / "sim"), "--group-size", group, "--simulate"]) == 0
    assert "quantization_config" not in json.loads((tmp_path / "sim" / "config.json").read_text())


def test_non_empty_destination_is_refused(tmp_path, tied_model):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidRequestError, match="not an empty directory"):
        quantize_checkpoint(tied_model, tmp_path / "out", QuantConfig())
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_requests_conflicting_with_a_quantized_checkpoint_are_refused(quantized):
    with pytest.raises(InvalidRequestError, match="group size 32"):
        plan_text_session(quantized, quantization=QuantConfig(group_size=128))
    with pytest.raises(InvalidRequestError, match="cannot load unquantized"):
        plan_text_session(quantized, quantization="none")
    assert plan_text_session(quantized, quantization="cpu_int4").settings["quantization"] == "cpu_int4 g32 sym"


def test_unknown_quantization_format_in_config_is_refused(tmp_path, tied_model):
    src = tmp_path / "gptq"
    shutil.copytree(tied_model, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "gptq", "bits": 4}}))
    with pytest.raises(CheckpointError, match="gptq"):
        plan_text_session(src)


def test_quantized_checkpoint_missing_its_scales_fails_with_the_tensor_named(tmp_path, quantized, make_core):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(quantized, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.0.mlp.down_proj.weight_scale"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(CheckpointError, match="down_proj.weight_scale"):
        make_core(broken)


def test_the_cli_writes_8bit_checkpoints_and_refuses_asymmetric_ones(tmp_path, tied_model, capsys):
    assert main(["quantize", str(tied_model), str(tmp_path / "asym"), "--bits", "8", "--asym"]) == 2
    assert "8-bit weights are symmetric" in capsys.readouterr().err
    assert main(["quantize", str(tied_model), str(tmp_path / "q8"), "--bits", "8", "--group-size", "64"]) == 0
    assert "wrote cpu_int8 g64 sym checkpoint" in capsys.readouterr().out
    raw = json.loads((tmp_path / "q8" / "config.json").read_text())["quantization_config"]
    assert (raw["quant_method"], raw["bits"], raw["group_size"]) == ("cpu_int8", 8, 64)


def poisoned_copy(src, dst, name: str, value: float):
    """A copy of checkpoint ``src`` whose tensor ``name`` holds ``value`` at row 3."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for path in dst.glob("*.safetensors"):
        tensors = load_file(path)
        if name in tensors:
            tensors[name][3, 1] = value
            save_file(tensors, path, metadata={"format": "pt"})
            return dst
    raise AssertionError(f"{name} not in {src}")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_weight_with_no_codes_is_named_by_quantize_and_by_quantized_loading(tmp_path, tiny_model, capsys, value):
    """NaN or infinity in a weight: `edge-infer quantize` and loading with cpu_int4 / cpu_w4a8 stop and name the
    tensor and the rows, instead of writing or running codes that mean nothing."""
    name = "model.layers.1.self_attn.k_proj.weight"
    bad = poisoned_copy(tiny_model, tmp_path / "bad", name, value)
    for simulate in ([], ["--simulate"]):
        assert main(["quantize", str(bad), str(tmp_path / "out"), *simulate]) == 2
        assert f"{name}, row 3 holds a NaN or infinite weight" in capsys.readouterr().err
        assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    kinds = ["cpu_int4"] + ([] if missing_requirement() else ["cpu_w4a8"])
    for quantization in kinds:
        with pytest.raises(CheckpointError, match=re.escape(f"{name}, row 3 holds a NaN or infinite weight")):
            LLM(bad, quantization=quantization, worker="thread", max_model_len=64)
