"""End-to-end: a client that goes away cancels its request, and its KV blocks return to the pool."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from .serverutil import wait_until

pytestmark = pytest.mark.slow

LONG = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 480, "ignore_eos": True}
ABORTED = 'edge_infer_request_finish_total{reason=abort}'


def settled(server) -> bool:
    m = server.metrics()
    return m["edge_infer_kv_blocks_used"] == 0 and m["edge_infer_sequences_in_flight"] == 0


def test_stream_disconnect_cancels_the_request_and_frees_its_blocks(server):
    aborted = server.metrics().get(ABORTED, 0)
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if '"content":"' in line and '"role"' not in line)  # tokens are flowing
    # closed at once: long before 480 tokens (the abort below says it was still running, so holding blocks)
    wait_until(lambda: settled(server), "KV blocks back in the pool after the disconnect")
    assert server.metrics()[ABORTED] == aborted + 1


def test_non_stream_disconnect_cancels_the_request(server):
    aborted = server.metrics().get(ABORTED, 0)
    body = json.dumps({**LONG, "n": 2}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        # Both samples generating (a client that left before would be answered 499 with nothing to cancel)
        wait_until(lambda: server.metrics()["edge_infer_sequences_in_flight"] == 2, "the request to start")
    # ... and left long before 2 x 480 tokens can be generated
    wait_until(lambda: server.metrics().get(ABORTED, 0) == aborted + 2, "both samples of the abandoned request to be cancelled")
    wait_until(lambda: settled(server), "KV blocks back in the pool after the disconnect")
