"""Attention over the paged KV cache.

The model's linears run on all scheduled tokens of a step at once (a flat
``[T, hidden]`` batch); attention is then done per sequence over that
sequence's cached keys and values. A sequence whose blocks are consecutive in
the pool is read as a plain view (no gather), which is the common case for a
single stream on an edge box.

Grouped-query attention is computed without repeating K/V: the query heads of
one KV group are folded into the query-length axis, so SDPA sees
``[kv_heads, group * q_len, head_dim]`` against ``[kv_heads, ctx, head_dim]``.
Where edge-infer's bf16 attention runs (``native_ops``) it takes bf16
queries, prompt chunks and single decode queries alike: a row computes the
same bits in either, so a sequence recomputed after preemption, or a prompt
reusing cached blocks, gets the tokens it would have got otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edge_infer.models.layers import native_ops
from edge_infer.models.layers.kv_cache import Int8KV


@dataclass
class SeqAttention:
    """One sequence's slice of a step."""

    q_start: int  # first row of this sequence in the flat token batch
    q_len: int  # tokens computed for it in this step
    ctx_len: int  # cached tokens after this step (past + new)
    blocks: torch.Tensor  # int64 block ids covering ctx_len tokens
    contiguous_from: int | None  # first block id when the blocks are consecutive
    mask: torch.Tensor | None  # bool [group * q_len, ctx] (True = attend), None when every key is visible
    window_start: int  # first key position visible to every query (sliding window); 0 otherwise
    windowed: bool  # a sliding window may hide keys from some queries (the mask is more than causal)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [T]: flat cache slot written by each new token
    seqs: list[SeqAttention]


def build_seq_attention(
    q_start: int,
    q_len: int,
    ctx_len: int,
    block_ids: list[int],
    block_size: int,
    group: int,
    sliding_window: int | None,
) -> SeqAttention:
    n_blocks = (ctx_len + block_size - 1) // block_size
    ids = block_ids[:n_blocks]
    contiguous = all(ids[i] + 1 == ids[i + 1] for i in range(len(ids) - 1))
    past = ctx_len - q_len
    # Keys every query may see start here; earlier keys are sliced off instead of masked.
    window_start = 0
    if sliding_window is not None:
        window_start = max(0, past + 1 - sliding_window)
    mask = None
    if q_len > 1:  # a single query sees every visible key; several need a causal (and window) mask
        q_pos = torch.arange(past, ctx_len).unsqueeze(1)
        k_pos = torch.arange(window_start, ctx_len).unsqueeze(0)
        allowed = k_pos <= q_pos
        if sliding_window is not None:
            allowed &= k_pos > q_pos - sliding_window
        mask = allowed.repeat(group, 1)
    return SeqAttention(
        q_start=q_start,
        q_len=q_len,
        ctx_len=ctx_len,
        blocks=torch.tensor(ids, dtype=torch.long),
        contiguous_from=ids[0] if contiguous and ids else None,
        mask=mask,
        window_start=window_start,
        windowed=sliding_window is not None,
    )


KVTensor = torch.Tensor | Int8KV


def write_kv(k_cache: KVTensor, v_cache: KVTensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store new keys/values ``[T, kv_heads, head_dim]`` at their cache slots."""
    if isinstance(k_cache, Int8KV):
        k_cache.write(slots, k)
        v_cache.write(slots, v)
        return
    n_kv, d = k.shape[1], k.shape[2]
    k_cache.view(-1, n_kv, d).index_copy_(0, slots, k)
    v_cache.view(-1, n_kv, d).index_copy_(0, slots, v)


def _cached(cache: KVTensor, seq: SeqAttention) -> torch.Tensor:
    """``[kv_heads, visible_ctx, head_dim]`` for one sequence (a view when contiguous and 16/32-bit)."""
    if isinstance(cache, Int8KV):
        return cache.read(seq.blocks, seq.contiguous_from)[seq.window_start : seq.ctx_len].transpose(0, 1)
    n_kv, d = cache.shape[2], cache.shape[3]
    if seq.contiguous_from is not None:
        start = seq.contiguous_from
        flat = cache[start : start + seq.blocks.numel()].view(-1, n_kv, d)
    else:
        flat = cache.index_select(0, seq.blocks).view(-1, n_kv, d)
    return flat[seq.window_start : seq.ctx_len].transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: KVTensor,
    v_cache: KVTensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q ``[T, heads, head_dim]`` -> ``[T, heads * head_dim]``."""
    n_tokens, n_heads, d = q.shape
    n_kv = k_cache.shape[2]
    group = n_heads // n_kv
    out = torch.empty(n_tokens, n_heads, d, dtype=q.dtype)
    native = native_ops.attention_runs(q) and not isinstance(k_cache, Int8KV)
    for seq in meta.seqs:
        qs = q[seq.q_start : seq.q_start + seq.q_len]  # [q_len, heads, d]
        if native and not seq.windowed:  # single queries too: a row's bits then never depend on its chunk
            ks, vs = (_cached(cache, seq).transpose(0, 1) for cache in (k_cache, v_cache))  # [ctx, kv, d]
            out[seq.q_start : seq.q_start + seq.q_len] = native_ops.segment_attention(
                qs, ks, vs, [0, seq.q_len], [0, seq.ctx_len], True, scale)
            continue
        # [q_len, kv, group, d] -> [kv, group * q_len, d]
        qg = qs.view(seq.q_len, n_kv, group, d).permute(1, 2, 0, 3).reshape(n_kv, group * seq.q_len, d)
        # 4-D inputs: PyTorch's fused (flash) CPU kernel takes only those; the math fallback
        # would materialise fp32 scores of group x q_len x ctx per head.
        ks = _cached(k_cache, seq).unsqueeze(0)
        vs = _cached(v_cache, seq).unsqueeze(0)
        o = F.scaled_dot_product_attention(qg.unsqueeze(0), ks, vs, attn_mask=seq.mask, scale=scale)[0]
        # [kv, group * q_len, d] -> [q_len, heads, d]
        out[seq.q_start : seq.q_start + seq.q_len] = o.view(n_kv, group, seq.q_len, d).permute(2, 0, 1, 3).reshape(
            seq.q_len, n_heads, d
        )
    return out.view(n_tokens, n_heads * d)
