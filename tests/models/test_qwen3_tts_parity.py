"""Qwen3-TTS against the reference package (qwen-tts 0.1.1) on the committed tiny checkpoint.

The fixtures come from scripts/make_tts_fixtures.py (run in a separate
environment with the reference installed); these tests need only torch,
tokenizers and safetensors.

Tolerances: PCM is compared with atol 1e-5. Samples lie in [-1, 1] (std
~0.3); our fp32 decode differs from the reference's by ~2.5e-6 at most, the
rounding of differently ordered fp32 sums (convolution algorithms,
attention kernels) carried through the stack. Codes are compared exactly.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_infer.models.qwen3_tts.code2wav import StreamingDecoder, decode_chunked, receptive_field_frames
from edge_infer.models.qwen3_tts.config import ConfigError, parse_config
from edge_infer.models.qwen3_tts.generate import SamplingParams, generate_frames
from edge_infer.models.qwen3_tts.model import Qwen3TTS
from edge_infer.models.qwen3_tts.presets import checkpoint_spec
from edge_infer.models.qwen3_tts.prompt import VoiceRequest
from edge_infer.models.qwen3_tts.synth import write_random_checkpoint
from edge_infer.models.qwen3_tts.talker import Qwen3TTSTalkerCheckpoint

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts"
PCM_ATOL = 1e-5

REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["talker_cases"]}
GREEDY = [name for name, case in CASES.items() if not case["sampled"]]
SAMPLED = [name for name, case in CASES.items() if case["sampled"]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model's ops are microseconds long: a second intra-op thread
    # only adds synchronisation (10x slower on a busy two-core machine).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def tts(one_thread) -> Qwen3TTS:
    return Qwen3TTS.load(FIXTURES / "tiny")


@pytest.fixture(scope="module")
def pcm() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "reference_pcm.npz") as data:
        return {k: data[k] for k in data.files}


def request_for(case: dict) -> VoiceRequest:
    return VoiceRequest(case["input_ids"], case["speaker"], case["language"], case["instruct_ids"],
                        case["non_streaming_mode"])


def params_for(case: dict) -> SamplingParams:
    # The reference's max_new_tokens=N gives at most N-1 complete frames.
    return SamplingParams(do_sample=case["sampled"], subtalker_do_sample=case["sampled"],
                          max_frames=case["max_new_tokens"] - 1)


def test_text_tokenizer_matches_reference(tts: Qwen3TTS) -> None:
    for sample in REFERENCE["tokenizer_samples"]:
        assert tts.tokenizer.encode(sample["text"]) == sample["ids"], sample["text"]
    for case in CASES.values():
        assert tts.tokenizer.assistant_ids(case["text"]) == case["input_ids"]
        if case["instruct"]:
            assert tts.tokenizer.instruct_ids(case["instruct"]) == case["instruct_ids"]


@pytest.mark.parametrize("name", GREEDY)
def test_prompt_embeddings_match_reference(tts: Qwen3TTS, name: str) -> None:
    case = CASES[name]
    with np.load(FIXTURES / "reference_prompts.npz") as ref:
        prefill, trailing, pad = (ref[f"{name}.{k}"] for k in ("prefill_embeds", "trailing_text", "pad_embed"))
    prompt = tts.prompt(request_for(case))
    np.testing.assert_allclose(prompt.prefill.numpy(), prefill, atol=1e-5, rtol=0)
    np.testing.assert_allclose(prompt.trailing_text.numpy(), trailing, atol=1e-5, rtol=0)
    np.testing.assert_allclose(prompt.pad.numpy(), pad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", GREEDY)
def test_greedy_codes_match_reference_token_for_token(tts: Qwen3TTS, name: str) -> None:
    case = CASES[name]
    frames = [f.tolist() for f in tts.frames(request_for(case), params_for(case))]
    assert frames == case["codes"]


def test_fixtures_cover_eos_and_the_frame_limit() -> None:
    stops = {len(c["codes"]) < c["max_new_tokens"] - 1 for c in CASES.values()}
    assert stops == {True, False}


@pytest.mark.parametrize("name", SAMPLED)
def test_seeded_sampling_matches_reference(tts: Qwen3TTS, name: str) -> None:
    # Same processing chain and the same order of draws from torch's global generator.
    case = CASES[name]
    torch.manual_seed(case["sampling_seed"])
    frames = [f.tolist() for f in tts.frames(request_for(case), params_for(case))]
    assert frames == case["codes"]


def test_caller_supplied_kv_cache_gives_the_same_codes(tts: Qwen3TTS) -> None:
    case = CASES[GREEDY[0]]
    prompt = tts.prompt(request_for(case))
    params = params_for(case)
    cache = tts.talker.new_cache(prompt.prefill.shape[0] + params.max_frames)
    frames = [f.tolist() for f in generate_frames(tts.talker, prompt, params, cache=cache)]
    assert frames == case["codes"]
    # This case stops on eos: its last frame was fed back before eos was drawn.
    assert cache.start == prompt.prefill.shape[0] + len(frames)


def test_code2wav_pcm_matches_reference(tts: Qwen3TTS, pcm: dict[str, np.ndarray]) -> None:
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    ours = tts.code2wav(codes).numpy()
    assert ours.shape == (codes.shape[0] * 1920,)
    np.testing.assert_allclose(ours, pcm["whole"], atol=PCM_ATOL, rtol=0)
    talker_codes = torch.tensor(CASES[REFERENCE["code2wav"]["talker_case"]]["codes"])
    np.testing.assert_allclose(tts.code2wav(talker_codes).numpy(), pcm["talker_case"], atol=PCM_ATOL, rtol=0)


def test_chunked_decode_matches_reference_chunked_decode(tts: Qwen3TTS, pcm: dict[str, np.ndarray]) -> None:
    spec = REFERENCE["code2wav"]["chunked_decode"]
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    ours = decode_chunked(tts.code2wav, codes, spec["chunk_size"], spec["left_context"]).numpy()
    np.testing.assert_allclose(ours, pcm["chunked"], atol=PCM_ATOL, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_streaming_with_receptive_field_context_equals_whole_decode(tts: Qwen3TTS, chunk: int) -> None:
    # Every layer is causal, so with as much left context as the decoder can
    # see, each chunk reproduces the whole-utterance samples, joins included;
    # only fp32 rounding differs (RoPE at other absolute positions, other GEMM shapes).
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    whole = tts.code2wav(codes)
    context = receptive_field_frames(tts.code2wav_config)
    stream = StreamingDecoder(tts.code2wav, context)
    chunks = [stream.push(codes[i:i + chunk]) for i in range(0, codes.shape[0], chunk)]
    assert [c.shape[0] for c in chunks] == [min(chunk, codes.shape[0] - i) * 1920 for i in range(0, codes.shape[0], chunk)]
    torch.testing.assert_close(torch.cat(chunks), whole, atol=PCM_ATOL, rtol=0)


def test_streaming_without_context_is_not_seamless(tts: Qwen3TTS) -> None:
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    whole = tts.code2wav(codes)
    joined = decode_chunked(tts.code2wav, codes, chunk_size=4, left_context=0)
    assert (joined[4 * 1920:] - whole[4 * 1920:]).abs().max() > 1e-2


def test_stream_equals_synthesize(tts: Qwen3TTS) -> None:
    case = CASES[GREEDY[0]]
    params = params_for(case)
    whole = tts.synthesize(request_for(case), params)
    context = receptive_field_frames(tts.code2wav_config)
    streamed = torch.cat(list(tts.stream(request_for(case), params, chunk_frames=3, left_context=context)))
    assert whole.shape[0] == len(case["codes"]) * 1920
    torch.testing.assert_close(streamed, whole, atol=PCM_ATOL, rtol=0)


def test_unknown_speaker_and_language_name_the_choices(tts: Qwen3TTS) -> None:
    with pytest.raises(ValueError, match="vivian"):
        tts.prompt(tts.request("hi", speaker="nobody"))
    with pytest.raises(ValueError, match="english"):
        tts.prompt(tts.request("hi", speaker="ryan", language="klingon"))


def test_voice_clone_checkpoints_are_refused_with_a_reason() -> None:
    config = dict(checkpoint_spec("tiny").config, tts_model_type="base")
    with pytest.raises(ConfigError, match="CustomVoice"):
        parse_config(config)


def test_random_checkpoint_loads_and_speaks(tmp_path: Path) -> None:
    write_random_checkpoint(tmp_path / "ckpt", preset="tiny", seed=5)
    tts = Qwen3TTS.load(tmp_path / "ckpt")
    request = tts.request("Hello world.", speaker="vivian", language="english")
    pcm = tts.synthesize(request, tts.sampling(max_frames=3).greedy())
    assert pcm.shape[0] in (1920, 2 * 1920, 3 * 1920)
    assert torch.isfinite(pcm).all()


def test_real_size_preset_has_the_released_shapes() -> None:
    spec = checkpoint_spec("qwen3-tts-0.6b")
    with torch.device("meta"):
        model = Qwen3TTSTalkerCheckpoint(parse_config(spec.config))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["talker.model.text_embedding.weight"] == (151936, 2048)
    assert shapes["talker.text_projection.linear_fc2.weight"] == (1024, 2048)
    assert shapes["talker.codec_head.weight"] == (3072, 1024)
    assert shapes["talker.model.layers.27.self_attn.k_proj.weight"] == (8 * 128, 1024)
    assert shapes["talker.code_predictor.lm_head.14.weight"] == (2048, 1024)
    assert "talker.code_predictor.small_to_mtp_projection.weight" not in shapes


def test_committed_fixture_was_written_from_the_tiny_preset() -> None:
    # If this fails, presets.py changed: rerun scripts/make_tts_fixtures.py.
    spec = checkpoint_spec("tiny")
    tiny = FIXTURES / "tiny"
    assert json.loads((tiny / "config.json").read_text(encoding="utf-8")) == spec.config
    assert json.loads((tiny / "speech_tokenizer" / "config.json").read_text(encoding="utf-8")) == spec.speech_tokenizer_config
