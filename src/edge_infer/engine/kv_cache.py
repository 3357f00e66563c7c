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


class BlockAllocator:
    """Hands out block ids, preferring runs of consecutive blocks.

    Attention reads a sequence whose blocks are consecutive as a plain view of
    the cache instead of gathering them, so a sequence grows into the block
    right after its last one when that block is free, and a new sequence
    starts at the beginning of the largest free run.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = bytearray(b"\x01" * num_blocks)
        self.num_free = num_blocks

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def _largest_free_run_start(self) -> int:
        best_start, best_len, start, length = -1, 0, 0, 0
        for i, free in enumerate(self._free):
            if free:
                if length == 0:
                    start = i
                length += 1
                if length > best_len:
                    best_start, best_len = start, length
            else:
                length = 0
        return best_start

    def allocate(self, count: int, after: int | None = None) -> list[int] | None:
        """``count`` free blocks, continuing after block ``after`` when possible; None if too few."""
        if count > self.num_free:
            return None
        out: list[int] = []
        nxt = after + 1 if after is not None else self._largest_free_run_start()
        while len(out) < count:
            if not (0 <= nxt < self.num_blocks and self._free[nxt]):
                nxt = self._largest_free_run_start()
            self._free[nxt] = 0
            out.append(nxt)
            nxt += 1
        self.num_free -= count
        return out

    def free(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._free[b]:
                raise RuntimeError(f"block {b} freed twice")
            self._free[b] = 1
        self.num_free += len(blocks)
