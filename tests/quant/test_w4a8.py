"""cpu_w4a8: the int4 x int8 kernel on bare matrices, and the fused decode layer against the PyTorch layer."""
from __future__ import annotations


import pytest
import torch

import testutil

from edge_infer.engine.attention import AttentionMetadata, build_seq_attention
from edge_infer.engine.config import QuantConfig
from edge_infer.engine.kv_cache import KVCache, KVLayout
from edge_infer.quant.quantize import dequantize_rows
from edge_infer.quant.sizes import GROUP_SIZES, int4_nbytes
from edge_infer.quant.w4a8 import missing_requirement

pytestmark = pytest.mark.skipif(missing_requirement() is not None, reason=str(missing_requirement()))


def packed(weight: torch.Tensor, group_size: int, symmetric: bool, dtype: torch.dtype, block_rows: int = 128):
    from edge_infer.quant.w4a8 import W4A8Kernel

    return testutil.packed_kernel(W4A8Kernel, weight, group_size, symmetric, dtype, block_rows)


def int8_bound(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per output, the most 8-bit activations can move it: half a step per group, times sum |w| of the group."""
    xs = x.float().view(x.shape[0], -1, group_size)
    half_step = xs.abs().amax(-1) / 127 / 2  # [M, groups]
    w_abs = w.abs().view(w.shape[0], -1, group_size).sum(-1)  # [N, groups]
    return half_step @ w_abs.T


@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_w4a8_matmul_is_within_the_int8_activation_bound(group_size, symmetric, dtype):
    torch.manual_seed(group_size)
    weight = torch.randn(200, 2 * group_size + 24) * 0.05  # rows: a partial tile; columns: padded to the group
    kernel, q = packed(weight, group_size, symmetric, dtype)
    w = dequantize_rows(q, group_size)
    for rows in (1, 7):
        x = torch.randn(rows, weight.shape[1]).to(dtype)
        out = kernel(x)
        assert out.shape == (rows, 200) and out.dtype == dtype
        xp = torch.nn.functional.pad(x.float(), (0, w.shape[1] - weight.shape[1]))
        ref = xp @ w.T
        # The int8 rounding bound, plus the output's own rounding (bf16: 2^-8 relative).
        rounding = ref.abs() * (2**-8 if dtype == torch.bfloat16 else 1e-5) + 1e-4
        assert bool(((out.float() - ref).abs() <= int8_bound(xp, w, group_size) + rounding).all())


def test_w4a8_sizes_and_rows_match_the_plan():
    """Resident bytes are what the planner counts; a packed row reads back as the codes it was given."""
    torch.manual_seed(3)
    weight = torch.randn(130, 200)
    kernel, q = packed(weight, 64, False, torch.float32)
    assert kernel.nbytes == int4_nbytes(130, 200, QuantConfig(group_size=64, int8_activations=True), 4)
    ids = torch.tensor([0, 63, 64, 129])
    assert torch.equal(kernel.rows(ids), dequantize_rows(q, 64, 200)[ids])


def test_a_nan_activation_reaches_the_outputs_instead_of_vanishing():
    kernel, _ = packed(torch.randn(64, 128), 32, True, torch.bfloat16)
    x = torch.randn(2, 128).to(torch.bfloat16)
    x[0, 5] = float("nan")
    out = kernel(x)
    assert bool(out[0].isnan().all()) and bool(out[1].isfinite().all())


def test_w4a8_refuses_a_weight_that_does_not_fit():
    kernel, _ = packed(torch.randn(64, 128), 32, True, torch.float32)
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.edge_infer.w4a8_linear(torch.randn(1, 96), kernel.packed, kernel.scales_zeros, 32, 64)


# Fused decode layer ----------------------------------------------------------------------------------------

# head_dim 16 (llama, qwen2 with q/k/v bias) and 32 (qwen3 with q/k norms): the fused layer takes multiples of 16.
FUSED_FAMILIES = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 32}}


@pytest.fixture(scope="module", params=sorted(FUSED_FAMILIES))
def w4a8_model(request, tmp_path_factory):
    from testutil import write_hf_checkpoint

    family = request.param
    path = write_hf_checkpoint(tmp_path_factory.mktemp("w4a8") / family, family, **FUSED_FAMILIES[family])
    return family, path


def cache_for(model) -> KVCache:
    cfg = model.cfg
    return KVCache(KVLayout(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 2, 16), 8, torch.bfloat16)


def decode(model, cache: KVCache, ids: list[int], past: list[int], blocks: list[list[int]], fused: bool) -> torch.Tensor:
    """One decode step of len(ids) sequences with ``past`` cached tokens each."""
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    slots = torch.tensor([b[p // 16] * 16 + p % 16 for p, b in zip(past, blocks)])
    meta = AttentionMetadata(slots, [build_seq_attention(i, 1, p + 1, b, 16, group, None)
                                     for i, (p, b) in enumerate(zip(past, blocks))])
    model.fused_decode = None if fused else False
    out = model.decode(model.embed_tokens(torch.tensor(ids)), torch.tensor(past), meta, cache)
    assert model.fused_decode is fused
    return out


def prefill(model, cache: KVCache, ids: torch.Tensor, blocks: list[int]) -> None:
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    n = len(ids)
    meta = AttentionMetadata(torch.tensor([blocks[i // 16] * 16 + i % 16 for i in range(n)]),
                             [build_seq_attention(0, n, n, blocks, 16, group, None)])
    model.fused_decode = False
    model.decode(model.embed_tokens(ids), torch.arange(n), meta, cache)


def test_fused_decode_of_first_tokens_is_bit_exact(w4a8_model, make_core):
    """With one key per sequence attention is exact, so the fused layer must equal the PyTorch layer bit for bit:
    norms, q/k/v (and bias), q/k norms, RoPE, cache writes, products, SiLU and residuals round alike."""
    _, path = w4a8_model
    model = make_core(path, "cpu_w4a8").model
    results = []
    for fused in (False, True):
        cache = cache_for(model)
        out = decode(model, cache, [5, 77, 300], [0, 0, 0], [[0], [1], [3]], fused)
        results.append((out, cache.storage.clone()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_fused_decode_is_as_accurate_as_the_pytorch_path(w4a8_model, make_core):
    """Over a longer, paged context the two paths round attention differently (and 8-bit activations amplify
    that); each must stay as close to the same int4 weights with bf16 activations (cpu_int4) as the other."""
    _, path = w4a8_model
    reference, model = make_core(path, "cpu_int4").model, make_core(path, "cpu_w4a8").model
    torch.manual_seed(0)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,)) for n in (20, 7)]
    blocks = [[0, 1, 2], [5, 3]]
    errors = {}
    for name, m, fused in (("reference", reference, False), ("pytorch", model, False), ("fused", model, True)):
        cache = cache_for(m)
        for ids, b in zip(prompts, blocks):
            prefill(m, cache, ids, b)
        errors[name] = decode(m, cache, [11, 42], [20, 7], blocks, fused).float()
    ref = errors.pop("reference")
    err = {k: (v - ref).norm() / ref.norm() for k, v in errors.items()}
    assert err["fused"] < 1.5 * err["pytorch"] + 1e-3, err
    assert err["fused"] < 0.08, err


def test_fused_layer_refuses_a_slot_outside_the_cache(w4a8_model, make_core):
    _, path = w4a8_model
    model = make_core(path, "cpu_w4a8").model
    cache = cache_for(model)
    with pytest.raises(RuntimeError, match="outside the cache"):
        decode(model, cache, [5], [0], [[8]], fused=True)  # block 8 of an 8-block cache


def test_fused_decode_is_not_used_for_tinygemm_weights(w4a8_model, make_core):
    _, path = w4a8_model
    model = make_core(path, "cpu_int4").model
    cache = cache_for(model)
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    meta = AttentionMetadata(torch.tensor([0]), [build_seq_attention(0, 1, 1, [0], 16, group, None)])
    model.decode(model.embed_tokens(torch.tensor([5])), torch.tensor([0]), meta, cache)
    assert model.fused_decode is False


def test_the_cli_flags_reach_the_engine_as_w4a8_kernels(tied_model):
    import argparse

    from edge_infer.engine.cli_args import add_engine_args, engine_settings
    from edge_infer.engine.core import EngineCore
    from edge_infer.memory.plan import plan_text_session

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    flags = [str(tied_model), "--dtype", "bfloat16", "--max-model-len", "128", "--kv-cache-memory-bytes", str(1 << 20),
             "--quantization", "cpu_w4a8", "--group-size", "32", "--quantize-head"]
    plan = plan_text_session(tied_model, **engine_settings(parser.parse_args(flags)))
    assert plan.settings["quantization"] == "cpu_w4a8 g32 sym +head"
    core = EngineCore(plan.engine_config)
    assert {lin.kernel.name for _, lin in core.model.linears()} == {"cpu-w4a8"}
    assert core.ready_info.weight_bytes == plan.item("weights")
