"""A thinker's towers in the engine: built and loaded with the model, on the kernel --encoder-quantization names
(dense in the engine's dtype by default), refused where this CPU cannot run it, each tower an item of the plan equal to
what the core reports."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mm_fakes import media_inputs, vision_features
from mm_prompts import Prompt, mm_config
from testutil import runnable_variants
from edge_infer.cli import main
from edge_infer.config import EngineConfig, QuantConfig
from edge_infer.engine.core import EngineCore
from edge_infer.errors import InvalidRequestError
from edge_infer.hardware.cpu import profile
from edge_infer.hardware.kernels import auto_encoder_quantization
from edge_infer.memory.plan import plan_text_session
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights import weight_specs
from edge_infer.quant import native_build
from edge_infer.quant.export import quantize_checkpoint
from edge_infer.quant.sizes import int4_prompt_bytes, int4_prompt_widths

SETTINGS = dict(dtype="float32", max_model_len=128, max_num_seqs=2, max_num_batched_tokens=32,
                kv_cache_memory_bytes=1 << 20, available_bytes=8 << 30)


@pytest.fixture(scope="module")
def omni(thinker_checkpoints):
    return thinker_checkpoints["qwen2_5_omni_thinker"]


def planned_core(path, encoder_quantization: str, **settings) -> tuple:
    if {encoder_quantization, settings.get("quantization")} & {"cpu_w4a8", "cpu_w8a8"} and runnable_variants() == ["scalar"]:
        pytest.skip("no variant of edge-infer's int8 kernels runs on this CPU")
    plan = plan_text_session(path, encoder_quantization=encoder_quantization, **{**SETTINGS, **settings})
    assert plan.admitted, plan.reasons
    return plan, EngineCore(plan.engine_config)


@pytest.mark.parametrize("encoder_quantization, quantization, towers, decoder", [
    ("none", None, "dense", "dense"),
    ("cpu_w8a8", None, "cpu-w8a8", "dense"),
    ("same", "cpu_w4a8", "cpu-w4a8", "cpu-w4a8"),
    ("cpu_int4", "cpu_w8a8", "cpu-int4", "cpu-w8a8"),
])
def test_the_towers_run_the_kernel_asked_for_and_the_plan_counts_them(omni, encoder_quantization, quantization, towers,
                                                                       decoder):
    plan, core = planned_core(omni, encoder_quantization, quantization=quantization)
    info = core.ready_info
    assert info.linear_kernels["encoder linears"].split(" ")[0] == towers
    assert info.linear_kernels["decoder linears"].split(" ")[0] == decoder
    assert {c.kind: c.kernel for c in plan.kernels.choices}["encoder linears"] == towers
    assert set(info.encoder_weight_bytes) == {"vision", "audio"}
    for kind, loaded in info.encoder_weight_bytes.items():
        assert plan.item(f"{kind} encoder weights") == loaded, kind
    assert plan.item("weights") == info.weight_bytes - sum(info.encoder_weight_bytes.values())  # the decoder's
    assert plan.weight_bytes == info.weight_bytes == core.model.resident_bytes()
    assert plan.settings["encoder_quantization"] == encoder_quantization


@pytest.mark.parametrize("method", ["cpu_w8a8", "cpu_w4a8"])
def test_quantized_towers_see_what_the_dense_ones_see(omni, method):
    """The same image through dense and int8-activation towers: the embeddings stay close."""
    _, dense = planned_core(omni, "none")
    _, quantized = planned_core(omni, method)
    image = vision_features(np.random.default_rng(0), (1, 6, 8))
    ref, out = dense.model.encode("image", image), quantized.model.encode("image", image)
    assert ref.shape == out.shape == (12, dense.model.cfg.hidden_size)
    assert ((out - ref).norm() / ref.norm()).item() < (0.05 if method == "cpu_w8a8" else 0.25)


def test_a_kernel_this_cpu_cannot_run_is_refused_with_the_nearest(omni, capsys):
    plan = plan_text_session(omni, cpu=profile("arm-nodotprod"), encoder_quantization="cpu_w4a8", **SETTINGS)
    assert not plan.admitted and plan.engine_config is None
    assert any(r.startswith("--encoder-quantization cpu_w4a8: cpu-w4a8 needs dotprod") and
               "use --encoder-quantization cpu_int4" in r for r in plan.reasons), plan.reasons
    code = main(["plan", str(omni), "--cpu", "arm-nodotprod", "--encoder-quantization", "cpu_w8a8", "--dtype",
                 "float32", "--max-model-len", "128", "--available-bytes", str(8 << 30)])
    out = capsys.readouterr().out
    assert code == 1 and "REFUSED" in out and "--encoder-quantization cpu_w8a8: cpu-w8a8 needs dotprod" in out
    assert "encoder linears" in out


@pytest.mark.parametrize("cpu, quantization, dtype, expected", [
    ("avx2", "cpu_w4a8", "auto", "same"),         # bf16 for the int8 decoder, emulated: towers on its kernel
    ("avx2", "cpu_w8a8", "bfloat16", "same"),
    ("avx2", "cpu_w4a8", "float32", "none"),      # fp32 towers are native
    ("avx2", None, "auto", "none"),
    ("avx512-bf16", "cpu_w4a8", "auto", "none"),  # native bf16: oneDNN's bf16 towers are as fast
    ("avx2", "cpu_int4", "auto", "cpu_w4a8"),     # bf16 for tinygemm: towers on edge-infer's int8 kernel
    ("avx512-bf16", "cpu_int4", "auto", "none"),
])
def test_auto_towers_take_the_decoders_int8_kernel_where_dense_bf16_would_be_emulated(omni, cpu, quantization, dtype,
                                                                                        expected):
    if expected == "cpu_w4a8" and native_build.missing_toolchain() is not None:
        expected = "same"  # without edge-infer's library the towers keep the decoder's int4 kernel
    plan = plan_text_session(omni, cpu=profile(cpu), **{**SETTINGS, "dtype": dtype, "quantization": quantization})
    assert plan.admitted, plan.reasons
    assert plan.settings["encoder_quantization"] == expected
    assert any(n.startswith(f"encoder_quantization auto -> {expected}") for n in plan.notes), plan.notes
    towers = {c.kind: c.kernel for c in plan.kernels.choices}["encoder linears"]
    if expected == "none":
        assert towers in ("dense", "onednn-bf16")
    else:
        assert towers == (quantization if expected == "same" else expected).replace("_", "-")
    explicit = plan_text_session(omni, cpu=profile(cpu), encoder_quantization="none",
                                 **{**SETTINGS, "dtype": dtype, "quantization": quantization})
    assert explicit.settings["encoder_quantization"] == "none"  # a choice given wins


def test_towers_on_cpu_int4_plan_its_prompt_blocks_beside_any_decoder(omni):
    """cpu_int4's prompt path dequantizes weight blocks for an encode's products too (quant/sizes.int4_prompt_bytes)."""
    def activations(towers: str) -> int:
        plan = plan_text_session(omni, cpu=profile("avx2"), quantization="cpu_w4a8", encoder_quantization=towers,
                                 **{**SETTINGS, "dtype": "bfloat16"})
        return plan.item("activations")

    _, widest = int4_prompt_widths(weight_specs(ModelConfig.from_dir(omni)), None, QuantConfig.named("cpu_int4"))
    assert widest and activations("cpu_int4") - activations("cpu_w4a8") == int4_prompt_bytes(256, widest, 2, False)


def test_auto_towers_beside_an_int4_decoder_keep_its_kernel_without_edge_infers_library():
    choice, why = auto_encoder_quantization(profile("avx2"), "bfloat16", "cpu_int4", native_library=False)
    assert choice == "same" and "emulated" in why
    assert auto_encoder_quantization(profile("avx2"), "float32", "cpu_int4")[0] == "none"


def test_settings_that_do_not_apply_say_so(omni, hf_checkpoints):
    with pytest.raises(InvalidRequestError, match="encoder_quantization 'int3' is not supported; use one of none, same"):
        plan_text_session(omni, encoder_quantization="int3", **SETTINGS)
    text = plan_text_session(hf_checkpoints["qwen2"], encoder_quantization="cpu_w8a8", **SETTINGS)
    assert text.admitted and any("--encoder-quantization cpu_w8a8 does nothing" in n for n in text.notes)
    # same, with an unquantized decoder: dense towers
    plan, core = planned_core(omni, "same")
    assert plan.engine_config.encoder_quant() is None and core.ready_info.linear_kernels["encoder linears"] == "dense"


def test_the_towers_load_in_the_engine_dtype(omni):
    core = EngineCore(EngineConfig(model=str(omni), dtype="bfloat16", max_model_len=64, max_num_seqs=1,
                                   max_num_batched_tokens=16, kv_cache_memory_bytes=1 << 20))
    for tower in core.model.towers().values():
        plain = [getattr(*tower.resolve(s.target)) for s in tower.weight_specs() if not s.is_linear]
        assert {t.dtype for t in plain} == {torch.bfloat16}
    out = core.model.encode("image", vision_features(np.random.default_rng(1), (1, 4, 4)))
    assert out.dtype == torch.bfloat16 and out.shape == (4, core.model.cfg.hidden_size)


@pytest.mark.parametrize("quantization", ["cpu_int4", "cpu_w8a8"])
def test_a_quantized_thinker_checkpoint_loads_to_the_model_quantizing_on_load_gives(omni, tmp_path, quantization):
    """`edge-infer quantize` of a thinker stores the decoder's linears as codes and copies the towers as they are; with
    --encoder-quantization same both load on the decoder's kernel, as from the float checkpoint."""
    out = quantize_checkpoint(omni, tmp_path / "q", QuantConfig.named(quantization)).out_dir
    _, on_load = planned_core(omni, "same", quantization=quantization)
    plan, exported = planned_core(out, "same")  # the method read from config.json
    assert plan.engine_config.quant == QuantConfig.named(quantization)
    assert exported.ready_info.linear_kernels == on_load.ready_info.linear_kernels
    assert exported.ready_info.linear_kernels["encoder linears"].split(" ")[0] == quantization.replace("_", "-")
    assert plan.weight_bytes == exported.ready_info.weight_bytes == exported.model.resident_bytes()
    prompt = Prompt(mm_config("qwen2_5_omni")).text([5, 6]).image((1, 4, 6)).text([7]).audio(60).text([8, 9])
    media = media_inputs(prompt, seed=4)
    assert torch.equal(exported.score(prompt.ids, media), on_load.score(prompt.ids, media))
    _, dense_towers = planned_core(out, "none")
    assert dense_towers.ready_info.linear_kernels["encoder linears"] == "dense"


@pytest.mark.parametrize("quantization", ["cpu_int4", "cpu_w8a8"])
def test_a_thinker_quantized_with_its_towers_loads_them_as_stored(omni, tmp_path, quantization):
    """`edge-infer quantize --towers` stores the towers' linears as codes too: the file shrinks by their share, and
    they load on the decoder's kernel (what --encoder-quantization auto picks for them) to the model that quantizing
    them on load gives."""
    quant = QuantConfig.named(quantization)
    _, on_load = planned_core(omni, "same", quantization=quantization)
    plain = quantize_checkpoint(omni, tmp_path / "plain", quant)
    stored = quantize_checkpoint(omni, tmp_path / "towers", quant, towers=True)
    assert stored.quantized_tensors > plain.quantized_tensors and stored.written_bytes < plain.written_bytes
    assert json.loads((stored.out_dir / "config.json").read_text())["quantization_config"]["towers"] is True
    plan, exported = planned_core(stored.out_dir, None)
    assert plan.settings["encoder_quantization"] == "same"
    assert any("towers are stored as" in note for note in plan.notes)
    assert exported.ready_info.linear_kernels == on_load.ready_info.linear_kernels
    assert plan.weight_bytes == exported.ready_info.weight_bytes == exported.model.resident_bytes()
    prompt = Prompt(mm_config("qwen2_5_omni")).text([5, 6]).image((1, 4, 6)).text([7]).audio(60).text([8, 9])
    media = media_inputs(prompt, seed=4)
    assert torch.equal(exported.score(prompt.ids, media), on_load.score(prompt.ids, media))


def test_towers_stored_as_codes_do_not_load_dense(omni, tmp_path):
    out = quantize_checkpoint(omni, tmp_path / "q", QuantConfig.named("cpu_int4"), towers=True).out_dir
    plan = plan_text_session(out, encoder_quantization="none", **SETTINGS)
    assert not plan.admitted
    assert any("--encoder-quantization none" in r and "use --encoder-quantization same" in r for r in plan.reasons)


def test_a_text_model_has_no_towers_to_quantize(hf_checkpoints, tmp_path, capsys):
    assert main(["quantize", str(hf_checkpoints["qwen2"]), str(tmp_path / "q"), "--towers"]) == 2
    assert "has no media towers to quantize; drop --towers" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
