"""Qwen2.5-VL and Qwen2.5-Omni thinkers against transformers 5.24 (fp32, tiny odd shapes): logits within 1e-3
and 40 greedy tokens equal, for text-only prompts and for prompts with images, videos (with their audio
interleaved, for Omni), audio clips and several of them.

The media embeddings come from the same stand-in towers on both sides (mm_fakes: transformers' feature calls
are patched, edge-infer's encoder seam is given them), so these test everything from the features on: the
placement of embeddings, M-RoPE/TMRoPE positions, prefill chunks across media, decoding after them.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mm_fakes import FakeTowers, media_inputs
from mm_prompts import IMAGE, VIDEO, Prompt, mm_config
from testutil import load_thinker
from edge_infer.config import EngineConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest, MediaInput
from edge_infer.engine.sampling_params import SamplingParams

NEW_TOKENS = 40
# A random model may pick a media placeholder or marker; neither side may (a sequence with a stray placeholder is
# no valid prompt to score).
SPECIALS = list(range(289, 296))
KINDS = ("qwen2_5_vl", "qwen2_5_omni_thinker", "qwen2_5_omni")


def make_core(path, **kw) -> EngineCore:
    settings = dict(model=str(path), dtype="float32", max_model_len=512, max_num_seqs=4,
                    max_num_batched_tokens=24, kv_cache_memory_bytes=4 << 20)
    return EngineCore(EngineConfig(**{**settings, **kw}))


def hf_inputs(ids: list[int], media: list[MediaInput], family: str, audio_in_video: bool) -> dict:
    """transformers' keyword arguments for a prompt (or a whole sequence) with ``media``."""
    t = torch.tensor([ids])
    kw = dict(input_ids=t, attention_mask=torch.ones_like(t))
    images = [m.features for m in media if m.kind == "image"]
    videos = [m.features for m in media if m.kind == "video"]
    audios = [m.features for m in media if m.kind == "audio"]
    if images:
        kw.update(pixel_values=torch.from_numpy(np.concatenate([f.pixel_values for f in images])),
                  image_grid_thw=torch.tensor([f.grid_thw for f in images]))
    if videos:
        kw.update(pixel_values_videos=torch.from_numpy(np.concatenate([f.pixel_values for f in videos])),
                  video_grid_thw=torch.tensor([f.grid_thw for f in videos]))
        seconds = torch.tensor([f.second_per_grid for f in videos], dtype=torch.float32)
        kw["second_per_grid_ts" if family == "qwen2_5_vl" else "video_second_per_grid"] = seconds
    if audios:
        frames = max(f.mel.shape[1] for f in audios)
        mel = np.zeros((len(audios), audios[0].mel.shape[0], frames), dtype=np.float32)
        mask = np.zeros((len(audios), frames), dtype=np.int64)
        for i, f in enumerate(audios):
            mel[i, :, : f.mel.shape[1]], mask[i, : f.mel.shape[1]] = f.mel, 1
        kw.update(input_features=torch.from_numpy(mel), feature_attention_mask=torch.from_numpy(mask))
    if family == "qwen2_5_vl":
        types = torch.zeros_like(t)
        types[t == IMAGE], types[t == VIDEO] = 1, 2
        kw["mm_token_type_ids"] = types
    elif audio_in_video:
        kw["use_audio_in_video"] = True
    return kw


def hf_greedy(hf, towers: FakeTowers, prompt: list[int], media: list[MediaInput], family: str,
              audio_in_video: bool = False) -> tuple[list[int], torch.Tensor]:
    towers.patch_transformers(hf)
    with torch.no_grad():
        out = hf.generate(**hf_inputs(prompt, media, family, audio_in_video), max_new_tokens=NEW_TOKENS,
                          do_sample=False, eos_token_id=None, pad_token_id=0, suppress_tokens=SPECIALS)
        tokens = out[0, len(prompt):].tolist()
        logits = hf(**hf_inputs(out[0].tolist(), media, family, audio_in_video)).logits[0].float()
    return tokens, logits


def run(core: EngineCore, requests: dict[str, tuple[list[int], list[MediaInput]]], n: int = NEW_TOKENS) -> dict[str, list[int]]:
    for rid, (prompt, media) in requests.items():
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logit_bias={t: -100 for t in SPECIALS})
        assert core.add_request(EngineRequest(rid, prompt, params, media=media)) is None
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    while core.has_work():
        for d in core.step():
            assert d.error is None, d.error
            if d.token_id is not None:
                out[d.request_id].append(d.token_id)
    return out


def prompts(family: str) -> dict[str, tuple[Prompt, bool]]:
    """(prompt, audio in video) by name; videos are short enough that VL's text after them is where transformers
    5.24 puts it (models/mrope.py)."""
    mm = mm_config(family)
    out = {
        "text": Prompt(mm).text([5, 17, 99, 3, 250, 41, 7, 11, 12]),
        "image": Prompt(mm).text([5, 17, 99]).image((1, 6, 10)).text([41, 7, 11]),
        "images": Prompt(mm).text([8]).image((1, 4, 4)).text([30, 31]).image((1, 8, 6)).text([9, 10, 11]),
        "video": Prompt(mm).text([12, 13]).video((4, 6, 8), 0.5).text([14, 15, 16]),
    }
    if family == "qwen2_5_omni":
        out["audio"] = Prompt(mm).text([20, 21]).audio(150).text([22, 23])
        out["image+audio+text"] = Prompt(mm).text([24]).image((1, 4, 6)).text([25, 26]).audio(97).text([27, 28])
    out = {name: (p, False) for name, p in out.items()}
    if family == "qwen2_5_omni":
        out["video+audio"] = (Prompt(mm).text([3, 4]).video_with_audio((6, 4, 4), 1.0, 640).text([5, 6]), True)
    return out


# The full Omni checkpoint holds the Omni thinker's weights (testutil): two of its prompts show it runs as one.
CASES = ([("qwen2_5_vl", name) for name in prompts("qwen2_5_vl")]
         + [("qwen2_5_omni_thinker", name) for name in prompts("qwen2_5_omni")]
         + [("qwen2_5_omni", "text"), ("qwen2_5_omni", "video+audio")])


@pytest.fixture(scope="module")
def engines(thinker_checkpoints):
    """One engine and its transformers reference per checkpoint, both on the same stand-in towers."""
    out = {}
    for kind, path in thinker_checkpoints.items():
        core = make_core(path)
        towers = FakeTowers(core.model.cfg.hidden_size)
        core.model.encoders = towers.encoders()
        out[kind] = (core, load_thinker(path), towers)
    return out


@pytest.mark.parametrize("kind, name", CASES)
def test_greedy_tokens_and_logits_match_transformers(engines, kind, name):
    core, hf, towers = engines[kind]
    family = core.model.cfg.multimodal.family
    prompt, audio_in_video = prompts(family)[name]
    media = media_inputs(prompt)
    ref_tokens, ref_logits = hf_greedy(hf, towers, prompt.ids, media, family, audio_in_video)
    assert len(set(ref_tokens)) > 3, "degenerate reference; widen the init"
    assert towers.hf_calls >= len({m.kind for m in media})  # transformers took each kind of media
    encoded = core.stats.media_encoded
    assert run(core, {"r": (prompt.ids, media)})["r"] == ref_tokens
    assert core.stats.media_encoded - encoded == len(media)
    logits = core.score(prompt.ids + ref_tokens, media)
    assert (logits - ref_logits).abs().max().item() < 1e-3


def test_a_full_omni_checkpoint_loads_its_thinker_only(engines, thinker_checkpoints):
    """The talker's and token2wav's tensors are in the file, neither loaded nor counted."""
    from edge_infer.memory.plan import plan_text_session

    core, _, _ = engines["qwen2_5_omni"]
    thinker_core, _, _ = engines["qwen2_5_omni_thinker"]
    assert core.ready_info.weight_bytes == thinker_core.ready_info.weight_bytes
    plan = plan_text_session(thinker_checkpoints["qwen2_5_omni"], dtype="float32", max_model_len=512,
                             kv_cache_memory_bytes=4 << 20, available_bytes=8 << 30)
    assert plan.admitted and plan.item("weights") == core.ready_info.weight_bytes
    assert plan.item("rope tables") == core.ready_info.rope_bytes == 0
