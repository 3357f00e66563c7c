"""Quantize -> write -> load: round trip, one packed copy, auto-detection, on-load == exported."""
from __future__ import annotations

import json

import pytest
import torch

from edge_infer.config import QuantConfig
from edge_infer.models.layers.linear import DenseKernel
from edge_infer.quant.export import quantize_checkpoint
from edge_infer.quant.install import SCALE_SUFFIX, ZERO_SUFFIX
from edge_infer.quant.kernel import Int4Kernel
from edge_infer.quant.quantize import QuantizedRows, dequantize_rows, unpack_nibbles
from edge_infer.quant.sizes import GROUP_SIZES
from edge_infer.quant.native import missing_requirement

PROMPT = [5, 17, 99, 3, 250, 41, 7, 300, 2]


def stored_weight(model_dir, name: str, group_size: int, symmetric: bool, cols: int) -> torch.Tensor:
    """The weight a quantized checkpoint's codes stand for, decoded straight from the file."""
    from safetensors.torch import load_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    scales = tensors[name + SCALE_SUFFIX]
    zeros = torch.zeros_like(scales) if symmetric else tensors[name + ZERO_SUFFIX]
    return dequantize_rows(QuantizedRows(unpack_nibbles(tensors[name]), scales, zeros), group_size, cols)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_loaded_int4_linear_equals_dequantized_checkpoint_matmul(tmp_path, untied_model, make_core, group_size, symmetric):
    quant = QuantConfig(group_size=group_size, symmetric=symmetric)
    out = quantize_checkpoint(untied_model, tmp_path / "q", quant).out_dir
    core = make_core(out, dtype="float32")
    layer = core.model.layers[1]
    assert isinstance(layer.down.kernel, Int4Kernel)
    cfg = core.model.cfg
    w = stored_weight(out, "model.layers.1.mlp.down_proj.weight", group_size, symmetric, cfg.intermediate_size)
    x = torch.randn(5, cfg.intermediate_size)
    assert torch.allclose(layer.down(x), x @ w.T, atol=1e-4, rtol=1e-4)
    # The fused q/k/v linear stacks three stored tensors.
    qkv = torch.cat([
        stored_weight(out, f"model.layers.1.self_attn.{p}_proj.weight", group_size, symmetric, cfg.hidden_size) for p in "qkv"
    ])
    x = torch.randn(3, cfg.hidden_size)
    assert torch.allclose(layer.qkv.kernel(x), x @ qkv.T, atol=1e-4, rtol=1e-4)


needs_int8_kernels = pytest.mark.skipif(missing_requirement() is not None, reason=str(missing_requirement()))


@pytest.mark.parametrize("quant", [
    pytest.param(QuantConfig(group_size=32), id="g32-sym"),
    pytest.param(QuantConfig(group_size=64, symmetric=False, quantize_head=True), id="g64-asym-head"),
    pytest.param(QuantConfig.named("cpu_w8a8", group_size=64, quantize_head=True), id="8bit-g64-head",
                 marks=needs_int8_kernels),
])
@pytest.mark.parametrize("family", ["tied", "untied"])
def test_exported_checkpoint_loads_to_the_same_model_as_quantizing_on_load(
    tmp_path, tied_model, untied_model, make_core, greedy, quant, family
):
    src = tied_model if family == "tied" else untied_model
    out = quantize_checkpoint(src, tmp_path / "q", quant).out_dir
    on_load = make_core(src, quant)
    exported = make_core(out)  # no quantization argument: read from config.json
    assert exported.plan.engine_config.quant == quant
    assert exported.ready_info.weight_kernels == on_load.ready_info.weight_kernels
    assert torch.equal(exported.score(PROMPT), on_load.score(PROMPT))
    tokens = greedy(exported, PROMPT)
    assert tokens == greedy(on_load, PROMPT)
    if quant.bits == 4:
        assert tokens != greedy(make_core(src), PROMPT), "int4 should change this wide-init model's output"


def kernel_class(quant: QuantConfig) -> type:
    if quant.tiles:
        from edge_infer.quant.int8_kernels import W4A8Kernel, W4A16Kernel, W8A8Kernel

        return W8A8Kernel if quant.bits == 8 else W4A8Kernel if quant.int8_activations else W4A16Kernel
    return Int4Kernel


@pytest.mark.parametrize("quant", [
    pytest.param(QuantConfig(group_size=32), id="int4-g32"),
    pytest.param(QuantConfig(group_size=128, symmetric=False, quantize_head=True), id="int4-g128-asym-head"),
    pytest.param(QuantConfig.named("cpu_w4a8", group_size=64), id="w4a8-g64", marks=needs_int8_kernels),
    pytest.param(QuantConfig.named("cpu_w4a8", group_size=32, quantize_head=True), id="w4a8-g32-head",
                 marks=needs_int8_kernels),
    pytest.param(QuantConfig.named("cpu_w8a8", group_size=32, quantize_head=True), id="w8a8-g32-head",
                 marks=needs_int8_kernels),
    pytest.param(QuantConfig.named("cpu_w4a16", group_size=64, symmetric=False, quantize_head=True),
                 id="w4a16-g64-asym-head", marks=needs_int8_kernels),
])
@pytest.mark.parametrize("family", ["tied", "untied"])
def test_resident_weight_bytes_equal_the_plan_and_no_dense_copy_survives(tied_model, untied_model, make_core, quant, family):
    core = make_core(tied_model if family == "tied" else untied_model, quant)
    model = core.model
    assert core.ready_info.weight_bytes == core.plan.item("weights")
    # Count real storage, not what the kernels say about themselves.
    tensors = [model.final_norm] + ([model.embed] if model.embed is not None else [])
    for layer in model.layers:
        tensors += [t for t in (layer.input_norm, layer.post_attention_norm, layer.q_norm, layer.k_norm) if t is not None]
    opaque = 0  # oneDNN's blocked bf16 weight (an unquantized untied head) has no plain storage to inspect
    for _, lin in model.linears():
        tensors += [lin.bias] if lin.bias is not None else []
        kernel = lin.kernel
        if isinstance(kernel, kernel_class(quant)):
            tensors += list(kernel.resident())
        elif isinstance(kernel, DenseKernel):
            tensors.append(kernel.weight)
        else:
            opaque += kernel.nbytes
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    assert sum(storages.values()) + opaque == core.plan.item("weights")
    layer_kernels = {type(lin.kernel) for name, lin in model.linears() if name.startswith("layers.")}
    assert layer_kernels == {kernel_class(quant)}
    if quant.quantize_head:
        assert isinstance(model.lm_head.kernel, kernel_class(quant))
        if family == "tied":
            assert model.embed is None, "a quantized tied head must be the only copy of the embedding table"


@pytest.mark.parametrize("method", [pytest.param("cpu_int4"), pytest.param("cpu_w4a8", marks=needs_int8_kernels),
                                    pytest.param("cpu_w8a8", marks=needs_int8_kernels),
                                    pytest.param("cpu_w4a16", marks=needs_int8_kernels)])
def test_quantized_tied_head_serves_embedding_rows(tied_model, make_core, method):
    quant = QuantConfig.named(method, group_size=32, symmetric=method == "cpu_w8a8",
                              quantize_head=True)
    core = make_core(tied_model, quant, dtype="float32")
    kernel = core.model.lm_head.kernel
    ids = torch.tensor([0, 7, 300, core.model.cfg.vocab_size - 1])
    # Row i of the head, read through the matmul with one-hot inputs, is the embedding of token i.
    eye = torch.eye(core.model.cfg.hidden_size)
    head_rows = kernel(eye).T[ids]
    assert torch.allclose(core.model.embed_tokens(ids), head_rows, atol=1e-5)


def test_quantized_checkpoint_is_auto_detected_by_the_plan(tmp_path, tied_model):
    from edge_infer.memory.plan import plan_text_session

    out = quantize_checkpoint(tied_model, tmp_path / "q", QuantConfig(group_size=64, symmetric=False)).out_dir
    raw = json.loads((out / "config.json").read_text())["quantization_config"]
    assert raw["quant_method"] == "cpu_int4" and raw["group_size"] == 64 and raw["symmetric"] is False
    plan = plan_text_session(out, dtype="bfloat16", max_model_len=128)
    assert plan.settings["quantization"] == "cpu_int4 g64 asym"
    assert plan.item("weights") == plan_text_session(tied_model, quantization=QuantConfig(group_size=64, symmetric=False),
                                                     dtype="bfloat16", max_model_len=128).item("weights")
    assert plan.item("weights") < plan_text_session(tied_model, dtype="bfloat16", max_model_len=128).item("weights")


def test_planning_a_quantized_checkpoint_does_not_import_torch(tmp_path, tied_model):
    import subprocess
    import sys

    out = quantize_checkpoint(tied_model, tmp_path / "q", QuantConfig(group_size=32, quantize_head=True)).out_dir
    code = (
        "import sys; from edge_infer.memory.plan import plan_text_session; "
        f"p = plan_text_session({str(out)!r}); assert 'torch' not in sys.modules, 'torch imported'; "
        "print(p.settings['quantization'])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "cpu_int4 g32 sym +head"


def test_sharded_output_loads_like_a_single_file(tmp_path, untied_model, make_core):
    quant = QuantConfig(group_size=32, symmetric=False)
    single = quantize_checkpoint(untied_model, tmp_path / "one", quant).out_dir
    sharded = quantize_checkpoint(untied_model, tmp_path / "many", quant, shard_bytes=64 << 10).out_dir
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert torch.equal(make_core(sharded).score(PROMPT), make_core(single).score(PROMPT))


@needs_int8_kernels
def test_a_quantized_checkpoint_loads_with_int8_activations_on_request(tmp_path, tied_model, make_core):
    """cpu_w4a8 is a kernel choice: the stored cpu_int4 weights load into the W4A8 kernel, format settings kept."""
    from edge_infer.memory.plan import plan_text_session

    out = quantize_checkpoint(tied_model, tmp_path / "q", QuantConfig(group_size=64, symmetric=False)).out_dir
    plan = plan_text_session(out, quantization="cpu_w4a8", dtype="bfloat16", max_model_len=128)
    assert plan.settings["quantization"] == "cpu_w4a8 g64 asym"
    assert plan.engine_config.quant == QuantConfig(group_size=64, symmetric=False, kernel="int8")
    core = make_core(out, "cpu_w4a8")
    assert core.ready_info.weight_bytes == core.plan.item("weights")
    assert {lin.kernel.name for name, lin in core.model.linears() if name.startswith("layers.")} == {"cpu-w4a8"}


@needs_int8_kernels
def test_a_quantized_checkpoint_loads_on_the_w4a16_tiles_on_request(tmp_path, tied_model, make_core, greedy):
    """cpu_w4a16 is a kernel choice too: the stored codes load into edge-infer's tiles, and the model scores as on
    PyTorch's int4 kernel to within float rounding (no activation quantization), where W4A8 moves further."""
    from edge_infer.memory.plan import plan_text_session

    out = quantize_checkpoint(tied_model, tmp_path / "q", QuantConfig(group_size=64, symmetric=False)).out_dir
    plan = plan_text_session(out, quantization="cpu_w4a16", dtype="bfloat16", max_model_len=128)
    assert plan.settings["quantization"] == "cpu_w4a16 g64 asym"
    assert plan.engine_config.quant == QuantConfig(group_size=64, symmetric=False, kernel="w4a16")
    cores = {method: make_core(out, method, dtype="float32") for method in ("cpu_w4a16", "cpu_int4", "cpu_w4a8")}
    core = cores["cpu_w4a16"]
    assert core.ready_info.weight_bytes == core.plan.item("weights")
    assert {lin.kernel.name for name, lin in core.model.linears() if name.startswith("layers.")} == {"cpu-w4a16"}
    scores = {method: c.score(PROMPT) for method, c in cores.items()}
    assert torch.allclose(scores["cpu_w4a16"], scores["cpu_int4"], atol=1e-4)
    assert not torch.allclose(scores["cpu_w4a8"], scores["cpu_int4"], atol=1e-4)
    assert greedy(core, PROMPT) == greedy(cores["cpu_int4"], PROMPT)


@needs_int8_kernels
def test_an_8bit_checkpoint_names_its_format_and_loads_on_w8a8_only(tmp_path, tied_model, make_core):
    from edge_infer.errors import InvalidRequestError
    from edge_infer.memory.plan import plan_text_session

    out = quantize_checkpoint(tied_model, tmp_path / "q8", QuantConfig.named("cpu_w8a8", group_size=32)).out_dir
    raw = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (raw["quant_method"], raw["bits"], raw["symmetric"]) == ("cpu_int8", 8, True)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        codes = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 127
    plan = plan_text_session(out, dtype="bfloat16", max_model_len=128)
    assert plan.settings["quantization"] == "cpu_w8a8 g32 sym"
    for wrong in ("cpu_int4", "cpu_w4a8"):
        with pytest.raises(InvalidRequestError, match="8-bit cpu_int8 weights, which load with --quantization cpu_w8a8"):
            plan_text_session(out, quantization=wrong, max_model_len=128)
    core = make_core(out)
    assert {lin.kernel.name for name, lin in core.model.linears() if name.startswith("layers.")} == {"cpu-w8a8"}


@needs_int8_kernels
@pytest.mark.parametrize("method", ["cpu_w4a8", "cpu_w8a8", "cpu_w4a16"])
def test_a_checkpoint_gives_the_same_tokens_on_every_isa_variant(tmp_path, tied_model, make_core, greedy, method):
    """The int8 kernels are bit-compatible across ISA variants (the harness checks NEON under qemu too), so a
    checkpoint written on one machine computes the same logits and greedy tokens on AVX2, AVX-VNNI, AVX-512 and
    NEON machines: here every variant this CPU runs, and the scalar reference."""
    from testutil import on_variant, runnable_variants

    out = quantize_checkpoint(tied_model, tmp_path / "q", QuantConfig.named(method, group_size=32)).out_dir
    core = make_core(out, method)
    results = {}
    for variant in runnable_variants():
        on_variant(core.model, variant)
        results[variant] = (core.score(PROMPT), greedy(core, PROMPT))
    first = next(iter(results.values()))
    assert all(torch.equal(s, first[0]) and t == first[1] for s, t in results.values()), list(results)


@pytest.mark.parametrize("method", ["cpu_w4a8", "cpu_w4a16", "cpu_w8a8"])
def test_edge_infers_kernels_are_refused_by_the_plan_where_they_cannot_be_built(tied_model, monkeypatch, method):
    """No library and no compiler: the plan refuses a kernel of edge-infer's library by name, with the reason,
    before anything loads (not a KernelUnavailableError half-way through loading)."""
    from edge_infer.memory.plan import plan_text_session
    from edge_infer.quant import native_build

    why = "no C++ compiler (c++ or $CXX) to build edge-infer's int8 kernels; install g++ or use cpu_int4"
    monkeypatch.setattr(native_build, "missing_toolchain", lambda: why)
    plan = plan_text_session(tied_model, quantization=method, max_model_len=128)
    assert not plan.admitted and any(f"--quantization {method}: {why}" in r for r in plan.reasons), plan.reasons


def test_a_config_naming_no_kernel_of_ours_is_refused_by_name():
    from edge_infer.errors import InvalidRequestError
    from edge_infer.quant.sizes import check_quant_config

    with pytest.raises(InvalidRequestError, match="kernel 'vnni' is not one of .*cpu_int4, cpu_w4a16, cpu_w4a8"):
        QuantConfig(kernel="vnni")
    with pytest.raises(InvalidRequestError, match="8-bit weights .* run on cpu_w8a8"):
        check_quant_config(QuantConfig(bits=8, kernel="w4a16"))
