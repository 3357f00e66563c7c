"""Paged KV cache: one allocation sized from an exact byte budget, and its blocks.

The budget is divided into blocks of ``block_size`` tokens holding K and V for
every layer; the cache allocates ``floor(budget / bytes_per_block)`` blocks,
once, touching every page so that the memory is really there. Nothing grows
later: a request that needs more blocks than are free is handled by the
scheduler's policy (preempt and recompute), never by allocating more.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int = DEFAULT_BLOCK_SIZE

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def blocks_for_budget(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_block

    def blocks_for_tokens(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


class KVCache:
    """K and V tensors per layer, views into one allocation ``[2, L, blocks, block, kv_heads, d]``."""

    def __init__(self, layout: KVLayout, num_blocks: int, dtype: "torch.dtype"):
        import torch

        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.layout = layout
        self.num_blocks = num_blocks
        self.storage = torch.zeros(
            2, layout.num_layers, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim, dtype=dtype
        )
        self.k = list(self.storage[0].unbind(0))
        self.v = list(self.storage[1].unbind(0))

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()
