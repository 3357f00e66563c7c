"""The pre-norm transformer block shared by the Talker, the code predictor and Code2Wav.

Attribute names follow the checkpoint's weight names (``self_attn.q_proj``,
``mlp.gate_proj``, ``input_layernorm`` ...), so a state dict loads as is.
All activations are per sequence, tokens first: ``[T, hidden]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edge_infer.models.qwen3_tts.attention import KVCache, attend
from edge_infer.models.qwen3_tts.config import TransformerShape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the weight dtype, as the reference does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [T, 1, head_dim] (half-split layout: the two halves share frequencies)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SelfAttention(nn.Module):
    def __init__(self, shape: TransformerShape, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = shape.num_heads
        self.num_kv_heads = shape.num_kv_heads
        self.head_dim = shape.head_dim
        self.q_proj = nn.Linear(shape.hidden_size, shape.num_heads * shape.head_dim, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, shape.num_kv_heads * shape.head_dim, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, shape.num_kv_heads * shape.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * shape.head_dim, shape.hidden_size, bias=False)
        # Qwen3-style per-head norms on q and k (the Talker and code predictor have them, Code2Wav not).
        self.q_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | None,
                layer: int, window: int | None) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        cos, sin = rope
        out = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, cache, layer, window)
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
    """x + attn(norm(x)), then + mlp(norm(x)); Code2Wav scales both branches (layer scale)."""

    def __init__(self, shape: TransformerShape, *, qk_norm: bool, layer_scale: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = SelfAttention(shape, qk_norm)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = GatedMLP(shape.hidden_size, shape.intermediate_size)
        if layer_scale:
            self.self_attn_layer_scale = LayerScale(shape.hidden_size)
            self.mlp_layer_scale = LayerScale(shape.hidden_size)
        self.layer_scale = layer_scale

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | None,
                layer: int, window: int | None = None) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), rope, cache, layer, window)
        x = x + (self.self_attn_layer_scale(h) if self.layer_scale else h)
        h = self.mlp(self.post_attention_layernorm(x))
        return x + (self.mlp_layer_scale(h) if self.layer_scale else h)


class DecoderStack(nn.Module):
    """``layers`` + final ``norm``; positions continue from the cache's ``start``."""

    def __init__(self, shape: TransformerShape, *, qk_norm: bool, layer_scale: bool) -> None:
        super().__init__()
        self.shape = shape
        self.layers = nn.ModuleList(
            DecoderLayer(shape, qk_norm=qk_norm, layer_scale=layer_scale) for _ in range(shape.num_layers)
        )
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, window: int | None = None) -> torch.Tensor:
        start = cache.start if cache is not None else 0
        positions = torch.arange(start, start + x.shape[0], device=x.device)
        rope = rope_tables(positions, self.shape.head_dim, self.shape.rope_theta, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, cache, i, window)
        return self.norm(x)
