"""The room requests with media wait for before their media are decoded (engine/media_gate.py): first come, first
served, every slot given back whether its request ends (on its own, by a stop string, cancelled), fails to start or
leaves while it waits; waiters of a closed engine are told so."""
from __future__ import annotations

import asyncio
import types

import pytest

from edge_infer.engine.async_engine import AsyncEngine
from edge_infer.engine.frontend import PreparedPrompt
from edge_infer.engine.media_gate import MediaGate
from edge_infer.engine.protocol import AbortRequests, CoreStats, Deltas, EngineRequest, TokenDelta
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.errors import EngineDeadError, InvalidRequestError


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_slots_are_granted_in_arrival_order_and_given_back():
    async def scenario() -> list[str]:
        gate = MediaGate(2)
        order: list[str] = []
        first = await gate.acquire(2)

        async def ask(name: str, n: int):
            slots = await gate.acquire(n)
            order.append(name)
            return slots

        two = asyncio.ensure_future(ask("two", 2))
        one = asyncio.ensure_future(ask("one", 1))  # would fit before "two" does, but does not overtake it
        await settle()
        assert (gate.in_use, gate.waiting, order) == (2, 3, [])
        a, b = first.take(), first.take()
        a.release()
        await settle()
        assert order == []  # one slot free: "two" needs both, and "one" waits behind it
        a.release()  # idempotent: still one slot free
        await settle()
        assert order == []
        b.release()
        await settle()
        assert order == ["two"] and gate.waiting == 1
        (await two).release()  # none taken: both go back
        await settle()
        assert order == ["two", "one"] and gate.in_use == 1
        (await one).release()
        assert gate.in_use == 0
        return order

    asyncio.run(scenario())


def test_a_request_that_leaves_while_it_waits_lets_the_next_one_in():
    async def scenario() -> None:
        gate = MediaGate(2)
        held = await gate.acquire(1)
        big = asyncio.ensure_future(gate.acquire(2))
        small = asyncio.ensure_future(gate.acquire(1))
        await settle()
        assert not small.done()
        big.cancel()  # the client behind the big one left
        await settle()
        assert small.done() and gate.in_use == 2 and gate.waiting == 0
        small.result().release()
        held.release()
        assert gate.in_use == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("release_first", [True, False], ids=["granted, then left", "left, then a slot came free"])
def test_a_waiter_that_leaves_as_its_slot_comes_free_leaves_the_gate_whole(release_first):
    """The client leaves (its waiter cancelled) in the same loop turn as a request ends, in either order: no
    error, no slot lost, the next request gets one."""
    async def scenario() -> None:
        gate = MediaGate(1)
        slot = (await gate.acquire(1)).take()
        waiter = asyncio.ensure_future(gate.acquire(1))
        await settle()
        if release_first:
            slot.release()  # grants the waiter's slot; the waiter has not run since
            waiter.cancel()
        else:
            waiter.cancel()
            slot.release()
        await settle()
        assert waiter.cancelled() and (gate.in_use, gate.waiting) == (0, 0)
        (await asyncio.wait_for(gate.acquire(1), 1)).release()

    asyncio.run(scenario())


def test_more_sequences_than_ever_hold_media_are_refused_naming_the_limit():
    with pytest.raises(InvalidRequestError, match=r"asks for 3 sequences \(n x prompts\) with media, but at most "
                                                  r"max_num_seqs=2 sequences hold media at once.*lower n"):
        asyncio.run(MediaGate(2).acquire(3))


def test_a_request_takes_no_more_slots_than_it_was_granted():
    async def scenario() -> None:
        slots = await MediaGate(2).acquire(1)
        slots.take()
        with pytest.raises(RuntimeError, match="more engine requests with media than slots"):
            slots.take()

    asyncio.run(scenario())


def test_closing_the_gate_fails_the_requests_still_waiting():
    async def scenario() -> None:
        gate = MediaGate(1)
        held = await gate.acquire(1)
        waiter = asyncio.ensure_future(gate.acquire(1))
        await settle()
        gate.close("the engine is closed")
        with pytest.raises(EngineDeadError, match="the engine is closed"):
            await waiter
        held.release()
        assert gate.in_use == 0

    asyncio.run(scenario())


# -- the engine gives a request's slot back however it ends ---------------------------------------------------


class _Stream:
    def step(self, token_id: int) -> str:
        return "x" if token_id == 1 else "y"

    def flush(self, ids) -> str:
        return ""


class _Frontend:
    """What AsyncEngine reads of a Frontend, for a one-sequence engine with a tokenizer that spells 1 as "x"."""

    engine_config = types.SimpleNamespace(max_num_seqs=1)
    tokenizer = types.SimpleNamespace(decode_stream=lambda skip: _Stream())

    def request(self, rid, prompt, params, credits=None):
        return EngineRequest(rid, prompt.token_ids, params, credits)


class _Client:
    alive = True

    def __init__(self):
        self.sent = []

    def send(self, command) -> None:
        self.sent.append(command)


@pytest.mark.parametrize("ending", ["stop string, then the core's own finish",
                                    "cancelled, then the core's own finish", "the core's abort ack"])
def test_the_slot_comes_back_however_the_request_ends(ending):
    async def scenario() -> None:
        engine, client = AsyncEngine(_Frontend()), _Client()
        engine._client, engine._loop = client, asyncio.get_running_loop()
        slots = await engine.media_gate.acquire(1)
        # held, as a consumer holds it: a stream let go cancels its request (AsyncEngine._cancel_when_dropped)
        stream = engine.add_request(PreparedPrompt("p", [5], media=[object()]), SamplingParams(max_tokens=2, stop=["x"]),
                                    "r", media_slots=slots)
        if ending.startswith("stop string"):
            engine._on_messages([Deltas([TokenDelta("r", token_id=1)], CoreStats())])  # "x": we abort it in the core
            assert isinstance(client.sent[-1], AbortRequests)
        else:
            engine.cancel_nowait("r")
        finish = "abort" if ending == "the core's abort ack" else "length"
        engine._on_messages([Deltas([TokenDelta("r", token_id=2, finished=True, finish_reason=finish)], CoreStats())])
        assert ("r" in engine._active, engine.media_gate.in_use) == (False, 0)
        assert stream.ended

    asyncio.run(scenario())
