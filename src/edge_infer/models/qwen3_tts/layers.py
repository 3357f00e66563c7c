"""Code2Wav's pre-transformer: pre-norm blocks with layer scale and sliding-window causal attention.

Attribute names follow the checkpoint's weight names (``self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm``, ``self_attn_layer_scale`` ...), so a
state dict loads as is. RMSNorm and RoPE are the text engine's
(``rms_norm``, ``models/layers/rope.py``). Activations are per sequence,
tokens first: ``[T, hidden]``, and ``[T, heads, head_dim]`` in attention.

``attend`` is the only place where a layer touches its cache, a
``SlidingKVCache``: ``start`` (tokens cached before the current forward),
``key_start`` (the position of the first key ``store`` returns),
``store(layer, k, v)`` (write the new keys/values, return every key/value
the new queries may see) and ``advance(n)`` (called once after a forward of
n tokens). It keeps only the last keys the window can reach, so a streaming
decode runs in memory bounded by the window.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.layers.rope import apply_rotary, inverse_frequencies, rotary_tables
from edge_infer.models.layers.native_ops import rms_norm
from edge_infer.models.qwen3_tts.config import TransformerShape


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


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: SlidingKVCache | None, layer: int,
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


class RMSNorm(nn.Module):
    """``rms_norm`` with its weight under the checkpoint's name."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class SelfAttention(nn.Module):
    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.num_heads = shape.num_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.q_proj = nn.Linear(shape.hidden_size, shape.num_heads * shape.head_dim, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, shape.num_kv_heads * shape.head_dim, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, shape.num_kv_heads * shape.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * shape.head_dim, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: SlidingKVCache | None,
                layer: int, window: int | None) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        cos, sin = rope
        out = attend(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, cache, layer, window)
        return self.o_proj(out)


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """x + scale * attn(norm(x)), then + scale * mlp(norm(x))."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = SelfAttention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = GatedMLP(shape.hidden_size, shape.intermediate_size)
        self.self_attn_layer_scale = LayerScale(shape.hidden_size)
        self.mlp_layer_scale = LayerScale(shape.hidden_size)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: SlidingKVCache | None,
                layer: int, window: int | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, cache, layer, window))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class DecoderStack(nn.Module):
    """``layers`` + final ``norm``; positions continue from the cache's ``start``."""

    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.shape = shape
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cache: SlidingKVCache | None = None, window: int | None = None) -> torch.Tensor:
        start = cache.start if cache is not None else 0
        positions = torch.arange(start, start + x.shape[0])
        cos, sin = rotary_tables(positions, inverse_frequencies(self.shape.head_dim, self.shape.rope_theta, None))
        rope = cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None]
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, cache, i, window)
        return self.norm(x)
