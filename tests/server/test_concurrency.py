"""End-to-end: 16 concurrent streaming clients; each gets what it would have got alone."""
from __future__ import annotations

import asyncio

import openai
import pytest

pytestmark = pytest.mark.slow

CLIENTS = 16
BOUND_S = 300


def request(i: int) -> dict:
    """Half greedy, half seeded sampling; all different prompts and lengths."""
    params = dict(messages=[{"role": "user", "content": f"Weather report number {i} for Paris"}], max_tokens=12 + i)
    return params | ({"temperature": 0} if i % 2 == 0 else {"temperature": 1.0, "seed": 100 + i})


async def streamed_text(client: openai.AsyncOpenAI, model: str, i: int) -> str:
    stream = await client.chat.completions.create(model=model, stream=True, **request(i))
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def test_concurrent_streams_match_single_requests(server, served_model):
    client = server.client()
    alone = [
        client.chat.completions.create(model=served_model.name, **request(i)).choices[0].message.content for i in range(CLIENTS)
    ]

    async def together() -> list[str | BaseException]:
        async with server.async_client() as aclient:
            jobs = [streamed_text(aclient, served_model.name, i) for i in range(CLIENTS)]
            return await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), BOUND_S)

    results = asyncio.run(together())
    # The server admits 4 running + 32 queued: every client is served (an error would be explicit, never a hang).
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert results == alone
    metrics = server.metrics()
    assert metrics["edge_infer_kv_blocks_used"] == 0 and metrics["edge_infer_sequences_in_flight"] == 0
