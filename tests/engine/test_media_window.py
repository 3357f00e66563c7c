"""Requests with media beyond max_num_seqs wait before their media are decoded, in every frontend (LLM.chat,
LocalTextEngine; the server's in tests/server/test_media_api.py): the worker never holds media for more sequences
than the memory plan's "sequence media" item does, and the answers are the ones each request gets alone."""
from __future__ import annotations

import asyncio

import pytest

from media_files import data_url, png
from edge_infer import LLM, SamplingParams
from edge_infer.engine.local import LocalTextEngine
from edge_infer.errors import InvalidRequestError, MediaError, StaleSessionError

pytestmark = pytest.mark.slow

SETTINGS = dict(dtype="float32", max_model_len=1024, max_num_batched_tokens=256,
                media_limits={"max_images": 1, "max_image_pixels": 112 * 112})
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def image(seed: int) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(png(seed), "image/png")}}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}]


CONVERSATIONS = [user(image(1)), user(), user(image(2)), user(image(3)), user(), user(image(4))]


@pytest.fixture(scope="module")
def model(synth_thinkers) -> str:
    return synth_thinkers["qwen2_5_vl"]


@pytest.fixture(scope="module")
def alone(model) -> list[list[int]]:
    with LLM(model, worker="thread", max_num_seqs=1, **SETTINGS) as llm:
        return [llm.chat(c, PARAMS)[0].outputs[0].token_ids for c in CONVERSATIONS]


def test_llm_chat_sends_media_as_the_worker_has_room(model, alone):
    with LLM(model, worker="thread", max_num_seqs=2, **SETTINGS) as llm:
        together = llm.chat(CONVERSATIONS, PARAMS)
        assert [out.outputs[0].token_ids for out in together] == alone
        assert llm.core_stats.media_sequences_peak == 2  # 4 images, at most 2 sequences with media at once
        assert llm.core_stats.media_sequences == 0
        with pytest.raises(InvalidRequestError, match=r"asks for 3 sequences .* at most max_num_seqs=2 .* lower n"):
            llm.chat(CONVERSATIONS[0], SamplingParams(n=3, max_tokens=2))


def test_media_that_fail_to_load_late_in_a_batch_raise_and_the_engine_serves_on(model, alone):
    broken = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(b"not a png",
                                                                                                "image/png")}}]}]
    with LLM(model, worker="thread", max_num_seqs=1, **SETTINGS) as llm:
        with pytest.raises(MediaError, match=r"^conversation 2: messages\[0\]\.content\[0\] \(image_url\)"):
            llm.chat([CONVERSATIONS[0], CONVERSATIONS[2], broken], PARAMS)  # loaded once the first two are done
        assert llm.core_stats.media_encoded == 2  # the two before it ran (their pictures were encoded)
        assert [o.outputs[0].token_ids for o in llm.chat(CONVERSATIONS[:3], PARAMS)] == alone[:3]
        assert llm.core_stats.media_sequences == 0


def test_local_text_engine_submits_an_image_once_the_one_before_has_ended(model, alone):
    async def scenario() -> None:
        engine = LocalTextEngine(model, worker="thread", max_num_seqs=1, **SETTINGS)
        await engine.start()
        try:
            session = engine.open_session()

            async def ask(messages) -> tuple[str, list[int]]:
                rid, stream = await engine.submit(session, messages, max_tokens=4, ignore_eos=True)
                return rid, [t for event in [e async for e in stream] for t in event.token_ids]

            answers = await asyncio.gather(*(ask(CONVERSATIONS[i]) for i in (0, 2, 3)))
            assert [tokens for _, tokens in answers] == [alone[0], alone[2], alone[3]]
            # rendered on threads, so they reach the gate in any order; in the order they reached the engine,
            # each did so after the one before ended
            records = sorted((engine.records[rid] for rid, _ in answers), key=lambda r: r.submitted_at)
            for before, after in zip(records, records[1:]):
                assert after.submitted_at >= before.finished_at

            # a session closed while its request waits for room: refused, and the room it waited for is free
            rid, stream = await engine.submit(session, CONVERSATIONS[0], max_tokens=800, ignore_eos=True)
            waiting = asyncio.ensure_future(engine.submit(session, CONVERSATIONS[2], max_tokens=4))
            await _until(lambda: engine._engine.media_gate.waiting == 1)
            engine.close_session(session.session_id)
            with pytest.raises(StaleSessionError):
                await waiting
            await asyncio.wait_for(_drain(stream), 60)
            await _until(lambda: engine._engine.media_gate.in_use == 0)  # given back with the core's abort ack
        finally:
            await engine.close()

    asyncio.run(scenario())


async def _until(condition, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


async def _drain(stream) -> None:
    async for _ in stream:
        pass
