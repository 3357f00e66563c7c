"""Slow clients: a connection that sends no request head, or a body that does not arrive, or a client that stops
reading is cut off after the server's timeouts (408 naming the flag when a request had begun, its request cancelled
when one was running), so that idle connections cannot take every file descriptor; a request served for longer than
the timeouts is not cut off."""
from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest

from .serverutil import ServerProcess, wait_until

pytestmark = pytest.mark.slow

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 1.0
ABORTED = "edge_infer_request_finish_total{reason=abort}"
CHAT = {"model": "tiny-qwen2", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def server(served_model):
    # A heartbeat timeout beyond the worker's stop below: that request must wait, not end as engine_dead.
    with ServerProcess(served_model, "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s",
                       str(BODY_TIMEOUT_S), "--send-timeout-s", str(SEND_TIMEOUT_S), "--heartbeat-timeout-s", "30") as proc:
        yield proc


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def error_of(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return int(head.split()[1]), json.loads(body)["error"]


def served(server) -> None:
    r = server.client().chat.completions.create(**CHAT)
    assert r.choices[0].message.content is not None


def test_idle_connections_past_the_descriptor_limit_hold_others_off_only_until_the_header_timeout(server):
    """With the server's descriptors all taken by connections that send nothing, a real client's request waits
    in the listen queue until the header timeout closes them, and is then served (before: never). First in the
    module, so that it is the server's first chat: it opens no file (the API-key check ran on anyio's threads,
    whose backend was imported then, and the chat template imported jinja2: 500 Too many open files, 3 runs of 6)."""
    pid = server.proc.pid
    limit = len(os.listdir(f"/proc/{pid}/fd")) + 32
    old = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, old[1]))
    try:
        with ExitStack() as idle:
            for _ in range(64):
                idle.enter_context(connect(server))
            start = time.monotonic()
            served(server)
            assert time.monotonic() - start < 30
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, old)


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    with connect(server) as sock:
        data, waited = read_until_closed(sock)
    assert data == b"" and HEADER_TIMEOUT_S - 0.1 < waited < HEADER_TIMEOUT_S + 5


@pytest.mark.parametrize("after_a_response", [False, True])
def test_half_a_request_head_gets_408_naming_the_flag_and_the_connection_closes(server, after_a_response):
    half = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    # A keep-alive connection: its next head gets the same deadline. Sent with the first request (pipelined), so
    # that the half head is there when the deadline starts, however late this test gets to send.
    first = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" if after_a_response else b""
    with connect(server) as sock:
        sock.sendall(first + half)
        data, waited = read_until_closed(sock)
    if after_a_response:
        assert data.startswith(b"HTTP/1.1 200")
        data = data[data.index(b"HTTP/1.1 ", 1):]
    status, error = error_of(data)
    assert status == 408 and error["code"] == "header_timeout" and "--header-timeout-s" in error["message"]
    assert waited < HEADER_TIMEOUT_S + 5
    served(server)


def test_a_body_that_stops_arriving_gets_408_naming_the_flag_and_others_are_served(server):
    before = server.metrics().get('edge_infer_requests_total{path=/v1/chat/completions,status=408}', 0)
    with connect(server) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n" + json.dumps(CHAT).encode()[:20])
        served(server)  # while it waits
        data, waited = read_until_closed(sock)
    status, error = error_of(data)
    assert status == 408 and error["code"] == "body_timeout"
    assert "had not arrived 2 s after the request's head (20 bytes so far)" in error["message"]
    assert "--body-timeout-s" in error["message"] and waited < BODY_TIMEOUT_S + 5
    assert server.metrics()['edge_infer_requests_total{path=/v1/chat/completions,status=408}'] == before + 1


def test_a_slow_body_that_arrives_within_the_timeout_is_served(server):
    body = json.dumps(CHAT).encode()

    def trickle():
        for i in range(0, len(body), len(body) // 4 + 1):
            time.sleep(BODY_TIMEOUT_S / 16)
            yield body[i:i + len(body) // 4 + 1]

    r = httpx.post(server.base_url + "/v1/chat/completions", content=trickle(), timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


def test_a_request_served_for_longer_than_the_timeouts_is_not_cut_off(server):
    """The timeouts are for receiving a request: the engine's worker is stopped for longer than both while a
    request waits for its answer, which still comes."""
    (worker,) = server.worker_pids()
    start = time.monotonic()
    os.kill(worker, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, server.base_url + "/v1/chat/completions", json=CHAT, timeout=60)
            time.sleep(BODY_TIMEOUT_S + HEADER_TIMEOUT_S + 0.5)
            os.kill(worker, signal.SIGCONT)
            response = pending.result()
    finally:
        os.kill(worker, signal.SIGCONT)
    assert response.status_code == 200, response.text
    assert time.monotonic() - start > BODY_TIMEOUT_S + HEADER_TIMEOUT_S


def test_a_body_refused_before_its_end_is_not_waited_for(server):
    """413 for a Content-Length over the limit closes the connection: the client sends the rest to no one."""
    with connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000\r\n\r\n{")
        data, waited = read_until_closed(sock)
    status, error = error_of(data)
    assert status == 413 and error["code"] == "body_too_large" and waited < HEADER_TIMEOUT_S


def test_a_client_that_stops_reading_is_dropped_and_its_request_cancelled(server):
    """A streamed answer of megabytes to a client that reads none of it: once the socket is full the server waits
    --send-timeout-s, then drops the connection and ends the request (its sequence and KV blocks freed). That a
    client reading slowly but steadily is not dropped: test_connection_deadlines.py."""
    # ~8 MB of answer (~2 KB a token): past what the kernel's send buffer takes on loopback (it grows to MBs), so
    # the request stalls on its stream's credits and is still running when the connection is dropped.
    body = json.dumps({**CHAT, "max_tokens": 480, "n": 8, "ignore_eos": True, "stream": True, "logprobs": True,
                       "top_logprobs": 20}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        aborted = server.metrics().get(ABORTED, 0)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_until(lambda: server.metrics().get(ABORTED, 0) == aborted + 8, "the request's 8 samples to be cancelled",
                   60)
        wait_until(lambda: server.metrics()["edge_infer_sequences_in_flight"] == 0, "the request to be ended", 60)
        with pytest.raises(ConnectionResetError):  # a reset: not a clean end the client could take for the answer
            while sock.recv(1 << 20):
                pass
        served(server)


def test_a_body_that_arrived_in_time_is_read_however_late_the_route_asks():
    """The deadline is for the client: a body already received is the route's, even after the deadline."""
    from edge_infer.server.http import BodyCost, BodyLimit

    async def late_route(scope, receive, send):
        await asyncio.sleep(0.2)
        message = await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": message["body"]})

    async def received():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    sent = []

    async def send(message):
        sent.append(message)

    limit = BodyLimit(late_route, max_bytes=1 << 20, max_in_flight=2 << 20, max_items=1024, cost=BodyCost(100, 10),
                      timeout_s=0.1)
    asyncio.run(limit({"type": "http", "headers": []}, received, send))
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"{}"


def test_connections_past_the_per_client_limit_get_429_and_the_clients_others_are_served(served_model):
    """--max-connections-per-client: idle connections up to the limit hold the client's share, not the server's
    descriptors; one more is answered 429 naming the flag and closed; a connection closed frees its place."""
    with ServerProcess(served_model, "--max-connections-per-client", "3", "--header-timeout-s", "30") as proc, \
            ExitStack() as held:
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                   "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
        for _ in range(4):  # no route takes a WebSocket: an ordinary request, whose connection's place is freed
            assert httpx.get(f"{proc.base_url}/health", headers=upgrade, timeout=10).status_code == 200
        idle = [held.enter_context(socket.create_connection(("127.0.0.1", proc.port), timeout=30)) for _ in range(2)]
        with httpx.Client(base_url=proc.base_url, timeout=30) as client:  # the third: one kept-alive connection
            assert client.get("/health").status_code == 200
            extra = connect(proc)
            status, error = error_of(read_until_closed(extra)[0])
            assert status == 429 and error["code"] == "too_many_connections" and "--max-connections-per-client" in error["message"]
            assert client.get("/health").status_code == 200  # the kept-alive connection is still served
        idle[0].close()
        wait_until(lambda: httpx.get(f"{proc.base_url}/health", timeout=10).status_code == 200, "a place to be freed", 10)
        served(proc)
