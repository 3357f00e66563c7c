"""The 16-bit path: a bf16 or fp16 checkpoint run with float32 activations keeps its weights at 2 bytes (W16A32)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from testutil import require_built, runnable_variants

from edge_infer.memory.plan import plan_text_session
from edge_infer.quant.native import missing_requirement

pytestmark = pytest.mark.skipif(missing_requirement("cpu-w16a32") is not None,
                                reason=str(missing_requirement("cpu-w16a32")))
PROMPT = [5, 17, 99, 3, 250, 41, 7]


def as_16bit(src: Path, dst: Path, dtype: torch.dtype) -> Path:
    """A copy of checkpoint ``src`` with every tensor stored in ``dtype``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.to(dtype) for k, v in tensors.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def stored_16bit(request, hf_checkpoints, tmp_path_factory) -> dict[str, Path]:
    dtype = torch.bfloat16 if request.param == "bf16" else torch.float16
    root = tmp_path_factory.mktemp(request.param)
    return {family: as_16bit(hf_checkpoints[family], root / family, dtype) for family in ("qwen2", "llama")}


@pytest.mark.parametrize("variant", [v for v in runnable_variants() if v != "scalar"])
@pytest.mark.parametrize("storage", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_each_variant_equals_the_scalar_reference_and_fp32_math(variant, storage):
    from edge_infer.quant.widened import GEMM_ROWS, W16A32Kernel

    require_built(variant)
    torch.manual_seed(0)
    weight = torch.randn(150, 70).to(storage)  # a partial row tile
    kernels = {}
    for v in (variant, "scalar"):
        kernels[v] = W16A32Kernel(150, 70, storage, variant=v)
        kernels[v].write_rows(0, weight[:128])
        kernels[v].write_rows(128, weight[128:])
    for rows in (1, 5, 17):  # 17: past GEMM_ROWS, through PyTorch's GEMM on widened scratch
        x = torch.randn(rows, 70)
        out = kernels[variant](x)
        if rows < GEMM_ROWS:
            assert torch.equal(out, kernels["scalar"](x))
        assert torch.allclose(out, x @ weight.float().T, rtol=1e-5, atol=1e-5)
    ids = torch.tensor([0, 63, 64, 149])
    assert torch.equal(kernels[variant].rows(ids), weight[ids].float())


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # tied, untied
def test_a_16bit_checkpoint_in_float32_keeps_2_bytes_per_weight(stored_16bit, make_core, family):
    path = stored_16bit[family]
    core = make_core(path, dtype="float32")
    model, plan = core.model, core.plan
    assert core.ready_info.weight_bytes == plan.item("weights")
    assert {lin.kernel.name for _, lin in model.linears()} == {"cpu-w16a32"}
    # Real storage: 16-bit packed tiles, a 16-bit table (untied) or none (tied: the head holds it), fp32 norms.
    storages = [t for _, lin in model.linears() for t in lin.kernel.resident()] + [model.final_norm]
    storages += [model.embed] if model.embed is not None else []
    storages += [t for layer in model.layers for t in (layer.input_norm, layer.post_attention_norm) if t is not None]
    storages += [lin.bias for _, lin in model.linears() if lin.bias is not None]
    assert sum(t.untyped_storage().nbytes() for t in storages) == plan.item("weights")
    assert (model.embed is None) == model.cfg.tie_word_embeddings
    dense = plan_text_session(path, dtype="float32", weight_backend="dense", max_model_len=128)
    # Half the fp32 bytes, plus this tiny shape's row padding to whole 64-row tiles (real shapes have none).
    assert plan.item("weights") < 0.7 * dense.item("weights"), "the 16-bit path must not hold fp32 weights"
    # The same values as the row-major fp32 model: only the order of the sums differs.
    reference = make_core(path, dtype="float32", weight_backend="dense")
    assert torch.allclose(core.score(PROMPT), reference.score(PROMPT), rtol=1e-3, atol=1e-3)


def test_the_plan_names_the_16bit_path_and_refuses_it_where_it_does_not_apply(stored_16bit, hf_checkpoints):
    plan = plan_text_session(stored_16bit["qwen2"], dtype="float32", max_model_len=128)
    assert plan.kernels.kernel_for("decoder linears") == "cpu-w16a32" and "as stored (2 bytes)" in plan.table()
    assert plan.engine_config.weight_backend == "w16"
    fp32_checkpoint = plan_text_session(hf_checkpoints["qwen2"], dtype="float32", weight_backend="w16", max_model_len=128)
    assert not fp32_checkpoint.admitted and any("--weight-backend w16" in r for r in fp32_checkpoint.reasons)
