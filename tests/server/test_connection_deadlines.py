"""server/connection.py on a bare uvicorn: a client that takes what it is sent, however slowly, gets all of it; one
that takes nothing for --send-timeout-s is reset, whether its response is still being written, was closed with
bytes unsent, ended in an error mid-body, or the client half-closed."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from uvicorn.server import ServerState

from edge_infer.server.connection import ClientConnections, DeadlineProtocol, deadline_protocol

from .serverutil import free_port

pytestmark = pytest.mark.slow

SEND_TIMEOUT_S = 1.0
BODY = bytes(range(256)) * (8 << 12)  # 8 MiB: more than the socket buffers hold


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    size = int(scope["query_string"] or len(BODY))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(size).encode()), (b"connection", b"close")]})
    if scope["path"] == "/fails-midway":
        await send({"type": "http.response.body", "body": BODY[:size // 2], "more_body": True})
        raise RuntimeError("the app failed mid-body")
    await send({"type": "http.response.body", "body": BODY[:size]})


@pytest.fixture(scope="module")
def port():
    port = free_port()
    config = uvicorn.Config(app, port=port, log_level="critical", http=deadline_protocol(10.0, SEND_TIMEOUT_S))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(10)


def request(port: int, path: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def read_at(sock: socket.socket, bytes_per_s: float) -> bytes:
    data = b""
    start = time.monotonic()
    while chunk := sock.recv(16384):
        data += chunk
        time.sleep(max(0.0, start + len(data) / bytes_per_s - time.monotonic()))
    return data


@pytest.mark.parametrize("path", ["/", "/fails-midway"])
def test_a_client_that_takes_nothing_is_reset(port, path):
    with request(port, path) as sock:
        time.sleep(SEND_TIMEOUT_S * 4)
        with pytest.raises(ConnectionResetError):
            read_at(sock, 1e12)


def test_a_client_that_reads_slowly_but_steadily_gets_everything(port):
    """Taking 3 MiB at 600 KB/s: five seconds, the buffer full all along, some taken every send timeout."""
    size = 3 << 20
    with request(port, f"/?{size}") as sock:
        data = read_at(sock, 600_000)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == BODY[:size]


class BufferedTransport(asyncio.Transport):
    """A transport holding ``buffered`` bytes its client has not taken (under the high-water mark)."""

    def __init__(self, buffered: int):
        super().__init__()
        self.buffered, self.closing = buffered, False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def test_bytes_left_when_the_client_half_closes_are_watched_too():
    """On a client's EOF asyncio closes the transport itself (not through uvicorn): bytes left under the
    high-water mark, so that the socket never paused, still get the send deadline."""
    config = uvicorn.Config(app, log_level="critical")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        protocol = DeadlineProtocol(config=config, server_state=ServerState(), app_state={}, _loop=loop,
                                    header_timeout_s=10.0, send_timeout_s=SEND_TIMEOUT_S, clients=ClientConnections(0))
        protocol.connection_made(BufferedTransport(buffered=30_000))
        assert not protocol.send_deadline.running
        protocol.eof_received()
        assert protocol.send_deadline.running
    finally:
        loop.close()
