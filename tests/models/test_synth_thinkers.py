"""`edge-infer synth --family qwen2_5_vl | qwen2_5_omni`: checkpoints transformers 5.24 reads as its own saves, the
3B presets shaped as the released configs, and an image+text chat prompt that runs through `LLM` end to end (in
this process and in the engine's worker process)."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from edge_infer.cli import main
from edge_infer.config import EngineConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import MediaInput
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.media.config import MediaProcessing
from edge_infer.media.image import decode_image, image_features
from edge_infer.media.limits import MediaLimits
from edge_infer.models.config import ModelConfig
from edge_infer.models.synth_thinker import CHATML, MARKERS, PRESETS, thinker_config
from edge_infer.models.tokenizer import Tokenizer
from media_files import png

FAMILIES = ("qwen2_5_vl", "qwen2_5_omni")
QUESTION = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
                                         {"type": "text", "text": "What is in this picture?"}]}]


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("synth")
    for family in FAMILIES:
        assert main(["synth", str(root / family), "--family", family, "--preset", "tiny", "--dtype", "float32",
                     "--shard-bytes", str(1 << 20)]) == 0
    return {family: root / family for family in FAMILIES}


def saved_layout(path) -> dict:
    """A config.json without its `transformers_version` stamp: the layout a transformers release writes, not which
    release wrote it (5.25 writes the same keys as 5.24 and stamps its own version)."""
    config = json.loads(path.read_text())
    config.pop("transformers_version", None)
    return config


def chat_prompt(path, tokenizer: Tokenizer) -> tuple[str, list[int], list[MediaInput]]:
    """QUESTION through the checkpoint's chat template, its one image placeholder repeated per image row."""
    text, ids = tokenizer.encode_chat(QUESTION)
    features = image_features(decode_image(png(0, 90, 60), MediaLimits()), MediaProcessing.from_dir(path).vision)
    pad = ModelConfig.from_dir(path).multimodal.image_token_id
    at = ids.index(pad)
    ids = ids[:at] + [pad] * features.num_tokens + ids[at + 1:]
    positions = np.arange(at, at + features.num_tokens)
    return text, ids, [MediaInput("image", features, positions, hashlib.sha256(features.pixel_values).digest())]


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_reads_the_checkpoint_as_its_own_save(synth, family, tmp_path):
    import transformers
    from transformers import AutoConfig, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = synth[family]
    AutoConfig.from_pretrained(path).save_pretrained(tmp_path)
    assert saved_layout(tmp_path / "config.json") == saved_layout(path / "config.json")
    assert (path / "model.safetensors.index.json").is_file()  # sharded like the other presets
    raw = json.loads((path / "config.json").read_text())
    hf, info = getattr(transformers, raw["architectures"][0]).from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info
    # the processor files load in transformers' processors and in edge-infer's
    media = MediaProcessing.from_dir(path)
    assert Qwen2VLImageProcessorPil.from_pretrained(path).size["longest_edge"] == media.vision.max_pixels == 12845056
    if family == "qwen2_5_omni":
        assert WhisperFeatureExtractor.from_pretrained(path).n_samples == media.audio.n_samples == 4_800_000
    else:
        assert media.audio is None
    # and both read the same model: an image prompt's logits agree
    tokenizer = Tokenizer(path)
    _, ids, media_inputs = chat_prompt(path, tokenizer)
    core = EngineCore(EngineConfig(model=str(path), dtype="float32", max_model_len=256, max_num_seqs=1,
                                   max_num_batched_tokens=64, kv_cache_memory_bytes=1 << 20))
    features = media_inputs[0].features
    kw = dict(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
              pixel_values=torch.from_numpy(features.pixel_values), image_grid_thw=torch.tensor([features.grid_thw]))
    if family == "qwen2_5_vl":
        kw["mm_token_type_ids"] = (kw["input_ids"] == core.model.cfg.multimodal.image_token_id).long()
    with torch.no_grad():
        ref = hf.eval()(**kw).logits[0].float()
    assert (core.score(ids, media_inputs) - ref).abs().max().item() < 1e-3


@pytest.mark.parametrize("family, preset", [("qwen2_5_vl", "qwen2.5-vl-3b"), ("qwen2_5_omni", "qwen2.5-omni-3b")])
def test_the_3b_presets_have_the_released_shapes(family, preset, tmp_path):
    """The released configs (hub layout: Qwen2.5-VL-3B-Instruct flat, Qwen2.5-Omni-3B as Qwen2_5OmniModel with its
    thinker nested) parse to the same model as the preset's, token ids aside; transformers reads the preset's as its
    own save."""
    from transformers import AutoConfig

    ids = {token: 151643 + i for i, token in enumerate(CHATML + tuple(t for m in MARKERS[family].values() for t in m))}
    ours = thinker_config(family, PRESETS[family][preset], 151936, ids, "bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(ours))
    AutoConfig.from_pretrained(tmp_path).save_pretrained(tmp_path / "again")
    assert saved_layout(tmp_path / "again" / "config.json") == saved_layout(tmp_path / "config.json")
    text = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                num_attention_heads=16, num_key_value_heads=2, rms_norm_eps=1e-06, rope_theta=1000000.0,
                hidden_act="silu", use_sliding_window=False, sliding_window=32768)
    vision = dict(depth=32, hidden_act="silu", hidden_size=1280, intermediate_size=3420, num_heads=16, in_chans=3,
                  out_hidden_size=2048, patch_size=14, spatial_merge_size=2, spatial_patch_size=14, window_size=112,
                  fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, temporal_patch_size=2)
    if family == "qwen2_5_vl":
        released = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", **text,
                    "max_position_embeddings": 128000, "tie_word_embeddings": True, "vision_config": vision,
                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    else:
        audio = dict(d_model=1280, encoder_attention_heads=20, encoder_ffn_dim=5120, encoder_layers=32,
                     num_mel_bins=128, output_dim=2048, n_window=100, max_source_positions=1500)
        thinker = {"text_config": {**text, "max_position_embeddings": 32768,
                                   "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default",
                                                    "type": "default"}},
                   "vision_config": vision, "audio_config": audio, "position_id_per_seconds": 25,
                   "seconds_per_chunk": 2}
        released = {"architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni", "thinker_config": thinker}
    mine, theirs = ModelConfig.from_dict(ours), ModelConfig.from_dict(released)
    same_ids = {k: getattr(mine.multimodal, k) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                                         "vision_end_token_id", "audio_token_id",
                                                         "audio_start_token_id", "audio_end_token_id")}
    import dataclasses

    theirs = dataclasses.replace(theirs, architecture=mine.architecture, torch_dtype=mine.torch_dtype,
                                 multimodal=dataclasses.replace(theirs.multimodal, **same_ids))
    assert mine == theirs


@pytest.mark.parametrize("worker", ["thread", pytest.param("process", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", FAMILIES)
def test_an_image_chat_prompt_runs_through_llm(synth, family, worker):
    """The checkpoint's chat template puts the image's markers and placeholder where the content list has it; the
    image's features cross to the engine (a pickled request to the worker process) and its towers, built there,
    see it: greedy tokens equal the engine core's own, and another image changes them."""
    from edge_infer import LLM

    path = synth[family]
    with LLM(str(path), dtype="float32", max_model_len=256, max_num_batched_tokens=32, kv_cache_memory_bytes=1 << 20,
             worker=worker) as llm:
        text, ids, media = chat_prompt(path, llm.get_tokenizer())
        start, pad, end = MARKERS[family]["image"]
        assert f"<|im_start|>user\n{start}{pad}{end}What is in this picture?<|im_end|>\n<|im_start|>assistant\n" in text
        assert llm.ready.encoder_weight_bytes["vision"] > 0 and llm.ready.linear_kernels["encoder linears"] == "dense"
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        got = llm.generate({"prompt_token_ids": ids, "media": media}, params)[0].outputs[0].token_ids
        other = image_features(decode_image(png(1, 90, 60), MediaLimits()), MediaProcessing.from_dir(path).vision)
        other = MediaInput("image", other, media[0].positions, b"other")
        changed = llm.generate({"prompt_token_ids": ids, "media": [other]}, params)[0].outputs[0].token_ids
    core = EngineCore(llm.frontend.engine_config)
    logits = core.score(ids + list(got[:-1]), media)
    assert logits[len(ids) - 1:].argmax(-1).tolist() == list(got)
    assert list(changed) != list(got)
