"""Chat messages with media parts into prompts (engine/media_prompt.py through Frontend.prepare_chat): parts read as
OpenAI and vLLM send them, rendered by the templates as their markers, placeholders expanded per embedding row (an
Omni video interleaved with its sound as transformers' Qwen2_5OmniProcessor lays it out), digests that let the
prefix cache share equal media, and refusals that name the part and the limit."""
from __future__ import annotations

import base64
import dataclasses
import types

import numpy as np
import pytest

from media_files import audio_file, data_url, frames_of, png, sine, video_file
from mm_prompts import mm_config
from edge_infer.engine import media_prompt
from edge_infer.engine.frontend import Frontend
from edge_infer.engine.media_prompt import LoadedPart, MediaPart, expand, split_messages, use_audio_in_video
from edge_infer.engine.protocol import media_problem
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.errors import InvalidRequestError, MediaError
from edge_infer.media.features import AudioFeatures, VisionFeatures
from edge_infer.models.checkpoint import vision_demo_model_dir
from edge_infer.models.encoder_config import audio_output_length
from edge_infer.models.tokenizer import Tokenizer

IMAGE = {"type": "image_url", "image_url": {"url": data_url(png(), "image/png")}}
WAV = base64.b64encode(audio_file(sine(1.0, 16000), 16000, "WAV")).decode()
AUDIO = {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}
# 8 frames at 4 fps (2 s) with 2 s of sound: two chunks of video and audio at Omni's 2-second chunks
VIDEO = {"type": "video_url", "video_url": {"url": data_url(video_file(frames_of(8), 4, audio=sine(2.0, 48000)[:, 0]),
                                                            "video/mp4")}}
MARKS = {"image": ("<|vision_bos|>", "<|IMAGE|>", "<|vision_eos|>"), "audio": ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"),
         "video": ("<|vision_bos|>", "<|VIDEO|>", "<|vision_eos|>")}


def user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


# Limits that hold the media below and fit a 2048-token context (unset, the plan would turn videos off there).
LIMITS = {"max_images": 1, "max_image_pixels": 448 * 448, "max_video_frames": 8, "max_audio_seconds": 3}


@pytest.fixture(scope="module")
def omni(synth_thinkers) -> Frontend:
    return Frontend.create(synth_thinkers["qwen2_5_omni"], dtype="float32", max_model_len=2048, media_limits=LIMITS)


@pytest.fixture(scope="module")
def vl(synth_thinkers) -> Frontend:
    return Frontend.create(synth_thinkers["qwen2_5_vl"], dtype="float32", max_model_len=2048, media_limits=LIMITS)


# -- reading the parts ----------------------------------------------------------------------------------------


def test_parts_become_template_types_and_media_to_load():
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "Look:"}, IMAGE, AUDIO,
            {"type": "audio_url", "audio_url": {"url": "file:///srv/a.flac"}},
            {"type": "video_url", "video_url": "https://example.com/v.mp4"}]},  # vLLM takes a bare URL too
        {"role": "assistant", "content": "Seen."},
    ]
    chat = split_messages(messages)
    assert chat.messages[0]["content"] == "Be brief."  # text-only lists join into the string text templates render
    assert chat.messages[1] == {"role": "user", "name": "ann", "content": [
        {"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "audio"}, {"type": "audio"}, {"type": "video"}]}
    assert chat.messages[2] == messages[2]
    assert [(p.kind, p.where) for p in chat.parts] == [
        ("image", "messages[1].content[1] (image_url)"), ("audio", "messages[1].content[2] (input_audio)"),
        ("audio", "messages[1].content[3] (audio_url)"), ("video", "messages[1].content[4] (video_url)")]
    assert chat.parts[1].data == WAV and chat.parts[3].url == "https://example.com/v.mp4"
    assert messages[1]["content"][1] is IMAGE  # the caller's messages are not changed


@pytest.mark.parametrize("part, error", [
    ({"type": "image", "image": "x"}, r"messages\[0\]\.content\[0\]: content part type 'image' is not one edge-infer reads"),
    ({"type": "text"}, r"content\[0\] \(text\): 'text' must be a string"),
    ({"type": "image_url", "image_url": {}}, r"content\[0\] \(image_url\): needs \"image_url\": \{\"url\""),
    ({"type": "input_audio", "input_audio": {"data": WAV}}, r"format None is not one edge-infer decodes; send wav, mp3"),
    ({"type": "input_audio", "input_audio": {"data": WAV, "format": "aac"}}, r"format 'aac' is not one"),
    ({"type": "input_audio", "input_audio": "abc"}, r"needs \"input_audio\": \{\"data\""),
    ("text", r"content\[0\]: a content part must be an object with a type, not str"),
])
def test_unreadable_parts_are_refused_naming_them(part, error):
    with pytest.raises(InvalidRequestError, match=error):
        split_messages(user(part))


def test_mm_processor_kwargs_take_use_audio_in_video_only():
    assert use_audio_in_video(None) is True
    assert use_audio_in_video({"use_audio_in_video": False}) is False
    with pytest.raises(InvalidRequestError, match="'fps' is not an option of edge-infer's preprocessing"):
        use_audio_in_video({"fps": 1})
    with pytest.raises(InvalidRequestError, match="must be true or false"):
        use_audio_in_video({"use_audio_in_video": "no"})


# Templates in the style of the released Qwen2.5-VL / Omni ones, which recognise a media part by its type alone.
QWEN_STYLE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
              "{% else %}{% for c in m.content %}{% if c.type == 'image' %}<|vision_bos|><|IMAGE|><|vision_eos|>"
              "{% elif c.type == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>{% elif c.type == 'video' %}"
              "<|vision_bos|><|VIDEO|><|vision_eos|>{% elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}"
              "{% endif %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


@pytest.mark.parametrize("template", ["synth", "qwen style"])
def test_templates_render_each_part_as_its_markers_in_place(synth_thinkers, template):
    tokenizer = Tokenizer(synth_thinkers["qwen2_5_omni"])
    if template != "synth":
        tokenizer.chat_template = QWEN_STYLE
    chat = split_messages(user({"type": "text", "text": "A"}, IMAGE, {"type": "text", "text": "B"}, AUDIO, VIDEO))
    text = tokenizer.apply_chat_template(chat.messages)
    assert "<|im_start|>user\nA" + "".join(MARKS["image"]) + "B" + "".join(MARKS["audio"]) + "".join(MARKS["video"]) \
        + "<|im_end|>" in text


# -- expanding placeholders -----------------------------------------------------------------------------------


def vision(grid, second_per_grid=None) -> VisionFeatures:
    return VisionFeatures(np.zeros((int(np.prod(grid)), 8), np.float32), grid, 2, second_per_grid)


def audio(frames: int) -> AudioFeatures:
    return AudioFeatures(np.zeros((4, frames), np.float32))


def test_each_placeholder_becomes_one_token_per_embedding_row_in_part_order():
    mm = mm_config("qwen2_5_omni")
    s, e, abos, aeos = mm.vision_start_token_id, mm.vision_end_token_id, mm.audio_start_token_id, mm.audio_end_token_id
    img, aud = mm.image_token_id, mm.audio_token_id
    ids = [1, s, img, e, 2, abos, aud, aeos, s, img, e, 3]
    first, second, clip = vision((1, 4, 6)), vision((1, 2, 2)), audio(300)
    loaded = [LoadedPart(MediaPart("image", "a"), first), LoadedPart(MediaPart("audio", "b"), clip),
              LoadedPart(MediaPart("image", "c"), second)]
    out, media = expand(ids, loaded, mm)
    n = clip.num_tokens
    assert out == [1, s] + [img] * 6 + [e, 2, abos] + [aud] * n + [aeos, s, img, e, 3]
    assert [(m.kind, m.positions.tolist()) for m in media] == [
        ("image", list(range(2, 8))), ("audio", list(range(11, 11 + n))), ("image", [13 + n])]
    assert media_problem(out, media, mm, "thinker") is None


def qwen_processor_layout(grid, second_per_grid: float, audio_tokens: int, pps: float = 25, seconds: float = 2,
                          merge: int = 2) -> str:
    """What Qwen2_5OmniProcessor writes in place of <|VIDEO|> for a video with its audio, built here on its own:
    each video token's time is its frame x seconds per frame x positions per second, audio token k's is k; both are
    cut where their time reaches the next multiple of the positions per chunk; the chunks alternate, video first."""
    t, h, w = grid
    times = [frame * second_per_grid * pps for frame in range(t) for _ in range((h // merge) * (w // merge))]
    per_chunk = int(pps * seconds)

    def chunk_sizes(values):
        sizes, start, chunk = [], 0, 1
        for i, v in enumerate(values):
            if v >= chunk * per_chunk:
                sizes.append(i - start)
                start, chunk = i, chunk + 1
        return sizes + [len(values) - start]

    video, sound = chunk_sizes(times), chunk_sizes(range(audio_tokens))
    out = "<|audio_bos|>"
    for j in range(max(len(video), len(sound))):
        out += "<|VIDEO|>" * (video[j] if j < len(video) else 0) + "<|AUDIO|>" * (sound[j] if j < len(sound) else 0)
    return out + "<|audio_eos|>"


def transformers_layout(grid, second_per_grid: float, audio_tokens: int) -> str:
    """The same from transformers' own Qwen2_5OmniProcessor.replace_video_with_audio_token (its tokens' strings)."""
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor as P

    stub = types.SimpleNamespace(audio_bos_token="<|audio_bos|>", audio_eos_token="<|audio_eos|>",
                                 video_token="<|VIDEO|>", audio_token="<|AUDIO|>",
                                 video_processor=types.SimpleNamespace(merge_size=2))
    stub.get_chunked_index = lambda indices, per_chunk: P.get_chunked_index(stub, indices, per_chunk)
    videos = {"video_grid_thw": [np.array(grid)], "video_second_per_grid": [second_per_grid]}
    return P.replace_video_with_audio_token(stub, videos, 0, {"num_audio_tokens": [audio_tokens]}, 0,
                                            position_id_per_seconds=25, seconds_per_chunk=2)


@pytest.mark.parametrize("grid, second_per_grid, frames", [
    ((2, 4, 4), 1.0, 400),  # two chunks of each
    ((4, 2, 6), 0.5, 120),  # more video chunks than audio
    ((1, 4, 4), 1.0, 2900),  # one video chunk, many audio
    ((6, 4, 2), 1 / 3, 3),  # a clip of one token
    ((8, 2, 2), 2.7, 1500),  # frames skip whole chunks
])
def test_a_video_with_its_sound_is_interleaved_as_qwen_s_processor_does(omni, grid, second_per_grid, frames):
    mm = omni.plan.model_config.multimodal
    tokenizer = omni.tokenizer
    ids = tokenizer.encode("<|vision_bos|><|VIDEO|><|vision_eos|>", add_special_tokens=False)
    video, track = vision(grid, second_per_grid), audio(frames)
    out, media = expand(ids, [LoadedPart(MediaPart("video", "v"), video, track)], mm)
    expected = qwen_processor_layout(grid, second_per_grid, audio_output_length(frames))
    assert expected == transformers_layout(grid, second_per_grid, audio_output_length(frames))
    assert tokenizer.decode(out, skip_special_tokens=False) == "<|vision_bos|>" + expected + "<|vision_eos|>"
    assert [m.kind for m in media] == ["video", "audio"]
    assert media_problem(out, media, mm, "thinker") is None  # and the engine reads the same layout


# -- whole preparations -----------------------------------------------------------------------------------------


def test_an_omni_prompt_with_image_audio_and_video_is_ready_for_the_engine(omni):
    prepared = omni.prepare_chat(user({"type": "text", "text": "What is this?"}, IMAGE, AUDIO, VIDEO))
    assert [m.kind for m in prepared.media] == ["image", "audio", "video", "audio"]  # the video's sound with it
    text = omni.tokenizer.decode(prepared.token_ids, skip_special_tokens=False)
    video, track = prepared.media[2:]
    assert qwen_processor_layout(video.features.grid_thw, video.features.second_per_grid,
                                 track.features.num_tokens) in text
    request = omni.request("r", prepared, SamplingParams(max_tokens=4))
    assert request.mrope_positions.shape == (3, len(prepared.token_ids))
    # the same image gives the same digest (shared prefix-cache blocks), another image another one
    again = omni.prepare_chat(user(IMAGE))
    other = omni.prepare_chat(user({"type": "image_url", "image_url": {"url": data_url(png(1), "image/png")}}))
    assert again.media[0].digest == prepared.media[0].digest != other.media[0].digest
    # without the sound: the video alone, between its own markers
    silent = omni.prepare_chat(user(VIDEO), {"use_audio_in_video": False})
    assert [m.kind for m in silent.media] == ["video"]
    assert "<|vision_bos|>" + "<|VIDEO|>" * video.features.num_tokens + "<|vision_eos|>" in \
        omni.tokenizer.decode(silent.token_ids, skip_special_tokens=False)


def test_media_above_the_token_limit_are_encoded_at_it_as_the_plan_sized_them(synth_thinkers):
    """--max-image-tokens scales a picture down, and a video's frames to it a pair; the plan's largest items hold
    what the frontend makes."""
    from edge_infer.media.image import smart_resize
    from edge_infer.memory.media_shapes import media_shapes

    front = Frontend.create(synth_thinkers["qwen2_5_vl"], dtype="float32", max_model_len=2048,
                            media_limits={**LIMITS, "max_image_pixels": 1200 * 900, "max_image_tokens": 40})
    cfg = front.media_processing.vision
    big = {"type": "image_url", "image_url": {"url": data_url(png(3, width=1200, height=900), "image/png")}}
    video = {"type": "video_url", "video_url": {"url": data_url(video_file(frames_of(8, 448, 336), 4), "video/mp4")}}
    picture, frames = (m.features for m in front.prepare_chat(user(big, video)).media)
    h, w = smart_resize(900, 1200, cfg.factor, cfg.min_pixels, 40 * cfg.factor ** 2)
    assert picture.grid_thw == (1, h // cfg.patch_size, w // cfg.patch_size) and picture.num_tokens <= 40
    per_pair = frames.grid_thw[1] * frames.grid_thw[2] // 4
    assert per_pair <= max(40, cfg.video_min_pixels // cfg.factor ** 2) < 448 * 336 // cfg.factor ** 2
    shapes = media_shapes(front.media_limits, front.media_processing)
    assert picture.num_tokens <= shapes.image_tokens and frames.num_tokens <= shapes.video_tokens


def test_a_low_detail_picture_is_read_at_512_x_512_pixels_worth_of_tokens(synth_thinkers):
    """OpenAI's image_url detail: low caps a picture at 512 x 512 pixels' tokens (334 at 28 x 28 a token); auto and
    high at max_image_tokens; a picture within the cap is read as it is; another value is refused naming it."""
    front = Frontend.create(synth_thinkers["qwen2_5_vl"], dtype="float32", max_model_len=2048, media_limits={
        **LIMITS, "max_image_pixels": 1200 * 900, "max_image_tokens": 1000, "max_videos": 0})

    def tokens(detail: str | None, width: int = 1200, height: int = 900) -> int:
        url = {"url": data_url(png(3, width=width, height=height), "image/png"), **({"detail": detail} if detail else {})}
        return front.prepare_chat(user({"type": "image_url", "image_url": url})).media[0].features.num_tokens

    assert tokens("low") <= 512 * 512 // 28 ** 2 < tokens("auto") == tokens("high") == tokens(None) <= 1000
    assert tokens("low", 300, 200) == tokens(None, 300, 200)
    with pytest.raises(InvalidRequestError, match=r"content\[0\] \(image_url\): detail 'max' is not one of auto, low, high"):
        tokens("max")


def test_input_audio_data_may_be_a_whole_data_url(omni):
    """Some clients put a data: URL in input_audio's data: the same clip; anything but base64 there still is not."""
    as_url = {"type": "input_audio", "input_audio": {"data": "data:audio/wav;base64," + WAV, "format": "wav"}}
    clip, same = (omni.prepare_chat(user(p)).media[0] for p in (AUDIO, as_url))
    assert clip.digest == same.digest
    other = {"type": "input_audio", "input_audio": {"data": "file:///etc/hostname", "format": "wav"}}
    with pytest.raises(MediaError, match=r"content\[0\] \(input_audio\): the data is not valid base64"):
        omni.prepare_chat(user(other))


def test_pictures_off_at_a_token_limit_of_0_are_refused_before_decoding(synth_thinkers):
    """The plan sizes no image or video for --max-image-tokens 0 (or fits it to 0): one sent is refused saying so,
    as a video is when its frames are off, not encoded at the processor's smallest size."""
    front = Frontend.create(synth_thinkers["qwen2_5_omni"], dtype="float32", max_model_len=2048,
                            media_limits={**LIMITS, "max_image_tokens": 0})
    for part, where in ((IMAGE, "image_url"), (VIDEO, "video_url")):
        with pytest.raises(MediaError, match=rf"content\[0\] \({where}\): pictures are off \(the limit is 0 vision "
                                             r"tokens per image or pair of video frames\); raise --max-image-tokens"):
            front.prepare_chat(user(part))
    assert [m.kind for m in front.prepare_chat(user(AUDIO)).media] == ["audio"]


def test_a_vl_video_has_no_sound_and_vl_takes_no_audio(vl):
    prepared = vl.prepare_chat(user(VIDEO, IMAGE))
    assert [m.kind for m in prepared.media] == ["video", "image"]
    vl.request("r", prepared, SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError, match=r"content\[0\] \(input_audio\): this model \(qwen2_5_vl\) takes "
                                                  r"image and video input, not audio"):
        vl.prepare_chat(user(AUDIO))


def test_a_kind_the_chat_template_refuses_is_refused_before_any_decoding():
    # The embedded demo is a Qwen2.5-VL checkpoint whose template renders images only (its tower never saw a
    # video): a video is refused as a kind it does not take, and audio's refusal no longer claims video either.
    demo = Frontend.create(vision_demo_model_dir(), max_model_len=2048)
    assert demo.plan.media_kinds == ("image",)
    with pytest.raises(InvalidRequestError, match=r"content\[0\] \(video_url\): this model \(demo-vl-model\) takes "
                                                  r"image input, not video \(its chat template renders no video parts\)"):
        demo.prepare_chat(user(VIDEO))
    with pytest.raises(InvalidRequestError, match=r"takes image input, not audio$"):
        demo.prepare_chat(user(AUDIO))
    assert [m.kind for m in demo.prepare_chat(user(IMAGE)).media] == ["image"]


def test_a_text_model_refuses_media_naming_itself(tiny_model):
    frontend = Frontend.create(tiny_model, max_model_len=256)
    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\.content\[1\] \(image_url\): this model "
                                                  r"\(tiny-qwen2\) takes text only"):
        frontend.prepare_chat(user({"type": "text", "text": "Hi"}, IMAGE))
    # text parts alone are a string for its template
    assert frontend.prepare_chat(user({"type": "text", "text": "Hi"})).token_ids == \
        frontend.prepare_chat([{"role": "user", "content": "Hi"}]).token_ids


@pytest.mark.parametrize("limits, parts, error", [
    ({"max_images": 2}, [IMAGE] * 3, "the request: 3 images is above the limit of 2 images per request "
                                     r"\(--max-images\); send fewer images or raise --max-images"),
    ({"max_image_pixels": 1000}, [IMAGE], r"content\[0\] \(image_url\): 64x48 pixels is above the limit of 1,000 "
                                          r"pixels per image \(--max-image-pixels\)"),
    ({"max_audio_seconds": 0.5}, [AUDIO], r"content\[0\] \(input_audio\): 1.0 s is above the limit of 0.5 seconds"),
    ({"max_audios": 1}, [AUDIO, AUDIO], r"the request: 2 audio clips is above the limit of 1 audio clip per request "
                                        r"\(--max-audios\)"),
    ({"max_videos": 0}, [VIDEO], r"the request: 1 video is above the limit of 0 videos"),
])
def test_limits_are_the_plans_and_are_checked_naming_the_part_and_the_flag(synth_thinkers, limits, parts, error):
    frontend = Frontend.create(synth_thinkers["qwen2_5_omni"], dtype="float32", max_model_len=2048,
                               media_limits=limits)
    assert frontend.media_limits is frontend.plan.media_limits
    assert all(getattr(frontend.media_limits, name) == value for name, value in limits.items())
    with pytest.raises(MediaError, match=error):
        frontend.prepare_chat(user(*parts))


def test_media_sources_follow_the_frontends_policy(omni, tmp_path, monkeypatch):
    (tmp_path / "a.png").write_bytes(png())
    part = {"type": "image_url", "image_url": {"url": (tmp_path / "a.png").as_uri()}}
    with pytest.raises(MediaError, match=r"content\[0\] \(image_url\): file:// URLs are off"):
        omni.prepare_chat(user(part))
    monkeypatch.setattr(omni, "media_policy", dataclasses.replace(omni.media_policy, allowed_dir=tmp_path))
    assert omni.prepare_chat(user(part)).media[0].digest == omni.prepare_chat(user(IMAGE)).media[0].digest


def test_a_template_that_drops_a_part_is_refused_before_decoding(omni, monkeypatch):
    tokenizer = Tokenizer(omni.plan.model)
    tokenizer.chat_template = QWEN_STYLE.replace("<|vision_bos|><|IMAGE|><|vision_eos|>", "")
    monkeypatch.setattr(omni, "tokenizer", tokenizer)
    monkeypatch.setattr(media_prompt, "load_part", lambda *a: pytest.fail("decoded"))
    with pytest.raises(InvalidRequestError, match="wrote 0 image placeholder"):
        omni.prepare_chat(user(IMAGE))


def test_local_text_engine_takes_the_same_messages_as_llm_chat(synth_thinkers):
    import asyncio

    from edge_infer import LLM
    from edge_infer.engine.local import LocalTextEngine

    model = synth_thinkers["qwen2_5_vl"]
    messages = user({"type": "text", "text": "Describe"}, IMAGE, VIDEO)
    settings = dict(dtype="float32", max_model_len=2048, kv_cache_memory_bytes=4 << 20, media_limits=LIMITS)
    with LLM(model, worker="thread", **settings) as llm:
        first = llm.chat(messages, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
        again = llm.chat(messages, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == first.outputs[0].token_ids  # equal digests

    async def local() -> list[int]:
        engine = LocalTextEngine(model, worker="thread", **settings)
        await engine.start()
        try:
            rid, stream = await engine.submit(engine.open_session(), messages, max_tokens=6, ignore_eos=True)
            return [t for event in [e async for e in stream] for t in event.token_ids]
        finally:
            await engine.close()

    assert asyncio.run(local()) == first.outputs[0].token_ids
