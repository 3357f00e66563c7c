"""The HTTP/1.1 connection: uvicorn's h11 protocol with a deadline for each request head.

uvicorn waits for a request head for ever: its keep-alive timeout starts only
after a response and stops at the next byte. A client that opens connections
and sends nothing, or half a request line, holds a file descriptor each, and
a few hundred of them leave the server unable to accept (slowloris).
"""
from __future__ import annotations

import asyncio
import functools
from http import HTTPStatus
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from edge_infer.server.errors import APIError


class HeadDeadlineProtocol(H11Protocol):
    """A connection must send a complete request head ``header_timeout_s`` after it opens or after its previous
    response ends, or it is closed: with a 408 when it had begun one. A request being served is the body limit's
    (server/http.py); a body still arriving after its response gets the same deadline."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.head_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self.head_deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head arrived
            self._disarm()

    def handle_websocket_upgrade(self, event: Any) -> None:  # the connection is no longer HTTP/1.1's
        self._disarm()
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # before uvicorn starts on a pipelined request, whose head disarms it
        super().on_response_complete()

    def _head_timed_out(self) -> None:
        self.head_deadline = None
        if self.transport.is_closing():
            return
        begun, _ = self.conn.trailing_data
        if begun and self.conn.their_state is h11.IDLE:
            error = APIError(408, f"no complete request head {self.header_timeout_s:g} s after the connection opened or "
                             "its last response ended; this server waits at most that long (--header-timeout-s)",
                             code="header_timeout")
            self.transport.write(_raw_response(error))
        self.transport.close()


def _raw_response(error: APIError) -> bytes:
    """``error`` as bytes on the wire, for a connection h11 has no request on (it can answer none)."""
    body = error.response().body
    head = (f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def head_deadline_protocol(header_timeout_s: float) -> Callable[..., HeadDeadlineProtocol]:
    """uvicorn's ``http`` setting: builds each connection's protocol."""
    return functools.partial(HeadDeadlineProtocol, header_timeout_s=header_timeout_s)
