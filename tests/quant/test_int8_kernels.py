"""edge-infer's int8 kernels (cpu_w4a8, cpu_w8a8) on bare matrices, per ISA variant, and the fused decode layer
(those and cpu_w4a16) against the PyTorch layer. The standalone harness (test_isa_variants.py) checks the same
variants without PyTorch, and the ARM one under qemu."""
from __future__ import annotations

import pytest
import torch

import testutil
from testutil import on_variant, require_built, runnable_variants

from edge_infer.models.layers.attention import AttentionMetadata, build_seq_attention
from edge_infer.config import QuantConfig
from edge_infer.models.layers.kv_cache import KVCache, KVLayout
from edge_infer.quant.native import missing_requirement
from edge_infer.quant.quantize import dequantize_rows
from edge_infer.quant.sizes import GROUP_SIZES, quantized_nbytes

pytestmark = pytest.mark.skipif(missing_requirement() is not None, reason=str(missing_requirement()))
VARIANTS = runnable_variants()
# (bits, symmetric): the weight kinds the kernels take (8-bit weights are symmetric).
WEIGHTS = {"w4-sym": (4, True), "w4-asym": (4, False), "w8": (8, True)}


def packed(weight: torch.Tensor, group_size: int, bits: int, symmetric: bool, dtype: torch.dtype,
           variant: str | None = None, block_rows: int = 128):
    from edge_infer.quant.int8_kernels import W4A8Kernel, W8A8Kernel

    if variant is not None:
        require_built(variant)
    kernel_class = W8A8Kernel if bits == 8 else W4A8Kernel
    return testutil.packed_kernel(kernel_class, weight, group_size, symmetric, dtype, block_rows, bits=bits,
                                  variant=variant)


def int8_bound(x: torch.Tensor, w: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per output, the most 8-bit activations can move it: half a step per group, times sum |w| of the group."""
    xs = x.float().view(x.shape[0], -1, group_size)
    half_step = xs.abs().amax(-1) / 127 / 2  # [M, groups]
    w_abs = w.abs().view(w.shape[0], -1, group_size).sum(-1)  # [N, groups]
    return half_step @ w_abs.T


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "scalar"])
@pytest.mark.parametrize("weights", sorted(WEIGHTS))
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_each_isa_variant_equals_the_scalar_reference_bit_for_bit(variant, weights, group_size):
    """Partial row tiles, padded columns, fp32 and bf16; 1, 12, 17 and 150 activation rows: past the 16-row blocks,
    and on a tile unit (amx-int8) one row through the vector kernel, a full panel of 128 and partial blocks
    padded with rows of zeros (12 rows alone, the 17th, the 150th's block of 6)."""
    bits, symmetric = WEIGHTS[weights]
    torch.manual_seed(group_size + bits)
    weight = torch.randn(200, 2 * group_size + 24) * 0.05
    for dtype in (torch.float32, torch.bfloat16):
        kernel, _ = packed(weight, group_size, bits, symmetric, dtype, variant)
        reference, _ = packed(weight, group_size, bits, symmetric, dtype, "scalar")
        for rows in (1, 12, 17, 150):
            x = torch.randn(rows, weight.shape[1]).to(dtype)
            assert torch.equal(kernel(x), reference(x)), (variant, dtype, rows)


@pytest.mark.parametrize("weights", sorted(WEIGHTS))
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_int8_kernels_are_within_the_int8_activation_bound(weights, group_size, dtype):
    bits, symmetric = WEIGHTS[weights]
    torch.manual_seed(group_size)
    weight = torch.randn(200, 2 * group_size + 24) * 0.05  # rows: a partial tile; columns: padded to the group
    kernel, q = packed(weight, group_size, bits, symmetric, dtype)
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


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_bias_added_in_the_kernel_gives_the_bits_of_a_separate_add(variant):
    """A linear's bias goes in as each output tile is stored: the same bits as PyTorch adding it after (bf16:
    to the rounded product), for partial tiles and past the 16-row blocks; a bias of another dtype is refused."""
    for dtype in (torch.float32, torch.bfloat16):
        kernel, _ = packed(torch.randn(200, 96) * 0.05, 32, 4, False, dtype, variant)
        x, bias = torch.randn(17, 96).to(dtype), torch.randn(200).to(dtype)
        assert torch.equal(kernel(x, bias), kernel(x) + bias), dtype
    with pytest.raises(RuntimeError, match="bias must be 200 contiguous values of the activations' dtype"):
        kernel(x, bias.float())


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_input_short_of_whole_groups_is_taken_as_zero_padded(variant):
    """in_features not a multiple of the group (the 3B ViT's 3,420): the kernel quantizes the last group from a
    zero-padded copy, the bits of the input padded beforehand, without the copy of every row."""
    for dtype in (torch.float32, torch.bfloat16):
        kernel, _ = packed(torch.randn(70, 100) * 0.05, 32, 4, False, dtype, variant)
        x = torch.randn(19, 100).to(dtype)
        padded = torch.ops.edge_infer.int8_linear(torch.nn.functional.pad(x, (0, 28)), kernel.packed, kernel.scales, 4, 32,
                                                  70, kernel.variant)
        assert torch.equal(kernel(x), padded), dtype


@pytest.mark.parametrize("weights", sorted(WEIGHTS))
def test_int8_kernel_sizes_and_rows_match_the_plan(weights):
    """Resident bytes are what the planner counts; a packed row reads back as the codes it was given."""
    bits, symmetric = WEIGHTS[weights]
    torch.manual_seed(3)
    weight = torch.randn(130, 200)
    kernel, q = packed(weight, 64, bits, symmetric, torch.float32)
    quant = QuantConfig(bits=bits, group_size=64, symmetric=symmetric, kernel="int8")
    assert kernel.nbytes == quantized_nbytes(130, 200, quant, 4)
    assert kernel.nbytes == sum(t.untyped_storage().nbytes() for t in kernel.resident())
    ids = torch.tensor([0, 63, 64, 129])
    assert torch.equal(kernel.rows(ids), dequantize_rows(q, 64, 200)[ids])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bits", [4, 8])
def test_a_nan_activation_reaches_the_outputs_instead_of_vanishing(variant, bits):
    kernel, _ = packed(torch.randn(64, 128), 32, bits, True, torch.bfloat16, variant)
    x = torch.randn(3, 128).to(torch.bfloat16)
    x[0, 5] = float("nan")
    x[2, 100] = float("inf")
    out = kernel(x)
    assert bool(out[0].isnan().all()) and bool(out[1].isfinite().all()) and bool(out[2].isnan().all())


def test_int8_linear_refuses_a_weight_that_does_not_fit():
    kernel, _ = packed(torch.randn(64, 128), 32, 4, True, torch.float32)
    with pytest.raises(RuntimeError, match="columns"):
        torch.ops.edge_infer.int8_linear(torch.randn(1, 96), kernel.packed, kernel.scales, 4, 32, 64, kernel.variant)
    with pytest.raises(RuntimeError, match=r"must be contiguous int8"):  # 4-bit codes passed as 8-bit weights
        torch.ops.edge_infer.int8_linear(torch.randn(1, 128), kernel.packed, kernel.scales, 8, 32, 64, kernel.variant)
    with pytest.raises(RuntimeError, match="not built into this library"):
        torch.ops.edge_infer.int8_linear(torch.randn(1, 128), kernel.packed, kernel.scales, 4, 32, 64, "avx1024")


# Fused decode layer ----------------------------------------------------------------------------------------

# head_dim 16 (llama, qwen2 with q/k/v bias) and 32 (qwen3 with q/k norms): the fused layer takes multiples of 16.
FUSED_FAMILIES = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 32}}
METHODS = ("cpu_w4a8", "cpu_w8a8", "cpu_w4a16")


@pytest.fixture(scope="module", params=sorted(FUSED_FAMILIES))
def fused_model(request, tmp_path_factory):
    from testutil import write_hf_checkpoint

    family = request.param
    path = write_hf_checkpoint(tmp_path_factory.mktemp("fused") / family, family, **FUSED_FAMILIES[family])
    return family, path


def cache_for(model, blocks: int = 8) -> KVCache:
    cfg = model.cfg
    layout = KVLayout(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, model.dtype.itemsize, 16)
    return KVCache(layout, blocks, model.dtype)


def decode(model, cache: KVCache, ids: list[int], past: list[int], blocks: list[list[int]], fused: bool) -> torch.Tensor:
    """One decode step of len(ids) sequences with ``past`` cached tokens each."""
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    slots = torch.tensor([b[p // 16] * 16 + p % 16 for p, b in zip(past, blocks)])
    meta = AttentionMetadata(slots, [build_seq_attention(i, 1, p + 1, b, 16, group, None)
                                     for i, (p, b) in enumerate(zip(past, blocks))])
    model.fused_decode = None if fused else False
    out = model.run_layers(model.embed_tokens(torch.tensor(ids)), torch.tensor(past), meta, cache)
    assert model.fused_decode is fused
    return out


def prefill(model, cache: KVCache, ids: torch.Tensor, blocks: list[int]) -> None:
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    n = len(ids)
    meta = AttentionMetadata(torch.tensor([blocks[i // 16] * 16 + i % 16 for i in range(n)]),
                             [build_seq_attention(0, n, n, blocks, 16, group, None)])
    model.fused_decode = False
    model.run_layers(model.embed_tokens(ids), torch.arange(n), meta, cache)


@pytest.mark.parametrize("variant", VARIANTS[:-1])  # every serving variant this CPU runs
@pytest.mark.parametrize("method", METHODS)
def test_fused_decode_of_first_tokens_is_bit_exact(fused_model, make_core, method, variant):
    """With one key per sequence attention is exact, so the fused layer must equal the PyTorch layer bit for bit:
    norms, q/k/v (and bias), q/k norms, RoPE, cache writes, products, SiLU and residuals round alike."""
    _, path = fused_model
    model = on_variant(make_core(path, method).model, variant)
    results = []
    for fused in (False, True):
        cache = cache_for(model)
        out = decode(model, cache, [5, 77, 300], [0, 0, 0], [[0], [1], [3]], fused)
        results.append((out, cache.storage.clone()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def paged_decode(model, fused: bool) -> torch.Tensor:
    """A decode step of two sequences after prefills of 20 and 7 tokens over scattered cache blocks."""
    torch.manual_seed(0)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,)) for n in (20, 7)]
    blocks = [[0, 1, 2], [5, 3]]
    cache = cache_for(model)
    for ids, b in zip(prompts, blocks):
        prefill(model, cache, ids, b)
    return decode(model, cache, [11, 42], [20, 7], blocks, fused).float()


@pytest.mark.parametrize("method", METHODS)
def test_fused_decode_is_as_accurate_as_the_pytorch_path(fused_model, make_core, method):
    """Over a longer, paged context the two paths round attention differently (and 8-bit activations amplify
    that); each must stay as close to the same weights with fp32 activations as the other (cpu_int4 for 4-bit
    weights; for 8-bit, the PyTorch layer on dequantized weights, i.e. the unquantized model)."""
    _, path = fused_model
    reference = make_core(path, None if method == "cpu_w8a8" else "cpu_int4", dtype="float32").model
    model = make_core(path, method).model
    ref = paged_decode(reference, False)
    err = {name: (paged_decode(model, fused) - ref).norm() / ref.norm() for name, fused in (("pytorch", False), ("fused", True))}
    assert err["fused"] < 1.5 * err["pytorch"] + 1e-3, err
    assert err["fused"] < 0.08, err


@pytest.mark.parametrize("method", METHODS)
def test_fused_decode_of_an_fp32_model_equals_the_pytorch_layer_to_fp32_rounding(fused_model, make_core, method):
    """fp32 is what a CPU without native bf16 computes in (AVX2): its decode steps run in the fused layer too, and
    differ from the PyTorch layer only in the order of fp32 sums (norms, softmax) and in the exp polynomial (softmax,
    SiLU), over a paged context as on the first tokens."""
    _, path = fused_model
    model = make_core(path, method, dtype="float32").model
    pytorch, fused = paged_decode(model, False), paged_decode(model, True)
    assert (fused - pytorch).norm() / pytorch.norm() < 1e-5
    first = [decode(model, cache_for(model), [5, 77, 300], [0, 0, 0], [[0], [1], [3]], f) for f in (False, True)]
    assert (first[1] - first[0]).norm() / first[0].norm() < 1e-5


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("method", METHODS)
def test_the_fused_layer_gives_the_same_bits_on_every_variant(fused_model, make_core, method, dtype):
    """Every ISA variant sums and rounds alike (attention included), so decode outputs match bit for bit: a model
    gives the same tokens on AVX2, AVX-VNNI, AVX-512 and NEON."""
    _, path = fused_model
    model = make_core(path, method, dtype=dtype).model
    outputs = {v: paged_decode(on_variant(model, v), True) for v in VARIANTS}
    assert all(torch.equal(out, outputs["scalar"]) for out in outputs.values()), list(outputs)


@pytest.mark.parametrize("lengths", [(200, 150), (230,)], ids=["two-sequences", "one-sequence"])
def test_the_fused_layer_gives_the_same_bits_on_one_thread_and_two(fused_model, make_core, lengths):
    """Over a context long enough that attention is shared out by query head (one sequence's heads, a key/value
    head's group among them, split between the threads; or a sequence each) and the products by row tile, two
    threads must give the bits of one: a reply does not depend on the thread count."""
    _, path = fused_model
    model = make_core(path, "cpu_w4a8", max_model_len=256).model
    torch.manual_seed(0)
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,)) for n in lengths]
    blocks = [list(range(0, 30, 2)), list(range(1, 20, 2))][:len(lengths)]  # interleaved: each one's rows scattered
    threads = torch.get_num_threads()
    outputs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = cache_for(model, 32)
            for ids, b in zip(prompts, blocks):
                prefill(model, cache, ids, b)
            outputs.append(decode(model, cache, [11, 42][:len(lengths)], list(lengths), blocks, True))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outputs[0], outputs[1])


def test_fused_layer_refuses_a_slot_outside_the_cache(fused_model, make_core):
    _, path = fused_model
    model = make_core(path, "cpu_w4a8").model
    cache = cache_for(model)
    with pytest.raises(RuntimeError, match="outside the cache"):
        decode(model, cache, [5], [0], [[8]], fused=True)  # block 8 of an 8-block cache


def test_fused_decode_is_not_used_for_tinygemm_weights(fused_model, make_core):
    _, path = fused_model
    model = make_core(path, "cpu_int4").model
    cache = cache_for(model)
    group = model.cfg.num_attention_heads // model.cfg.num_key_value_heads
    meta = AttentionMetadata(torch.tensor([0]), [build_seq_attention(0, 1, 1, [0], 16, group, None)])
    model.run_layers(model.embed_tokens(torch.tensor([5])), torch.tensor([0]), meta, cache)
    assert model.fused_decode is False


@pytest.mark.parametrize("method", METHODS)
def test_the_cli_flags_reach_the_engine_as_tile_kernels(tied_model, method):
    import argparse

    from edge_infer.engine.cli_args import add_engine_args, engine_settings
    from edge_infer.engine.core import EngineCore
    from edge_infer.memory.plan import plan_text_session

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    flags = [str(tied_model), "--dtype", "bfloat16", "--max-model-len", "128", "--kv-cache-memory-bytes", str(1 << 20),
             "--quantization", method, "--group-size", "32", "--quantize-head"]
    plan = plan_text_session(tied_model, **engine_settings(parser.parse_args(flags)))
    assert plan.settings["quantization"] == f"{method} g32 sym +head"
    variant = plan.kernels.choices[0].variant
    assert variant == VARIANTS[0] and f"[{variant}]" in plan.table()
    core = EngineCore(plan.engine_config)
    assert {lin.kernel.name for _, lin in core.model.linears()} == {method.replace("_", "-")}
    assert core.ready_info.linear_kernels["decoder linears"] == f"{method.replace('_', '-')} [{variant}]"
    assert core.ready_info.weight_bytes == plan.item("weights")
