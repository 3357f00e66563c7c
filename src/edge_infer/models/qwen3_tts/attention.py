"""Attention over a KV cache, behind one small function.

``attend`` is the only place where a layer touches its cache: any object
with ``start`` (tokens cached before the current forward), ``key_start``
(the position of the first key ``store`` returns), ``store(layer, k, v)``
(write the new keys/values, return every key/value the new queries may
see) and ``advance(n)`` (called once after a forward of n tokens) works: ``SlidingKVCache`` keeps
only the last keys a sliding window can reach (Code2Wav's streaming decode).
Shapes are per sequence, tokens first: ``[T, heads, head_dim]``.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class KVCache(Protocol):
    start: int
    key_start: int

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def advance(self, num_tokens: int) -> None: ...


class SlidingKVCache:
    """One sequence's most recent ``keep`` keys/values per layer; older ones are dropped in ``advance``.

    With ``keep = window - 1`` a sliding-window stack attends exactly as over
    the whole history, in memory bounded by the window.
    """

    def __init__(self, num_layers: int, keep: int) -> None:
        self.keep = keep
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.start = 0
        self.key_start = 0

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.k[layer], self.v[layer]
        if old_k is not None:
            k, v = torch.cat((old_k, k)), torch.cat((old_v, v))
        self.k[layer], self.v[layer] = k, v
        return k, v

    def advance(self, num_tokens: int) -> None:
        self.start += num_tokens
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            if k is not None and k.shape[0] > self.keep:
                drop = k.shape[0] - self.keep
                self.k[layer], self.v[layer] = k[drop:].clone(), v[drop:].clone()
        self.key_start = max(0, self.start - self.keep)


def attention_mask(q_start: int, num_q: int, k_start: int, num_k: int, window: int | None,
                   device: torch.device) -> torch.Tensor | None:
    """Boolean [num_q, num_k] mask for keys at positions ``k_start..``: causal, and within ``window``
    keys (itself included) if given.

    ``None`` when every key is visible (a single query at the end of the cache, no window).
    """
    if num_q == 1 and window is None and q_start + 1 == k_start + num_k:
        return None
    q_pos = torch.arange(q_start, q_start + num_q, device=device)[:, None]
    k_pos = torch.arange(k_start, k_start + num_k, device=device)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache | None, layer: int,
           window: int | None = None) -> torch.Tensor:
    """Causal (optionally sliding-window) attention of new queries over cached + new keys.

    q: [T, Hq, D]; k, v: [T, Hkv, D] (already rotated). Returns [T, Hq * D].
    Without a cache the T tokens attend among themselves from position 0.
    """
    start = key_start = 0
    if cache is not None:
        start, key_start = cache.start, cache.key_start
        k, v = cache.store(layer, k, v)
    mask = attention_mask(start, q.shape[0], key_start, k.shape[0], window, q.device)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
        attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1],
    )
    return out.transpose(0, 1).reshape(q.shape[0], -1)
