"""End-to-end: a client that goes away cancels its request, and its KV blocks return to the pool."""
from __future__ import annotations

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
        assert server.metrics()["edge_infer_kv_blocks_used"] > 0
    wait_until(lambda: settled(server), "KV blocks back in the pool after the disconnect")
    assert server.metrics()[ABORTED] == aborted + 1


def test_non_stream_disconnect_cancels_the_request(server):
    aborted = server.metrics().get(ABORTED, 0)
    # Gives up long before 2 x 480 tokens can be generated, even on a fast machine.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/chat/completions", json={**LONG, "n": 2}, timeout=httpx.Timeout(60, read=0.05))
    wait_until(lambda: server.metrics().get(ABORTED, 0) == aborted + 2, "both samples of the abandoned request to be cancelled")
    wait_until(lambda: settled(server), "KV blocks back in the pool after the disconnect")
