"""edge-infer's bf16 attention (quant/csrc/attention*.cpp) against an fp32 reference and PyTorch's SDPA, the
bit-for-bit independence of a row from how its rows were grouped, and the engine paths that take it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from edge_infer.hardware.cpu import detect
from edge_infer.hardware.kernels import BF16_ATTENTION
from edge_infer.models.layers import native_ops
from edge_infer.quant.native import bf16_attention_available

pytestmark = pytest.mark.skipif(not bf16_attention_available(),
                                reason=BF16_ATTENTION.missing(detect()) or "the library was built without AVX512-BF16")
BF16 = torch.bfloat16


def attend(q, k, v, q_offsets, k_offsets, causal=False, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return native_ops.segment_attention(q, k, v, q_offsets, k_offsets, causal, scale)


def reference(q, k, v, q_offsets, k_offsets, causal=False, dtype=torch.float32):
    """Per segment, SDPA on ``dtype`` copies (fp32: the reference; bf16: what the engine ran before)."""
    out = torch.empty(q.shape, dtype=dtype)
    group = q.shape[1] // k.shape[1]
    for s in range(len(q_offsets) - 1):
        qs = q[q_offsets[s]:q_offsets[s + 1]].to(dtype).transpose(0, 1)
        ks, vs = (t[k_offsets[s]:k_offsets[s + 1]].to(dtype).transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        mask = None
        if causal:
            q_len, k_len = qs.shape[1], ks.shape[1]
            mask = torch.arange(k_len)[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
        out[q_offsets[s]:q_offsets[s + 1]] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1)
    return out


def offsets(lengths):
    return [0] + torch.tensor(lengths).cumsum(0).tolist()


def random(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


CASES = {  # (query lengths, key lengths or None for the same, heads, kv heads, head_dim, causal)
    "vit-windows": ([64] * 6 + [16, 40, 1], None, 4, 4, 80, False),
    "vit-frame": ([300], None, 2, 2, 80, False),
    "audio-chunks": ([50, 50, 13], None, 3, 3, 64, False),
    "prompt-gqa": ([37], [37], 8, 2, 128, True),
    "chunk-after-cache": ([21], [90], 6, 3, 64, True),
    "decode-heads": ([1], [77], 7, 1, 64, True),
    "small-head": ([9], [9], 2, 1, 16, True),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_an_fp32_reference_as_closely_as_pytorchs_bf16_attention(case):
    q_lens, k_lens, heads, kv_heads, d, causal = CASES[case]
    qo = offsets(q_lens)
    ko = offsets(k_lens) if k_lens else qo
    q, k, v = random(qo[-1], heads, d, seed=1), random(ko[-1], kv_heads, d, seed=2), random(ko[-1], kv_heads, d, seed=3)
    out = attend(q, k, v, qo, ko, causal)
    assert out.dtype == BF16 and out.shape == q.shape
    exact = reference(q, k, v, qo, ko, causal)
    ours = (out.float() - exact).abs().max().item()
    pytorch = (reference(q, k, v, qo, ko, causal, BF16).float() - exact).abs().max().item()
    assert ours <= 2 * pytorch + 1e-3, (ours, pytorch)


def test_a_row_gets_the_same_bits_alone_in_chunks_or_in_a_whole_prompt():
    """Prefill in one chunk, in chunks of 5 against the growing cache, and one query at a time (decode steps,
    which read the keys in place rather than packed): the same bits, so recomputing a preempted sequence or
    reusing cached blocks changes no token."""
    n, heads, kv_heads, d = 43, 8, 2, 64
    q, k, v = random(n, heads, d, seed=4), random(n, kv_heads, d, seed=5), random(n, kv_heads, d, seed=6)
    whole = attend(q, k, v, [0, n], [0, n], causal=True)
    chunks = torch.cat([attend(q[i:i + 5], k[:i + 5], v[:i + 5], [0, min(5, n - i)], [0, min(i + 5, n)], causal=True)
                        for i in range(0, n, 5)])
    single = torch.cat([attend(q[i:i + 1], k[:i + 1], v[:i + 1], [0, 1], [0, i + 1], causal=True) for i in range(n)])
    assert torch.equal(whole, chunks) and torch.equal(whole, single)


def test_segments_attend_only_within_themselves():
    q, k, v = random(30, 2, 32, seed=7), random(30, 2, 32, seed=8), random(30, 2, 32, seed=9)
    together = attend(q, k, v, [0, 10, 30], [0, 10, 30])
    k2 = k.clone()
    k2[10:] = random(20, 2, 32, seed=10)
    changed = attend(q, k2, v, [0, 10, 30], [0, 10, 30])
    assert torch.equal(together[:10], changed[:10]) and not torch.equal(together[10:], changed[10:])
    assert torch.equal(together[:10], attend(q[:10], k[:10], v[:10], [0, 10], [0, 10]))


def test_a_nan_key_reaches_exactly_the_rows_that_see_it():
    q, k, v = random(12, 2, 32, seed=11), random(12, 1, 32, seed=12), random(12, 1, 32, seed=13)
    k[6, 0, 3] = math.nan
    out = attend(q, k, v, [0, 12], [0, 12], causal=True)
    assert torch.isfinite(out[:6]).all() and out[6:].isnan().all()


@pytest.mark.parametrize("bad, message", [
    (lambda q, k, v: (q[..., :24], k[..., :24], v[..., :24]), "not a multiple of 16"),
    (lambda q, k, v: (q.float(), k, v), "must be bf16"),
    (lambda q, k, v: (q[:, :3], k, v), "3 query heads over 2"),
])
def test_operands_it_cannot_take_are_refused_by_name(bad, message):
    q, k, v = bad(random(4, 4, 32), random(4, 2, 32), random(4, 2, 32))
    with pytest.raises(RuntimeError, match=message):
        attend(q, k, v, [0, 4], [0, 4])


def test_the_encoders_and_paged_attention_take_it_only_when_enabled(monkeypatch):
    """Segments (the media encoders) and paged attention route bf16 through the kernel once enabled and give
    what PyTorch's SDPA gives within bf16 rounding; fp32 keeps SDPA."""
    from edge_infer.models.layers.attention import AttentionMetadata, build_seq_attention, paged_attention
    from edge_infer.models.layers.segments import Segments

    calls = []
    real = native_ops.segment_attention
    monkeypatch.setattr(native_ops, "segment_attention", lambda *a: calls.append(a) or real(*a))
    q, k, v = random(20, 4, 32, seed=14), random(20, 4, 32, seed=15), random(20, 4, 32, seed=16)
    segments = Segments([8, 0, 12])
    cache_k, cache_v = k.view(5, 4, 4, 32), v.view(5, 4, 4, 32)  # 5 blocks of 4 tokens
    meta = AttentionMetadata(torch.arange(20), [build_seq_attention(0, 20, 20, list(range(5)), 4, 1, None)])
    results = {}
    for on in (False, True):
        monkeypatch.setattr(native_ops, "_attention", on)
        results[on] = (segments.attend(q, k, v), paged_attention(q, cache_k, cache_v, meta, 32 ** -0.5).view(20, 4, 32))
        assert len(calls) == (2 if on else 0)
        segments.attend(q.float(), k.float(), v.float())
        assert len(calls) == (2 if on else 0)
    for sdpa, ours in zip(results[False], results[True]):
        assert (sdpa.float() - ours.float()).abs().max() < 2e-2


def test_a_cpu_with_amx_bf16_keeps_sdpa_and_others_take_the_kernel(monkeypatch):
    """With AMX-BF16, SDPA's products run on the tile unit and are faster, so the engine routes nothing to the
    kernel there (it still runs, and the tests above still check it); elsewhere it takes bf16 attention."""
    import dataclasses

    from edge_infer.quant import native

    monkeypatch.setattr(native_ops, "_attention", False)
    cpu = detect()
    for features, routed in ((cpu.features | {"amx_bf16"}, False), (cpu.features - {"amx_bf16"}, True)):
        monkeypatch.setattr(native, "detect", lambda f=features: dataclasses.replace(cpu, features=frozenset(f)))
        assert native.bf16_attention_preferred() is routed
        native.enable_native_ops(BF16)
        assert native_ops.attention_runs(torch.zeros(4, 2, 32, dtype=BF16)) is routed
