"""Room for requests with media: at most ``max_num_seqs`` of their sequences are prepared or in the worker at once.

The memory plan's "sequence media" item (memory/media_plan.py) holds one request's media per running sequence:
its decoded inputs until encoded, then their embeddings. A request beyond that waits here, *before* its media are
read and decoded, so a queue of requests holds their message bodies only, not their decoded pixels and mel
frames. Slots are granted first come, first served; each engine request with media takes one and gives it back
when it ends (finished, failed or cancelled).
"""
from __future__ import annotations

import asyncio
from collections import deque

from edge_infer.errors import EngineDeadError, InvalidRequestError


def check_media_sequences(n: int, capacity: int) -> None:
    """Refuse a request whose media would need more sequences than ever hold media at once."""
    if n > capacity:
        raise InvalidRequestError(
            f"the request asks for {n} sequences (n x prompts) with media, but at most max_num_seqs={capacity} "
            "sequences hold media at once (the memory plan is sized for them); lower n")


class MediaGate:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.in_use = 0
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def waiting(self) -> int:
        """Slots asked for by the requests still waiting."""
        return sum(n for n, _ in self._waiting)

    async def acquire(self, n: int) -> "MediaSlots":
        """``n`` slots, once they are free and every earlier request has had its own."""
        check_media_sequences(n, self.capacity)
        if not self._waiting and self.in_use + n <= self.capacity:
            self.in_use += n
            return MediaSlots(self, n)
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append((n, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted just as the waiter left: give them back
                self._give_back(n)
            else:
                if (n, granted) in self._waiting:  # (_grant drops the entries of waiters that left)
                    self._waiting.remove((n, granted))
                self._grant()  # the requests behind it may fit now
            raise
        return MediaSlots(self, n)

    def close(self, why: str) -> None:
        """The engine is gone: the requests still waiting get EngineDeadError(``why``)."""
        waiting, self._waiting = self._waiting, deque()
        for _, granted in waiting:
            if not granted.done():
                granted.set_exception(EngineDeadError(why))

    def _give_back(self, n: int) -> None:
        self.in_use -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            n, granted = self._waiting[0]
            if granted.done():  # its waiter was cancelled and has not run since: nothing to grant
                self._waiting.popleft()
                continue
            if self.in_use + n > self.capacity:
                return
            self._waiting.popleft()
            self.in_use += n
            granted.set_result(None)


class MediaSlots:
    """Slots granted to one API request: each of its engine requests with media takes one (``take``); the
    engine gives it back when that request ends; ``release`` gives back those never taken (idempotent)."""

    def __init__(self, gate: MediaGate, n: int):
        self.gate = gate
        self.left = n

    def take(self) -> "MediaSlot":
        if self.left == 0:
            raise RuntimeError("more engine requests with media than slots acquired for them")
        self.left -= 1
        return MediaSlot(self.gate)

    def release(self) -> None:
        if self.left:
            n, self.left = self.left, 0
            self.gate._give_back(n)


class MediaSlot:
    """One engine request's slot; ``release`` is idempotent."""

    def __init__(self, gate: MediaGate):
        self.gate: MediaGate | None = gate

    def release(self) -> None:
        if self.gate is not None:
            gate, self.gate = self.gate, None
            gate._give_back(1)
