"""Which KV cache blocks a sequence holds: the scheduler's allocator over the cache's block ids."""
from __future__ import annotations


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
