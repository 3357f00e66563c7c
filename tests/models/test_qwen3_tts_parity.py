"""The served Qwen3-TTS model against the reference package (qwen-tts 0.1.1) on the committed tiny checkpoint.

The fixtures come from scripts/make_tts_fixtures.py (run in a separate
environment with the reference installed); these tests need only torch,
tokenizers and safetensors. Here: the text tokenizer, the Talker's prompt
embeddings and Code2Wav's PCM. The Talker's codes are compared on the
engine that serves them, alone, batched, preempted and sampled with a seed
(tests/tts/test_tts_talker_engine.py).

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

from edge_infer.config import EngineConfig
from edge_infer.models.qwen3_tts.code2wav import Code2Wav, StreamingDecoder, load_code2wav, receptive_field_frames
from edge_infer.models.qwen3_tts.config import ConfigError, load_code2wav_config, parse_config
from edge_infer.models.qwen3_tts.presets import checkpoint_spec
from edge_infer.models.qwen3_tts.prompt import VoiceRequest, build_prompt
from edge_infer.models.qwen3_tts.synth import write_random_checkpoint
from edge_infer.models.qwen3_tts.talker_weights import checkpoint_shapes
from edge_infer.models.qwen3_tts.tokenizer import TextTokenizer
from edge_infer.models.qwen3_tts.config import SamplingParams
from edge_infer.tts.talker_engine import TalkerEngine, load_talker_engine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3_tts"
TINY = FIXTURES / "tiny"
PCM_ATOL = 1e-5

REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in REFERENCE["talker_cases"]}
GREEDY = [name for name, case in CASES.items() if not case["sampled"]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The tiny model's ops are microseconds long: a second intra-op thread
    # only adds synchronisation (10x slower on a busy two-core machine).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def talker_engine(model_dir: Path) -> TalkerEngine:
    return load_talker_engine(EngineConfig(model=str(model_dir), dtype="float32", max_model_len=128,
                                           max_num_seqs=1, max_num_batched_tokens=64,
                                           kv_cache_memory_bytes=1 << 20))


@pytest.fixture(scope="module")
def engine(one_thread) -> TalkerEngine:
    return talker_engine(TINY)


@pytest.fixture(scope="module")
def code2wav(one_thread) -> Code2Wav:
    return load_code2wav(TINY, load_code2wav_config(TINY))


@pytest.fixture(scope="module")
def pcm() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "reference_pcm.npz") as data:
        return {k: data[k] for k in data.files}


def request_for(case: dict) -> VoiceRequest:
    return VoiceRequest(case["input_ids"], case["speaker"], case["language"], case["instruct_ids"],
                        case["non_streaming_mode"])


def decode_chunked(code2wav: Code2Wav, codes: torch.Tensor, chunk_size: int, left_context: int) -> torch.Tensor:
    """The reference's decode of a whole utterance: chunks, each after ``left_context`` earlier frames."""
    stream = StreamingDecoder(code2wav, left_context)
    return torch.cat([stream.push(codes[i:i + chunk_size]) for i in range(0, codes.shape[0], chunk_size)])


def test_text_tokenizer_matches_reference() -> None:
    tokenizer = TextTokenizer.from_dir(TINY)
    for sample in REFERENCE["tokenizer_samples"]:
        assert tokenizer.encode(sample["text"]) == sample["ids"], sample["text"]
    for case in CASES.values():
        assert tokenizer.assistant_ids(case["text"]) == case["input_ids"]
        if case["instruct"]:
            assert tokenizer.instruct_ids(case["instruct"]) == case["instruct_ids"]


@pytest.mark.parametrize("name", GREEDY)
def test_prompt_embeddings_match_reference(engine: TalkerEngine, name: str) -> None:
    with np.load(FIXTURES / "reference_prompts.npz") as ref:
        prefill, trailing, pad = (ref[f"{name}.{k}"] for k in ("prefill_embeds", "trailing_text", "pad_embed"))
    with torch.inference_mode():
        prompt = build_prompt(engine.talker, engine.config, request_for(CASES[name]))
    np.testing.assert_allclose(prompt.prefill.numpy(), prefill, atol=1e-5, rtol=0)
    np.testing.assert_allclose(prompt.trailing_text.numpy(), trailing, atol=1e-5, rtol=0)
    np.testing.assert_allclose(prompt.pad.numpy(), pad, atol=1e-5, rtol=0)


def test_fixtures_cover_eos_and_the_frame_limit() -> None:
    stops = {len(c["codes"]) < c["max_new_tokens"] - 1 for c in CASES.values()}
    assert stops == {True, False}


def test_code2wav_pcm_matches_reference(code2wav: Code2Wav, pcm: dict[str, np.ndarray]) -> None:
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    ours = code2wav(codes).numpy()
    assert ours.shape == (codes.shape[0] * 1920,)
    np.testing.assert_allclose(ours, pcm["whole"], atol=PCM_ATOL, rtol=0)
    talker_codes = torch.tensor(CASES[REFERENCE["code2wav"]["talker_case"]]["codes"])
    np.testing.assert_allclose(code2wav(talker_codes).numpy(), pcm["talker_case"], atol=PCM_ATOL, rtol=0)


def test_chunked_decode_matches_reference_chunked_decode(code2wav: Code2Wav, pcm: dict[str, np.ndarray]) -> None:
    spec = REFERENCE["code2wav"]["chunked_decode"]
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    ours = decode_chunked(code2wav, codes, spec["chunk_size"], spec["left_context"]).numpy()
    np.testing.assert_allclose(ours, pcm["chunked"], atol=PCM_ATOL, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_streaming_with_receptive_field_context_equals_whole_decode(code2wav: Code2Wav, chunk: int) -> None:
    # Every layer is causal, so with as much left context as the decoder can
    # see, each chunk reproduces the whole-utterance samples, joins included;
    # only fp32 rounding differs (RoPE at other absolute positions, other GEMM shapes).
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    whole = code2wav(codes)
    stream = StreamingDecoder(code2wav, receptive_field_frames(code2wav.config))
    chunks = [stream.push(codes[i:i + chunk]) for i in range(0, codes.shape[0], chunk)]
    assert [c.shape[0] for c in chunks] == [min(chunk, codes.shape[0] - i) * 1920 for i in range(0, codes.shape[0], chunk)]
    torch.testing.assert_close(torch.cat(chunks), whole, atol=PCM_ATOL, rtol=0)


def test_streaming_without_context_is_not_seamless(code2wav: Code2Wav) -> None:
    codes = torch.tensor(REFERENCE["code2wav"]["random_codes"])
    whole = code2wav(codes)
    joined = decode_chunked(code2wav, codes, chunk_size=4, left_context=0)
    assert (joined[4 * 1920:] - whole[4 * 1920:]).abs().max() > 1e-2


def test_unknown_speaker_and_language_name_the_choices(engine: TalkerEngine) -> None:
    ids = TextTokenizer.from_dir(TINY).assistant_ids("hi")
    with pytest.raises(ValueError, match="vivian"):
        build_prompt(engine.talker, engine.config, VoiceRequest(ids, speaker="nobody"))
    with pytest.raises(ValueError, match="english"):
        build_prompt(engine.talker, engine.config, VoiceRequest(ids, speaker="ryan", language="klingon"))


def test_voice_clone_checkpoints_are_refused_with_a_reason() -> None:
    config = dict(checkpoint_spec("tiny").config, tts_model_type="base")
    with pytest.raises(ConfigError, match="CustomVoice"):
        parse_config(config)


def test_random_checkpoint_loads_and_speaks(tmp_path: Path) -> None:
    model_dir = write_random_checkpoint(tmp_path / "ckpt", preset="tiny", seed=5)
    engine = talker_engine(model_dir)
    ids = TextTokenizer.from_dir(model_dir).assistant_ids("Hello world.")
    engine.add("r", VoiceRequest(ids, speaker="vivian", language="english"),
               SamplingParams(do_sample=False, subtalker_do_sample=False, max_frames=3))
    frames = []
    while engine.has_work():
        frames += [event.frame for event in engine.step() if event.frame is not None]
    pcm = load_code2wav(model_dir, load_code2wav_config(model_dir))(torch.stack(frames))
    assert pcm.shape[0] in (1920, 2 * 1920, 3 * 1920)
    assert torch.isfinite(pcm).all()


def test_real_size_preset_has_the_released_shapes() -> None:
    shapes = checkpoint_shapes(parse_config(checkpoint_spec("qwen3-tts-0.6b").config))
    assert shapes["talker.model.text_embedding.weight"] == (151936, 2048)
    assert shapes["talker.text_projection.linear_fc2.weight"] == (1024, 2048)
    assert shapes["talker.codec_head.weight"] == (3072, 1024)
    assert shapes["talker.model.layers.27.self_attn.k_proj.weight"] == (8 * 128, 1024)
    assert shapes["talker.code_predictor.lm_head.14.weight"] == (2048, 1024)
    assert "talker.code_predictor.small_to_mtp_projection.weight" not in shapes


def test_committed_fixture_was_written_from_the_tiny_preset() -> None:
    # If this fails, presets.py changed: rerun scripts/make_tts_fixtures.py.
    spec = checkpoint_spec("tiny")
    assert json.loads((TINY / "config.json").read_text(encoding="utf-8")) == spec.config
    assert json.loads((TINY / "speech_tokenizer" / "config.json").read_text(encoding="utf-8")) == spec.speech_tokenizer_config
