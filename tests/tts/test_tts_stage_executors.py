"""The Talker and Code2Wav executors driven in-process (no stage processes): chunking, joins, errors.

Tolerances: PCM is compared with atol 1e-5 (samples lie in [-1, 1]; the
decoders differ from the reference's by ~3e-6, fp32 sums in other orders).
Streamed chunks, carried state or a receptive-field left context, must
meet that at every sample, the joins included.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_infer.models.qwen3_tts.code2wav import receptive_field_frames
from edge_infer.models.qwen3_tts.code2wav_shapes import decode_state_bytes
from edge_infer.models.qwen3_tts.config import load_code2wav_config
from edge_infer.runtime.config import StageConfig
from edge_infer.runtime.contracts import Payload, validate
from edge_infer.runtime.executors import StageRequestError
from edge_infer.tts.executors import Code2WavExecutor, TalkerExecutor
from edge_infer.tts.planning import conv_kernel_bytes, decode_lengths, distinct_decode_shapes

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts" / "tiny"
REFERENCE = json.loads((TINY.parent / "reference.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["talker_cases"]}
PCM_ATOL = 1e-5
FRAME = 1920


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def reference_pcm() -> dict[str, np.ndarray]:
    with np.load(TINY.parent / "reference_pcm.npz") as data:
        return {k: data[k] for k in data.files}


def stage(executor: str, kind: str, **options) -> StageConfig:
    return StageConfig(stage_id=0, kind=kind, executor=executor, model=str(TINY), engine={"dtype": "float32", "max_model_len": 128},
                       executor_options={"num_threads": 1, **options})


def code2wav(**options) -> Code2WavExecutor:
    executor = Code2WavExecutor()
    executor.start(stage("qwen3_tts_code2wav", "generation", **options))
    return executor


def run_code2wav(executor: Code2WavExecutor, codes: np.ndarray, pieces: list[int]) -> list[np.ndarray]:
    executor.submit("r", {})
    chunks, start = [], 0
    for n in pieces:
        executor.feed("r", Payload("codec_codes/1", codes[start:start + n], {"num_codebooks": 16, "frame_rate_hz": 12.5}))
        start += n
        while executor.has_work():
            chunks += [out.payload for out in executor.step() if out.payload is not None]
    executor.end_input("r")
    finished = False
    while executor.has_work():
        for out in executor.step():
            finished |= out.finished
            if out.payload is not None:
                chunks.append(out.payload)
    assert finished and start == len(codes)
    for payload in chunks:
        assert validate(payload).valid
        assert payload.metadata == {"sample_rate": 24000, "channels": 1}
    return [p.data for p in chunks]


@pytest.mark.parametrize("pieces, decoded", [([1] * 10, [1] * 10), ([3, 4, 3], [2, 1, 4, 2, 1]), ([8, 2], [8, 2])])
def test_streamed_pcm_with_carried_state_equals_the_reference_whole_decode(reference_pcm, pieces, decoded) -> None:
    # Frames are decoded in powers of two up to max_chunk_frames (8): 3 arrived frames as 2 then 1.
    codes = np.array(CASES[REFERENCE["code2wav"]["talker_case"]]["codes"][:10], dtype=np.int64)
    whole = reference_pcm["talker_case"][:10 * FRAME]
    chunks = run_code2wav(code2wav(), codes, pieces)
    assert [len(c) for c in chunks] == [n * FRAME for n in decoded]
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=PCM_ATOL, rtol=0)


def test_chunks_are_capped_at_max_chunk_frames(reference_pcm) -> None:
    codes = np.array(CASES[REFERENCE["code2wav"]["talker_case"]]["codes"], dtype=np.int64)
    chunks = run_code2wav(code2wav(max_chunk_frames=6), codes, [len(codes)])
    whole, rest = divmod(len(codes), 6)
    tail = [n for n in (4, 2, 1) if rest & n]  # a remainder below 6 in the powers of two under it
    assert [len(c) // FRAME for c in chunks] == [6] * whole + tail
    np.testing.assert_allclose(np.concatenate(chunks), reference_pcm["talker_case"], atol=PCM_ATOL, rtol=0)


@pytest.mark.parametrize("max_chunk, lengths", [(8, [1, 2, 4, 8]), (6, [1, 2, 4, 6]), (1, [1])])
def test_code2wav_books_the_primitives_of_each_length_it_decodes(max_chunk, lengths) -> None:
    # Every distinct decode length leaves oneDNN primitives behind; the plan books one set per length.
    assert decode_lengths(max_chunk) == lengths
    plans = {n: Code2WavExecutor.plan(stage("qwen3_tts_code2wav", "generation", max_chunk_frames=n)) for n in (1, max_chunk)}
    assert plans[max_chunk].runtime_bytes - plans[1].runtime_bytes == (len(lengths) - 1) * conv_kernel_bytes("float32", 1)
    # With a left context a piece follows 0..N earlier frames: up to N + max_chunk lengths.
    assert distinct_decode_shapes(max_chunk, 25) == min(len(lengths) * 26, 25 + max_chunk)


def test_left_context_of_the_receptive_field_joins_within_tolerance(reference_pcm) -> None:
    codes = np.array(CASES[REFERENCE["code2wav"]["talker_case"]]["codes"], dtype=np.int64)
    context = receptive_field_frames(load_code2wav_config(TINY))
    chunks = run_code2wav(code2wav(left_context_frames=context, max_chunk_frames=3), codes, [len(codes)])
    np.testing.assert_allclose(np.concatenate(chunks), reference_pcm["talker_case"], atol=PCM_ATOL, rtol=0)


def test_planned_decode_state_is_what_a_stream_carries() -> None:
    executor = code2wav()
    run_code2wav(executor, np.zeros((5, 16), dtype=np.int64), [5])
    state = executor.model.new_state()
    executor.model(torch.zeros(5, 16, dtype=torch.long), state)
    carried = sum(t.numel() * t.element_size() for t in [*state.tails.values(), *state.kv.k, *state.kv.v])
    assert carried == decode_state_bytes(executor.config, 4)


def test_a_busy_code2wav_trims_the_heap_once_a_decode_might_not_fit_its_plan(monkeypatch) -> None:
    # A stage that never idles never gets the worker's trim: the executor trims itself when its RssAnon
    # passes the plan less one decode's activations, and only then.
    import edge_infer.tts.executors as executors

    executor, trims = code2wav(), []
    plan = Code2WavExecutor.plan(stage("qwen3_tts_code2wav", "generation"))
    assert executor.trim_above == plan.weights_bytes + plan.kv_bytes + plan.runtime_bytes
    monkeypatch.setattr(executors, "malloc_trim", lambda: trims.append(True))
    for rss, trimmed in ((executor.trim_above, []), (executor.trim_above + 1, [True])):
        monkeypatch.setattr(executors, "rss_anon_bytes", lambda: rss)
        trims.clear()
        run_code2wav(executor, np.zeros((1, 16), dtype=np.int64), [1])
        assert trims == trimmed * 2  # after the decode's step and after the finishing one


def test_code2wav_refuses_codes_it_cannot_decode() -> None:
    executor = code2wav()
    executor.submit("r", {})
    with pytest.raises(StageRequestError, match="codebooks"):
        executor.feed("r", Payload("codec_codes/1", np.zeros((2, 8), dtype=np.int64), {}))
    with pytest.raises(StageRequestError, match="outside"):
        executor.feed("r", Payload("codec_codes/1", np.full((2, 16), 64, dtype=np.int64), {}))


@pytest.fixture(scope="module")
def talker() -> TalkerExecutor:
    executor = TalkerExecutor()
    executor.start(stage("qwen3_tts_talker", "ar", first_chunk_frames=1, chunk_frames=4))
    return executor


def run_talker(executor: TalkerExecutor, request_id: str, text: str, params: dict) -> tuple[list[Payload], bool]:
    executor.submit(request_id, params)
    executor.feed(request_id, Payload("text/1", text))
    executor.end_input(request_id)
    chunks, finished = [], False
    while executor.has_work():
        for out in executor.step():
            assert out.error is None, out.error
            finished |= out.finished
            if out.payload is not None:
                chunks.append(out.payload)
    return chunks, finished


def test_talker_streams_the_reference_codes_in_configured_chunks(talker: TalkerExecutor) -> None:
    case = CASES["english_ryan"]
    params = {"voice": case["speaker"], "language": case["language"], "temperature": 0, "subtalker_temperature": 0,
              "max_tokens": case["max_new_tokens"] - 1}
    chunks, finished = run_talker(talker, "r", case["text"], params)
    assert finished
    sizes = [len(c.data) for c in chunks]
    assert sizes[0] == 1 and all(s == 4 for s in sizes[1:-1]) and 1 <= sizes[-1] <= 4
    for payload in chunks:
        assert validate(payload).valid
        assert payload.metadata == {"num_codebooks": 16, "frame_rate_hz": 12.5, "codebook_size": 64}
    assert np.concatenate([c.data for c in chunks]).tolist() == case["codes"]


def test_seeded_requests_repeat(talker: TalkerExecutor) -> None:
    params = {"voice": "vivian", "seed": 7, "max_tokens": 6}
    first, _ = run_talker(talker, "a", "Seeded sampling.", params)
    again, _ = run_talker(talker, "b", "Seeded sampling.", params)
    assert np.concatenate([c.data for c in first]).tolist() == np.concatenate([c.data for c in again]).tolist()


@pytest.mark.parametrize("text, params, message", [
    ("hello", {"voice": "nobody"}, "unknown voice 'nobody'; this checkpoint has: aiden"),
    ("   ", {"voice": "ryan"}, "empty"),
    ("hello", {"voice": "ryan", "speed": 2}, "speed"),
    ("hello", {"voice": "ryan", "language": "klingon"}, "english"),
    ("hello", {"voice": "ryan", "instruct": "whisper"}, "instruct"),
])
def test_talker_refuses_bad_requests_with_the_reason(talker: TalkerExecutor, text, params, message) -> None:
    talker.submit("bad", params)
    talker.feed("bad", Payload("text/1", text))
    with pytest.raises(StageRequestError, match=message):
        talker.end_input("bad")
    talker.abort("bad")
    assert not talker.has_work()


def test_the_code2wav_stage_decodes_with_the_native_snake_where_the_kernels_run() -> None:
    from edge_infer.models.qwen3_tts.code2wav import SnakeBeta
    from edge_infer.quant.native import vector_variant

    snakes = [m for m in code2wav().model.modules() if isinstance(m, SnakeBeta)]
    assert snakes and all(m.kernel_variant == vector_variant() for m in snakes)

