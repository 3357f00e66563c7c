"""Qwen2.5-VL and Qwen2.5-Omni thinkers against transformers 5.24 (fp32, tiny odd shapes), whole models with their
real vision and audio towers: logits within 1e-3 and 40 greedy tokens equal, for text-only prompts and for prompts
with an image, several images and a silent video (both families), audio, image+audio+text, and (Omni) a video with
its audio interleaved.

The media are files made here (PNG images, a WAV clip, an MP4 with an AAC track) turned into features by
edge_infer.media, and the same features go to both models; for images transformers' own processor
(Qwen2VLImageProcessorPil) is checked to give those features too. So this covers everything from the features
on: both towers, the placement of their embeddings, M-RoPE/TMRoPE positions, prefill chunks across media, and
decoding after them. The plumbing alone (encode once, caching, batching, refusals) is tests/engine/test_multimodal.py's,
on stand-in towers.
"""
from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
import torch

from media_files import audio_file, frames_of, sine, video_file
from mm_prompts import IMAGE, VIDEO, Prompt
from testutil import load_thinker
from edge_infer.config import EngineConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest, MediaInput
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.media.audio import audio_features, decode_audio
from edge_infer.media.config import AudioProcessing, MediaProcessing, VisionProcessing
from edge_infer.media.features import AudioFeatures, VisionFeatures
from edge_infer.media.image import decode_image, image_features
from edge_infer.media.limits import MediaLimits
from edge_infer.media.video import video_features

NEW_TOKENS = 40
# A random model may pick a media placeholder or marker; neither side may (a sequence with a stray placeholder is
# no valid prompt to score).
SPECIALS = list(range(289, 296))
# Small grids keep prompts short: images of 4 to 12 merged patches, video frames of 4 to 6, 2 frames per second;
# the tiny audio towers take 16 mel bins.
VISION = VisionProcessing(min_pixels=4 * 28 * 28, max_pixels=12 * 28 * 28, video_min_pixels=4 * 28 * 28,
                          video_max_pixels=6 * 28 * 28)
MEDIA = {"qwen2_5_vl": MediaProcessing(vision=VISION),
         "qwen2_5_omni": MediaProcessing(vision=VISION, audio=AudioProcessing(feature_size=16))}
LIMITS = MediaLimits()


def png(width: int, height: int, seed: int) -> bytes:
    """A picture of shapes on a gradient, as PNG bytes."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // width), (y * 255 // height), np.full_like(x, int(rng.integers(256)))], -1)
    image = Image.fromarray(base.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x0, y0 = int(rng.integers(width // 2)), int(rng.integers(height // 2))
        draw.ellipse((x0, y0, x0 + width // 3, y0 + height // 3), fill=tuple(int(c) for c in rng.integers(256, size=3)))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def image(width: int, height: int, seed: int) -> VisionFeatures:
    """Our features of a PNG, checked against transformers' processor on the same decoded image."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    picture = decode_image(png(width, height, seed), LIMITS)
    ours = image_features(picture, VISION)
    reference = Qwen2VLImageProcessorPil(min_pixels=VISION.min_pixels, max_pixels=VISION.max_pixels)(
        images=picture, return_tensors="np")
    np.testing.assert_array_equal(ours.pixel_values, reference["pixel_values"])
    assert ours.grid_thw == tuple(int(v) for v in reference["image_grid_thw"][0])
    return ours


def clip(seconds: float, hz: float) -> AudioFeatures:
    """A WAV tone at 44.1 kHz, decoded, resampled and featurized by edge_infer.media."""
    data = audio_file(sine(seconds, 44100, hz=hz) + sine(seconds, 44100, hz=hz * 2.7, amplitude=0.1), 44100, "WAV")
    return audio_features(decode_audio(data, LIMITS), MEDIA["qwen2_5_omni"].audio)


def video(family: str, seconds: int, with_audio: bool = False) -> tuple[VisionFeatures, AudioFeatures | None]:
    """An MP4 of changing frames (and a tone track), sampled at 2 frames per second."""
    track = sine(seconds, 48000, hz=600)[:, 0] if with_audio else None
    data = video_file(frames_of(8 * seconds, height=56, width=84), fps=8, audio=track)
    vision, audio = video_features(data, MEDIA[family], LIMITS)
    assert (audio is not None) == with_audio
    return vision, audio


def media_inputs(prompt: Prompt, features: list) -> list[MediaInput]:
    """The prompt's media items (in order) with their features."""
    def digest(f) -> bytes:
        return hashlib.sha256((f.mel if isinstance(f, AudioFeatures) else f.pixel_values).tobytes()).digest()

    return [MediaInput(item.kind, f, item.positions, digest(f)) for item, f in zip(prompt.items, features)]


def prompts(family: str, mm) -> dict[str, tuple[list[int], list[MediaInput], bool]]:
    """(prompt ids, media, audio in video) by name. The video is short enough that VL's text after it is where
    transformers 5.24 puts it (models/mrope.py)."""
    out: dict[str, tuple[Prompt, list, bool]] = {"text": (Prompt(mm).text([5, 17, 99, 3, 250, 41, 7, 11, 12]), [], False)}
    a, b, c = image(90, 60, 1), image(40, 130, 2), image(70, 70, 3)
    out["image"] = (Prompt(mm).text([5, 17, 99]).image(a.grid_thw).text([41, 7, 11]), [a], False)
    out["images"] = (Prompt(mm).text([8]).image(b.grid_thw).text([30, 31]).image(c.grid_thw).text([9, 10, 11]),
                     [b, c], False)
    v, _ = video(family, 2)
    out["video"] = (Prompt(mm).text([12, 13]).video(v.grid_thw, v.second_per_grid).text([14, 15, 16]), [v], False)
    if family == "qwen2_5_omni":
        sound, picture = clip(1.5, 440.0), image(100, 75, 4)
        out["audio"] = (Prompt(mm).text([20, 21]).audio(sound.frames).text([22, 23]), [sound], False)
        out["image+audio+text"] = (Prompt(mm).text([24]).image(picture.grid_thw).text([25, 26]).audio(sound.frames)
                                   .text([27, 28]), [picture, sound], False)
        v, track = video(family, 4, with_audio=True)
        p = Prompt(mm).text([3, 4]).video_with_audio(v.grid_thw, v.second_per_grid, track.frames).text([5, 6])
        out["video+audio"] = (p, [v, track], True)
    return {name: (p.ids, media_inputs(p, features), in_video) for name, (p, features, in_video) in out.items()}


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
    if audios:  # the processor's batch: clips padded to the longest, with the mask of their frames
        frames = max(f.frames for f in audios)
        mel = np.zeros((len(audios), audios[0].mel.shape[0], frames), dtype=np.float32)
        mask = np.zeros((len(audios), frames), dtype=np.int64)
        for i, f in enumerate(audios):
            mel[i, :, : f.frames], mask[i, : f.frames] = f.mel, 1
        kw.update(input_features=torch.from_numpy(mel), feature_attention_mask=torch.from_numpy(mask))
    if family == "qwen2_5_vl":
        types = torch.zeros_like(t)
        types[t == IMAGE], types[t == VIDEO] = 1, 2
        kw["mm_token_type_ids"] = types
    elif audio_in_video:
        kw["use_audio_in_video"] = True
    return kw


def hf_greedy(hf, prompt: list[int], media: list[MediaInput], family: str,
              audio_in_video: bool = False) -> tuple[list[int], torch.Tensor]:
    with torch.no_grad():
        out = hf.generate(**hf_inputs(prompt, media, family, audio_in_video), max_new_tokens=NEW_TOKENS,
                          do_sample=False, eos_token_id=None, pad_token_id=0, suppress_tokens=SPECIALS)
        tokens = out[0, len(prompt):].tolist()
        logits = hf(**hf_inputs(out[0].tolist(), media, family, audio_in_video)).logits[0].float()
    return tokens, logits


def run(core: EngineCore, prompt: list[int], media: list[MediaInput]) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logit_bias={t: -100 for t in SPECIALS})
    assert core.add_request(EngineRequest("r", prompt, params, media=media)) is None
    out = []
    while core.has_work():
        for d in core.step():
            assert d.error is None, d.error
            if d.token_id is not None:
                out.append(d.token_id)
    return out


# Each kind of prompt once per family: an image, several images and a silent video for both; the Omni thinker's
# audio and image+audio too; the whole Omni checkpoint (towers under thinker.) runs the video with its audio and text.
CASES = [("qwen2_5_vl", "text"), ("qwen2_5_vl", "image"), ("qwen2_5_vl", "images"), ("qwen2_5_vl", "video"),
         ("qwen2_5_omni_thinker", "image"), ("qwen2_5_omni_thinker", "images"), ("qwen2_5_omni_thinker", "video"),
         ("qwen2_5_omni_thinker", "audio"), ("qwen2_5_omni_thinker", "image+audio+text"),
         ("qwen2_5_omni", "text"), ("qwen2_5_omni", "video+audio")]


@pytest.fixture(scope="module")
def engines(thinker_checkpoints):
    """One engine (real towers, as load_model builds them) and its transformers reference per checkpoint."""
    return {kind: (make_core(path), load_thinker(path)) for kind, path in thinker_checkpoints.items()}


@pytest.fixture(scope="module")
def cases(engines):
    """The prompts of each family, built once (media features are shared by its cases)."""
    out = {}
    for kind, (core, _) in engines.items():
        mm = core.model.cfg.multimodal
        out.setdefault(mm.family, prompts(mm.family, mm))
    return out


@pytest.mark.parametrize("kind, name", CASES)
def test_greedy_tokens_and_logits_match_transformers(engines, cases, kind, name):
    core, hf = engines[kind]
    family = core.model.cfg.multimodal.family
    prompt, media, audio_in_video = cases[family][name]
    ref_tokens, ref_logits = hf_greedy(hf, prompt, media, family, audio_in_video)
    assert len(set(ref_tokens)) > 3, "degenerate reference; widen the init"
    encoded = core.stats.media_encoded
    assert run(core, prompt, media) == ref_tokens
    assert core.stats.media_encoded - encoded == len(media)
    logits = core.score(prompt + ref_tokens, media)
    assert (logits - ref_logits).abs().max().item() < 1e-3


def test_the_media_decide_the_answer(engines, cases):
    """Another image behind the same placeholder tokens moves the logits: the towers' rows are not noise."""
    core, _ = engines["qwen2_5_vl"]
    prompt, (picture,), _ = cases["qwen2_5_vl"]["image"]
    other = image(90, 60, 9)
    assert other.grid_thw == picture.features.grid_thw
    swapped = MediaInput("image", other, picture.positions, b"other")
    moved = (core.score(prompt, [picture]) - core.score(prompt, [swapped]))[-1].abs().max().item()
    assert moved > 0.1


def test_a_full_omni_checkpoint_loads_its_thinker_and_towers_only(engines, thinker_checkpoints):
    """The talker's and token2wav's tensors are in the file, neither loaded nor counted; the towers are both."""
    from edge_infer.memory.plan import plan_text_session

    core, _ = engines["qwen2_5_omni"]
    thinker_core, _ = engines["qwen2_5_omni_thinker"]
    info = core.ready_info
    assert info.weight_bytes == thinker_core.ready_info.weight_bytes
    assert set(info.encoder_weight_bytes) == {"vision", "audio"} and info.linear_kernels["encoder linears"] == "dense"
    towers = core.model.towers()
    assert info.encoder_weight_bytes == {k: sum(4 * s.numel for s in t.weight_specs()) for k, t in towers.items()}
    cfg = core.model.cfg  # a decode step reads neither tower, and one row of the (untied) embedding table
    untied_table = (cfg.vocab_size - 1) * cfg.hidden_size * 4
    assert info.decode_read_bytes == info.weight_bytes - sum(info.encoder_weight_bytes.values()) - untied_table
    plan = plan_text_session(thinker_checkpoints["qwen2_5_omni"], dtype="float32", max_model_len=512,
                             kv_cache_memory_bytes=4 << 20, available_bytes=8 << 30)
    assert plan.admitted and plan.weight_bytes == info.weight_bytes
    assert {k: plan.item(f"{k} encoder weights") for k in towers} == info.encoder_weight_bytes
    assert plan.item("rope tables") == info.rope_bytes == 0
