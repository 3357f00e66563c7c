"""The HTTP/1.1 connection: uvicorn's h11 protocol with deadlines for a request head and for a client's reading.

uvicorn waits for ever: for a request head (its keep-alive timeout starts only
after a response and stops at the next byte), and for a client to read what
it was sent (a response waits on a full socket; a connection closed with
bytes unsent waits for them to go). A client that opens connections and
sends nothing, or half a request line, or stops reading, holds a file
descriptor each (a streamed request its sequence too), and a few hundred of
them leave the server unable to accept (slowloris). The deadlines bound how
long a connection holds its descriptor; ``ClientConnections`` bounds how many
one address may hold at once (--max-connections-per-client).
"""
from __future__ import annotations

import asyncio
import functools
import socket
import struct
from http import HTTPStatus
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from edge_infer.server.errors import APIError

try:  # Linux (and other Unix): the socket's send queue; elsewhere the transport's buffer alone
    from fcntl import ioctl
    from termios import TIOCOUTQ
except ImportError:
    ioctl = TIOCOUTQ = None


class Deadline:
    """One timer of a connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, expired: Callable[[], None]):
        self.loop, self.seconds, self.expired = loop, seconds, expired
        self.handle: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self.handle is not None

    def start(self) -> None:
        self.stop()
        self.handle = self.loop.call_later(self.seconds, self._fire)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        self.handle = None
        self.expired()


class ClientConnections:
    """Connections open per client address; beyond ``limit`` (0: no limit) a new one is refused."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def admit(self, host: str) -> bool:
        if self.limit and self.open.get(host, 0) >= self.limit:
            return False
        self.open[host] = self.open.get(host, 0) + 1
        return True

    def release(self, host: str) -> None:
        left = self.open[host] - 1
        if left:
            self.open[host] = left
        else:
            del self.open[host]


class _ClosingTransport:
    """The connection's transport as uvicorn sees it: ``close`` also tells the protocol (uvicorn closes it from
    several places: a response with Connection: close, an app error mid-response, an invalid request)."""

    def __init__(self, transport: asyncio.Transport, closing: Callable[[], None]):
        self._transport, self._closing = transport, closing

    def close(self) -> None:
        self._transport.close()
        self._closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class DeadlineProtocol(H11Protocol):
    """A connection must send a complete request head ``header_timeout_s`` after it opens or after its previous
    response ends, or it is closed: with a 408 when it had begun one (a request being served is the body limit's,
    server/http.py; a body still arriving after its response gets the same deadline). A client must take what it
    is sent: when the transport's buffer is full, or the connection is closed with bytes in it, the client must
    take some of them every ``send_timeout_s`` (as nginx's send_timeout); else the connection is reset, and a
    request whose client is gone is cancelled."""

    def __init__(self, *args: Any, header_timeout_s: float, send_timeout_s: float, clients: ClientConnections,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head_deadline = Deadline(self.loop, header_timeout_s, self._head_timed_out)
        self.send_deadline = Deadline(self.loop, send_timeout_s, self._send_timed_out)
        self.unsent_at_start = 0  # bytes the client had not taken when the send deadline started
        self.clients = clients
        self.client_host: str | None = None  # counted in ``clients`` while this connection is open

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_ClosingTransport(transport, self._closed_by_server))  # type: ignore[arg-type]
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple) and peer else None  # a Unix socket's peer has no address
        if host is not None and not self.clients.admit(host):
            error = APIError(429, f"this client already has {self.clients.limit} connections open, the most this server "
                             "takes from one address (--max-connections-per-client); reuse them (keep-alive) or "
                             "close some", code="too_many_connections")
            self.transport.write(_raw_response(error))
            self.transport.close()
            return
        self.client_host = host
        self.head_deadline.start()

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_deadline.stop()
        self.send_deadline.stop()
        if self.client_host is not None:
            self.clients.release(self.client_host)
            self.client_host = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head arrived
            self.head_deadline.stop()

    def eof_received(self) -> None:  # the client half-closed: asyncio closes the transport itself
        self._watch_what_is_left()
        return super().eof_received()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self.head_deadline.start()  # before uvicorn starts on a pipelined request, whose head stops it
        super().on_response_complete()

    def pause_writing(self) -> None:  # the transport's buffer is full: is the client reading?
        super().pause_writing()
        self._watch_sending()

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.transport.is_closing():
            self.send_deadline.stop()

    def _closed_by_server(self) -> None:
        self.head_deadline.stop()
        self._watch_what_is_left()

    def _watch_what_is_left(self) -> None:
        """A closing transport keeps its descriptor until the bytes in its buffer are taken."""
        if self.transport.get_write_buffer_size():
            self._watch_sending()

    def _watch_sending(self) -> None:
        if not self.send_deadline.running:
            self.unsent_at_start = self._unsent()
            self.send_deadline.start()

    def _unsent(self) -> int:
        """Bytes written that the client has not taken: the transport's buffer and the socket's send queue."""
        unsent = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None and TIOCOUTQ is not None:  # Linux: SIOCOUTQ
            try:
                unsent += struct.unpack("i", ioctl(sock.fileno(), TIOCOUTQ, b"\0" * 4))[0]
            except (OSError, ValueError):  # not a socket's queue here, or closed (fileno -1)
                pass
        return unsent

    def _send_timed_out(self) -> None:
        if not self.transport.get_write_buffer_size():  # all handed to the socket: nothing waits on the client
            return
        unsent = self._unsent()
        if unsent < self.unsent_at_start:  # the client took some: another period
            self.unsent_at_start = unsent
            self.send_deadline.start()
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset, not a clean end the client could take for the whole response
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _head_timed_out(self) -> None:
        if self.transport.is_closing():
            return
        begun, _ = self.conn.trailing_data
        if begun and self.conn.their_state is h11.IDLE:
            error = APIError(408, f"no complete request head {self.head_deadline.seconds:g} s after the connection "
                             "opened or its last response ended; this server waits at most that long "
                             "(--header-timeout-s)", code="header_timeout")
            self.transport.write(_raw_response(error))
        self.transport.close()


def _raw_response(error: APIError) -> bytes:
    """``error`` as bytes on the wire, for a connection h11 has no request on (it can answer none)."""
    body = error.response().body
    head = (f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def deadline_protocol(header_timeout_s: float, send_timeout_s: float,
                      max_connections_per_client: int = 0) -> Callable[..., DeadlineProtocol]:
    """uvicorn's ``http`` setting: builds each connection's protocol (one count of connections per address for all).
    The server runs it with ``ws="none"``: no route takes a WebSocket, so no connection leaves this protocol."""
    return functools.partial(DeadlineProtocol, header_timeout_s=header_timeout_s, send_timeout_s=send_timeout_s,
                             clients=ClientConnections(max_connections_per_client))
