"""Which KV cache blocks a sequence holds, and which full blocks are kept for reuse (prefix caching).

A block is free, held by one or more sequences (reference-counted), or
cached: full, computed, no longer held, and findable by the hash chain of
the tokens it holds so that a later request with the same prefix takes it
instead of computing it again. Cached blocks count as free space: when the
free blocks run out, allocation evicts the least recently released one. The
KV budget is therefore unchanged by caching: cached blocks are the same
blocks.
"""
from __future__ import annotations

from collections import OrderedDict


class BlockAllocator:
    """Hands out block ids, preferring runs of consecutive blocks.

    Attention reads a sequence whose blocks are consecutive as a plain view of
    the cache instead of gathering them, so a sequence grows into the block
    right after its last one when that block is free, and a new sequence
    starts at the beginning of the largest free run.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = bytearray(b"\x01" * num_blocks)  # never held, or evicted
        self._num_unheld = num_blocks
        self._refs = [0] * num_blocks
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached and unheld, least recently released first
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks a sequence can get: free ones and cached ones nobody holds."""
        return self._num_unheld + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._hash_of)

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

    def _evict_one(self) -> None:
        block, _ = self._evictable.popitem(last=False)
        del self._by_hash[self._hash_of.pop(block)]
        self._free[block] = 1
        self._num_unheld += 1
        self.num_evictions += 1

    def allocate(self, count: int, after: int | None = None) -> list[int] | None:
        """``count`` blocks, continuing after block ``after`` when possible; None if too few.

        Free blocks first; cached ones are evicted (least recently released first) only for the rest.
        """
        if count > self.num_free:
            return None
        while self._num_unheld < count:
            self._evict_one()
        out: list[int] = []
        nxt = after + 1 if after is not None else self._largest_free_run_start()
        while len(out) < count:
            if not (0 <= nxt < self.num_blocks and self._free[nxt]):
                nxt = self._largest_free_run_start()
            self._free[nxt] = 0
            self._refs[nxt] = 1
            out.append(nxt)
            nxt += 1
        self._num_unheld -= count
        return out

    def free(self, blocks: list[int]) -> None:
        """Release a sequence's hold on ``blocks``; a cached block nobody holds stays findable until evicted."""
        for b in blocks:
            if self._refs[b] == 0:
                raise RuntimeError(f"block {b} freed twice")
            self._refs[b] -= 1
            if self._refs[b]:
                continue
            if b in self._hash_of:
                self._evictable[b] = None
            else:
                self._free[b] = 1
                self._num_unheld += 1

    # -- prefix caching ------------------------------------------------------

    def cache(self, block: int, block_hash: bytes) -> None:
        """Make a full, computed block findable by ``block_hash`` (a block with that content already cached wins)."""
        if block_hash not in self._by_hash and block not in self._hash_of:
            self._by_hash[block_hash] = block
            self._hash_of[block] = block_hash

    def take_cached(self, hashes: list[bytes]) -> list[int]:
        """Hold the cached blocks of the longest prefix of ``hashes`` found, in order."""
        out = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            out.append(block)
        return out
