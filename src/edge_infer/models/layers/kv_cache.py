"""Paged KV cache: one allocation sized from an exact byte budget, and its blocks.

The budget is divided into blocks of ``block_size`` tokens holding K and V for
every layer; the cache allocates ``floor(budget / bytes_per_block)`` blocks,
once, touching every page so that the memory is really there. Nothing grows
later: a request that needs more blocks than are free is handled by the
scheduler's policy (preempt and recompute), never by allocating more.

An int8 cache (``--kv-cache-dtype int8``) holds each token's K and V per
head as int8 codes with one fp32 scale (symmetric, absmax / 127): 68 bytes
instead of 128 for a 64-wide bf16 head, so nearly twice the tokens fit the
same budget. Attention reads a sequence's codes back at the compute dtype
(``Int8KV.read``), one layer at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from edge_infer.models.config import ModelConfig

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int = DEFAULT_BLOCK_SIZE
    scale_bytes: int = 0  # per token and head beside the codes: 4 (an fp32 scale) for an int8 cache

    @classmethod
    def for_model(cls, cfg: "ModelConfig", dtype_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                  int8: bool = False) -> "KVLayout":
        """The layout of ``cfg``'s cache at the compute dtype's width, or as int8 codes with fp32 scales."""
        return cls(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 1 if int8 else dtype_bytes,
                   block_size, 4 if int8 else 0)

    @property
    def int8(self) -> bool:
        return self.scale_bytes > 0

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * (self.head_dim * self.dtype_bytes + self.scale_bytes)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def blocks_for_budget(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_block

    def blocks_for_tokens(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


class Int8KV:
    """One layer's K or V: int8 codes ``[blocks, block, kv_heads, d]`` and fp32 scales ``[blocks, block, kv_heads]``."""

    def __init__(self, codes: "torch.Tensor", scales: "torch.Tensor", dtype: "torch.dtype"):
        self.codes, self.scales, self.dtype = codes, scales, dtype
        self.shape = codes.shape

    def write(self, slots: "torch.Tensor", x: "torch.Tensor") -> None:
        """Quantize new keys or values ``[T, kv_heads, d]`` into their slots."""
        import torch

        x = x.float()
        scale = x.abs().amax(-1).clamp_min(1e-30) / 127  # an all-zero head keeps a usable scale
        codes = torch.round(x / scale.unsqueeze(-1)).to(torch.int8)
        n_kv, d = x.shape[1], x.shape[2]
        self.codes.view(-1, n_kv, d).index_copy_(0, slots, codes)
        self.scales.view(-1, n_kv).index_copy_(0, slots, scale)

    def read(self, blocks: "torch.Tensor", contiguous_from: int | None) -> "torch.Tensor":
        """The blocks' values ``[tokens, kv_heads, d]`` at the compute dtype (one copy)."""
        n_kv, d = self.shape[2], self.shape[3]
        if contiguous_from is not None:
            end = contiguous_from + blocks.numel()
            codes, scales = self.codes[contiguous_from:end], self.scales[contiguous_from:end]
        else:
            codes, scales = self.codes.index_select(0, blocks), self.scales.index_select(0, blocks)
        out = codes.view(-1, n_kv, d).to(self.dtype)
        return out.mul_(scales.view(-1, n_kv, 1).to(self.dtype))


class KVCache:
    """K and V per layer, views into one allocation ``[2, L, blocks, block, kv_heads, d]`` (plus the scales of an
    int8 cache, ``[2, L, blocks, block, kv_heads]``)."""

    def __init__(self, layout: KVLayout, num_blocks: int, dtype: "torch.dtype"):
        import torch

        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.layout = layout
        self.num_blocks = num_blocks
        shape = (2, layout.num_layers, num_blocks, layout.block_size, layout.num_kv_heads)
        self.storage = torch.zeros(*shape, layout.head_dim, dtype=torch.int8 if layout.int8 else dtype)
        self.scales = torch.zeros(*shape, dtype=torch.float32) if layout.int8 else None
        if self.scales is not None:
            self.k = [Int8KV(c, s, dtype) for c, s in zip(self.storage[0].unbind(0), self.scales[0].unbind(0))]
            self.v = [Int8KV(c, s, dtype) for c, s in zip(self.storage[1].unbind(0), self.scales[1].unbind(0))]
        else:
            self.k = list(self.storage[0].unbind(0))
            self.v = list(self.storage[1].unbind(0))

    @property
    def nbytes(self) -> int:
        scales = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.storage.numel() * self.storage.element_size() + scales
