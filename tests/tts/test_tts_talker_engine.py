"""The Talker on the engine's machinery (paged KV cache, scheduler) against the reference fixtures.

The codes must equal the committed reference codes token for token, for a
request alone, for requests batched together, and when a small KV budget
makes the scheduler preempt and recompute.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edge_infer.config import EngineConfig
from edge_infer.errors import InvalidRequestError
from edge_infer.models.qwen3_tts.prompt import VoiceRequest, build_prompt, prompt_length
from edge_infer.models.qwen3_tts.config import SamplingParams
from edge_infer.tts.talker_engine import TalkerEngine, load_talker_engine

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts" / "tiny"
REFERENCE = json.loads((TINY.parent / "reference.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["talker_cases"]}
GREEDY = [name for name, case in CASES.items() if not case["sampled"]]
SAMPLED = [name for name, case in CASES.items() if case["sampled"]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def kv_bytes_per_position() -> int:
    shape = json.loads((TINY / "config.json").read_text())["talker_config"]
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * 4  # K and V, fp32


def engine(kv_bytes: int = 1 << 20, max_num_seqs: int = 8, max_num_batched_tokens: int = 64) -> TalkerEngine:
    return load_talker_engine(EngineConfig(
        model=str(TINY), dtype="float32", max_model_len=128, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, kv_cache_memory_bytes=kv_bytes,
    ))


@pytest.fixture(scope="module")
def roomy() -> TalkerEngine:
    return engine()


def submit(eng: TalkerEngine, name: str, request_id: str | None = None) -> None:
    case = CASES[name]
    voice = VoiceRequest(case["input_ids"], case["speaker"], case["language"], case["instruct_ids"], case["non_streaming_mode"])
    params = SamplingParams(do_sample=case["sampled"], subtalker_do_sample=case["sampled"], max_frames=case["max_new_tokens"] - 1)
    eng.add(request_id or name, voice, params)


def drain(eng: TalkerEngine) -> dict[str, list[list[int]]]:
    frames: dict[str, list[list[int]]] = {}
    reasons: dict[str, str] = {}
    while eng.has_work():
        for event in eng.step():
            assert event.error is None, event.error
            if event.frame is not None:
                frames.setdefault(event.request_id, []).append(event.frame.tolist())
            if event.finished:
                reasons[event.request_id] = event.finish_reason
    assert set(reasons) == set(frames), "every request ends exactly once"
    return frames


@pytest.mark.parametrize("name", GREEDY)
def test_one_request_matches_the_reference_codes(roomy: TalkerEngine, name: str) -> None:
    submit(roomy, name)
    assert drain(roomy)[name] == CASES[name]["codes"]


def test_batched_requests_each_match_the_reference_codes(roomy: TalkerEngine) -> None:
    for name in GREEDY:
        submit(roomy, name)
    # A second copy of one request, admitted alongside, must not disturb the others either.
    submit(roomy, GREEDY[0], "copy")
    frames = drain(roomy)
    for name in GREEDY:
        assert frames[name] == CASES[name]["codes"], name
    assert frames["copy"] == CASES[GREEDY[0]]["codes"]


def test_preempted_requests_are_recomputed_to_the_same_codes() -> None:
    # 8 blocks of 16 positions: the five prompts and their frames do not fit together.
    eng = engine(kv_bytes=8 * 16 * kv_bytes_per_position(), max_num_batched_tokens=32)
    for name in GREEDY:
        submit(eng, name)
    frames = drain(eng)
    assert eng.scheduler.num_preemptions > 0
    for name in GREEDY:
        assert frames[name] == CASES[name]["codes"], name
    assert eng.scheduler.allocator.num_used == 0


def test_prompt_length_is_the_prefill_the_engine_builds(roomy: TalkerEngine) -> None:
    for case in CASES.values():
        voice = VoiceRequest(case["input_ids"], case["speaker"], case["language"], case["instruct_ids"], case["non_streaming_mode"])
        with torch.inference_mode():
            prefill = build_prompt(roomy.talker, roomy.config, voice).prefill
        assert prompt_length(roomy.config, voice) == prefill.shape[0], case["name"]


@pytest.mark.parametrize("name", SAMPLED)
def test_seeded_sampling_alone_matches_the_reference(roomy: TalkerEngine, name: str) -> None:
    torch.manual_seed(CASES[name]["sampling_seed"])
    submit(roomy, name)
    assert drain(roomy)[name] == CASES[name]["codes"]


def test_abort_frees_the_blocks_and_other_requests_continue(roomy: TalkerEngine) -> None:
    submit(roomy, GREEDY[0], "kept")
    submit(roomy, GREEDY[1], "dropped")
    first = [e.frame.tolist() for e in roomy.step() if e.request_id == "kept"]
    assert roomy.abort("dropped")
    assert not roomy.abort("dropped")
    frames = drain(roomy)
    assert "dropped" not in frames
    assert first + frames["kept"] == CASES[GREEDY[0]]["codes"]
    assert roomy.scheduler.allocator.num_used == 0


def test_bad_requests_are_refused_with_the_reason(roomy: TalkerEngine) -> None:
    case = CASES[GREEDY[0]]
    with pytest.raises(InvalidRequestError, match="vivian"):
        roomy.add("x", VoiceRequest(case["input_ids"], "nobody"), SamplingParams())
    long_ids = case["input_ids"][:3] + case["input_ids"][3:-5] * 20 + case["input_ids"][-5:]
    with pytest.raises(InvalidRequestError, match="max_model_len"):
        roomy.add("y", VoiceRequest(long_ids, "ryan"), SamplingParams())
    assert not roomy.has_work()


def test_a_kv_budget_below_one_request_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        engine(kv_bytes=4 * 16 * kv_bytes_per_position())


def test_planned_weight_and_kv_bytes_are_what_the_engine_holds(roomy: TalkerEngine) -> None:
    from edge_infer.tts.planning import talker_bytes

    planned = talker_bytes(roomy.config, roomy.engine_config)
    assert planned.weights == roomy.talker.resident_bytes()
    assert planned.kv == roomy.cache.nbytes + roomy.predictor.cache.nbytes


def test_prompt_steps_use_the_prefill_threads_and_frame_steps_the_decode_threads() -> None:
    eng = engine()
    eng.set_threads(prefill=2, decode=1)
    submit(eng, GREEDY[0])
    seen = []
    while eng.has_work():
        prefill = eng.requests[GREEDY[0]].seq.num_computed < eng.requests[GREEDY[0]].prompt_len
        eng.step()
        seen.append((prefill, torch.get_num_threads()))
    assert seen[0] == (True, 2)
    assert {threads for prefill, threads in seen[1:] if not prefill} == {1}


@pytest.fixture(scope="module")
def w4a8_checkpoint(tmp_path_factory) -> Path:
    """The tiny layout with head_dim 16 in both decoders: the fused W4A8 decode layer takes multiples of 16."""
    import copy
    from dataclasses import replace

    from edge_infer.models.qwen3_tts import synth
    from edge_infer.quant.native import missing_requirement

    if missing_requirement() is not None:
        pytest.skip(missing_requirement())
    spec = synth.checkpoint_spec("tiny")
    config = copy.deepcopy(spec.config)
    talker = config["talker_config"]
    talker["head_dim"] = 16
    talker["rope_scaling"]["mrope_section"] = [4, 2, 2]
    talker["code_predictor_config"]["head_dim"] = 16
    out = tmp_path_factory.mktemp("w4a8-talker")
    original = synth.checkpoint_spec
    synth.checkpoint_spec = lambda preset: replace(spec, config=config)
    try:
        return synth.write_random_checkpoint(out, "tiny")
    finally:
        synth.checkpoint_spec = original


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # float32: what a CPU without native bf16 runs
def test_a_w4a8_talker_runs_its_frame_steps_in_fused_layers(w4a8_checkpoint: Path, dtype: str) -> None:
    from edge_infer.config import QuantConfig

    eng = load_talker_engine(EngineConfig(
        model=str(w4a8_checkpoint), dtype=dtype, max_model_len=128, max_num_seqs=2, max_num_batched_tokens=64,
        kv_cache_memory_bytes=1 << 20, quant=QuantConfig(kernel="int8"),
    ))
    voice = VoiceRequest(CASES[GREEDY[0]]["input_ids"], CASES[GREEDY[0]]["speaker"])
    for request_id in ("a", "b"):  # two at once: the fused layer takes a batch of sequences
        eng.add(request_id, voice, SamplingParams(do_sample=False, subtalker_do_sample=False, max_frames=6,
                                                  ignore_eos=True))
    frames = drain(eng)
    assert eng.talker.decoder.fused_decode is True and eng.talker.predictor.fused_decode is True
    assert [len(f) for f in frames.values()] == [6, 6]
    codebook = eng.config.talker.code_predictor.codebook_size
    assert all(0 <= code < codebook for f in frames.values() for frame in f for code in frame[1:])
    # Both requests were identical and greedy: batched in the fused layers, they stay identical.
    assert frames["a"] == frames["b"]


def test_every_code_predictor_pass_runs_in_the_fused_layer_with_the_pytorch_layers_codes(w4a8_checkpoint: Path) -> None:
    """The frame's first predictor pass (two positions: the Talker's hidden state and code 0) is a decode step too."""
    from edge_infer.config import QuantConfig

    codes = {}
    for fused in (True, False):
        eng = load_talker_engine(EngineConfig(
            model=str(w4a8_checkpoint), dtype="float32", max_model_len=128, max_num_seqs=2, max_num_batched_tokens=64,
            kv_cache_memory_bytes=1 << 20, quant=QuantConfig(kernel="int8"),
        ))
        predictor = eng.talker.predictor
        predictor.fused_decode = None if fused else False
        layer_calls = []
        predictor.layers[0].register_forward_hook(lambda *_: layer_calls.append(1))
        voice = VoiceRequest(CASES[GREEDY[0]]["input_ids"], CASES[GREEDY[0]]["speaker"])
        for request_id in ("a", "b"):
            eng.add(request_id, voice, SamplingParams(do_sample=False, subtalker_do_sample=False, max_frames=5,
                                                      ignore_eos=True))
        codes[fused] = drain(eng)
        assert predictor.fused_decode is fused
        assert (len(layer_calls) == 0) is fused  # fused: no pass of the predictor went through the PyTorch layers
    assert codes[True] == codes[False]
