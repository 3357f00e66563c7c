"""The room requests with media wait for before their media are decoded (engine/media_gate.py): first come, first
served, every slot given back whether its request ends, fails to start or leaves while it waits."""
from __future__ import annotations

import asyncio

import pytest

from edge_infer.engine.media_gate import MediaGate
from edge_infer.errors import InvalidRequestError


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


def test_slots_granted_to_a_request_that_has_just_left_go_back():
    async def scenario() -> None:
        gate = MediaGate(1)
        held = await gate.acquire(1)
        waiter = asyncio.ensure_future(gate.acquire(1))
        await settle()
        held.release()  # grants the waiter's slot; the waiter has not run since
        waiter.cancel()
        await settle()
        assert waiter.cancelled() and gate.in_use == 0
        (await gate.acquire(1)).release()

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
