"""Per-request event streams, optionally bounded.

A bounded stream buffers at most ``max_chunks`` undelivered token events. The
bound is enforced at the source: the engine core may only produce a token for
a request while that request holds a credit, one credit per buffered event,
returned when the consumer takes the event. A slow consumer therefore stalls
only its own request, and its tokens are exactly those it would have had.
The omni runtime uses the same stream unbounded, for its own event type.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generic, Protocol, TypeVar

from edge_infer.engine.protocol import TokenLogprobs

TERMINAL = ("finished", "error", "cancelled")


@dataclass
class StreamEvent:
    kind: str  # token | finished | error | cancelled
    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None  # per token
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1.., once
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held for this request
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    time: float = field(default_factory=time.time)

    @property
    def terminal(self) -> bool:
        return self.kind in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Event(Protocol):
    @property
    def terminal(self) -> bool: ...


E = TypeVar("E", bound=_Event)


class RequestStream(Generic[E]):
    """Async iterator of a request's events; ends after its terminal event.

    ``on_consume`` is told of every event taken (the credits of a bounded
    stream); None for a stream whose producer is not throttled by its reader.
    """

    def __init__(self, request_id: str, max_chunks: int | None = None,
                 on_consume: Callable[[int], None] | None = None):
        self.request_id = request_id
        self.max_chunks = max_chunks
        self._on_consume = on_consume
        self._events: deque[E] = deque()
        self._ready = asyncio.Event()
        self._terminal: E | None = None
        self._terminal_delivered = False
        self.high_water_chunks = 0
        self.delivered = 0
        self.discarded = 0

    # -- producer side (the engine's event loop) -----------------------------------

    def push(self, event: E) -> None:
        if self._terminal is not None:
            return
        if event.terminal:
            self._terminal = event
        else:
            self._events.append(event)
            self.high_water_chunks = max(self.high_water_chunks, len(self._events))
        self._ready.set()

    def cancel(self, event: E) -> int:
        """End the stream now with ``event``: undelivered events are discarded (the cancel fence)."""
        if self._terminal is not None:
            return 0
        dropped = len(self._events)
        self.discarded += dropped
        self._events.clear()
        self.push(event)
        return dropped

    @property
    def ended(self) -> bool:
        return self._terminal is not None

    # -- consumer side -------------------------------------------------------

    async def get(self) -> E:
        """The next event; after the end, the terminal event again."""
        while True:
            if self._events:
                event = self._events.popleft()
                self.delivered += 1
                if self._terminal is None and self._on_consume is not None:
                    self._on_consume(1)
                return event
            if self._terminal is not None:
                self._terminal_delivered = True
                return self._terminal
            self._ready.clear()
            await self._ready.wait()

    def __aiter__(self) -> "RequestStream[E]":
        return self

    async def __anext__(self) -> E:
        if self._terminal_delivered:
            raise StopAsyncIteration
        return await self.get()

    def stats(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "buffered_chunks": len(self._events),
            "high_water_chunks": self.high_water_chunks,
            "max_chunks": self.max_chunks,
            "delivered": self.delivered,
            "discarded": self.discarded,
            "ended": self.ended,
        }
