"""Chat messages with media content parts into a prompt for a multimodal thinker, the same for every frontend.

The server, ``LLM.chat``, ``LocalTextEngine`` and the Omni text stage all go through
``Frontend.prepare_chat``, which takes these steps:

1. ``split_messages`` reads each content part: OpenAI's ``text``, ``image_url`` ({"url"}) and
   ``input_audio`` ({"data": base64, "format"}), vLLM's ``video_url`` and ``audio_url`` ({"url"}). A media
   part becomes ``{"type": "image" | "audio" | "video"}`` for the chat template (the types Qwen2.5-VL's and
   Qwen2.5-Omni's templates and edge-infer's synth templates render as their markers around one
   placeholder) and a ``MediaPart`` to load; a content list without media is joined into one string, as
   text-only templates expect.
2. ``check_parts``: the model takes each kind, and the image, audio and video counts are within the limits.
   Nothing has been read yet.
3. The template renders; ``check_placeholders`` matches the placeholders it wrote to the parts.
4. ``load_part`` reads a part's bytes under the operator's ``MediaPolicy``, decodes and featurizes it
   (``edge_infer.media``): the slow step, which a caller with an event loop runs on a thread.
5. ``expand`` repeats each placeholder once per embedding row and builds the ``MediaInput``s, each with a
   digest of its features (the same image gives the same digest, so prefix-cache blocks are shared). An
   Omni video with a sound track is interleaved with it as Qwen2.5-Omni's processor lays it out
   (``use_audio_in_video``, on unless ``mm_processor_kwargs`` turns it off): ``<|audio_bos|>``, video chunk
   0, audio chunk 0, video chunk 1, ..., ``<|audio_eos|>``, inside the video's own markers.
"""
from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from edge_infer.engine.protocol import MediaInput
from edge_infer.errors import InvalidRequestError, MediaError
from edge_infer.media.audio import audio_features, decode_audio
from edge_infer.media.config import PREPROCESSOR_FILE, MediaProcessing
from edge_infer.media.features import AudioFeatures, VisionFeatures
from edge_infer.media.image import decode_image, image_features
from edge_infer.media.limits import COUNT_LIMITS, LIMITS, MediaLimits
from edge_infer.media.sources import MediaPolicy, decode_base64, read_source
from edge_infer.media.video import video_features
from edge_infer.models.config import MultimodalConfig
from edge_infer.models.mrope import MediaLayout, audio_in_video_pieces

# Content part type -> the media kind it carries.
MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "audio_url": "audio", "video_url": "video"}
INPUT_AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "m4a", "webm")
PART_TYPES = "text, image_url, input_audio, audio_url or video_url"
IMAGE_DETAILS = ("auto", "low", "high")
# OpenAI's image_url "detail": "low" reads a picture at 512 x 512; here at as many tokens' pixels (334 of Qwen's),
# where the limits allow more: a faster encode and a shorter prompt. "auto" and "high" take max_image_tokens.
LOW_DETAIL_PIXELS = 512 * 512
# mm_processor_kwargs (vLLM's name) that the preprocessing takes.
PROCESSOR_OPTIONS = ("use_audio_in_video",)


@dataclass(frozen=True)
class MediaPart:
    """One media content part, as read from the messages (nothing loaded yet)."""

    kind: str  # image | audio | video
    where: str  # how errors name it: "messages[0].content[1] (image_url)"
    url: str | None = None  # image_url, audio_url, video_url: data:, file://, http(s)://
    data: str | None = None  # input_audio: base64
    detail: str | None = None  # image_url: auto | low | high


@dataclass
class SplitChat:
    messages: list[dict[str, Any]]  # what the chat template renders
    parts: list[MediaPart]  # the media parts in message order


@dataclass
class LoadedPart:
    part: MediaPart
    features: VisionFeatures | AudioFeatures
    track: AudioFeatures | None = None  # a video's own sound, interleaved with it (Omni)


def split_messages(messages: Sequence[Mapping[str, Any]]) -> SplitChat:
    """The template's messages and the media parts, read without loading anything."""
    if not isinstance(messages, (list, tuple)):
        raise InvalidRequestError(f"messages must be a list of {{role, content}} objects, not {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    parts: list[MediaPart] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object with a role and content, "
                                      f"not {type(message).__name__}")
        message = dict(message)
        if isinstance(message.get("content"), (list, tuple)):
            message["content"] = _content(message["content"], f"messages[{i}].content", parts)
        out.append(message)
    return SplitChat(out, parts)


def has_media_parts(messages: Any) -> bool:
    """Whether any message holds an image, audio or video part (nothing checked: split_messages does that)."""
    return isinstance(messages, (list, tuple)) and any(
        isinstance(m, Mapping) and isinstance(m.get("content"), (list, tuple))
        and any(isinstance(p, Mapping) and p.get("type") in MEDIA_PARTS for p in m["content"]) for m in messages)


def _content(content: Sequence[Any], where: str, parts: list[MediaPart]) -> str | list[dict[str, Any]]:
    rendered: list[dict[str, Any]] = []
    before = len(parts)
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise InvalidRequestError(f"{at} (text): 'text' must be a string")
            rendered.append({"type": "text", "text": part["text"]})
        elif kind in MEDIA_PARTS:
            parts.append(_media_part(part, kind, f"{at} ({kind})"))
            rendered.append({"type": MEDIA_PARTS[kind]})
        elif not isinstance(part, Mapping):
            raise InvalidRequestError(f"{at}: a content part must be an object with a type, not {type(part).__name__}")
        else:
            raise InvalidRequestError(f"{at}: content part type {kind!r} is not one edge-infer reads; use {PART_TYPES}")
    if len(parts) == before:  # text only: one string, what every template renders
        return "".join(p["text"] for p in rendered)
    return rendered


def _media_part(part: Mapping[str, Any], kind: str, where: str) -> MediaPart:
    value = part.get(kind)
    if kind == "input_audio":
        if not isinstance(value, Mapping) or not isinstance(value.get("data"), str):
            raise InvalidRequestError(f'{where}: needs "input_audio": {{"data": "<base64>", "format": "wav"}}')
        if value.get("format") not in INPUT_AUDIO_FORMATS:
            raise MediaError(f"{where}: format {value.get('format')!r} is not one edge-infer decodes; send "
                             f"{', '.join(INPUT_AUDIO_FORMATS)} audio and name its format")
        return MediaPart("audio", where, data=value["data"])
    url = value.get("url") if isinstance(value, Mapping) else value  # vLLM also takes the URL as a bare string
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f'{where}: needs "{kind}": {{"url": "data:<type>;base64,..." or "file:///..." '
                                  f'or "https://..."}}')
    detail = value.get("detail") if isinstance(value, Mapping) and kind == "image_url" else None
    if detail is not None and detail not in IMAGE_DETAILS:
        raise InvalidRequestError(f"{where}: detail {detail!r} is not one of {', '.join(IMAGE_DETAILS)}")
    return MediaPart(MEDIA_PARTS[kind], where, url=url, detail=detail)


def use_audio_in_video(mm_processor_kwargs: Mapping[str, Any] | None) -> bool:
    """vLLM's ``mm_processor_kwargs``; edge-infer takes ``use_audio_in_video`` (default true: an Omni video's
    sound track goes into the prompt with it)."""
    if mm_processor_kwargs is None:
        return True
    if not isinstance(mm_processor_kwargs, Mapping):
        raise InvalidRequestError("mm_processor_kwargs must be an object such as {\"use_audio_in_video\": false}")
    unknown = sorted(set(mm_processor_kwargs) - set(PROCESSOR_OPTIONS))
    if unknown:
        raise InvalidRequestError(f"mm_processor_kwargs: {', '.join(map(repr, unknown))} is not an option of "
                                  f"edge-infer's preprocessing; it takes {', '.join(PROCESSOR_OPTIONS)}")
    value = mm_processor_kwargs.get("use_audio_in_video", True)
    if not isinstance(value, bool):
        raise InvalidRequestError(f"mm_processor_kwargs.use_audio_in_video must be true or false, not {value!r}")
    return value


def check_parts(parts: Sequence[MediaPart], mm: MultimodalConfig | None, model: str,
                limits: MediaLimits | None, kinds: Sequence[str] | None = None) -> None:
    """Refuse parts the model cannot take, or more images, audio clips or videos than a request may carry
    (``limits``: a multimodal model's; a text model, which has none, takes no parts). ``kinds``: the kinds
    the checkpoint takes, where its chat template renders fewer than its family's."""
    if not parts:
        return
    if mm is None or limits is None:
        raise MediaError(f"{parts[0].where}: this model ({model}) takes text only; send the messages "
                                  "without image, audio or video parts, or serve a multimodal model "
                                  "(Qwen2.5-VL, Qwen2.5-Omni)")
    taken = tuple(kinds) if kinds is not None else mm.kinds
    for part in parts:
        if part.kind not in taken:
            why = f" (its chat template renders no {part.kind} parts)" if part.kind in mm.kinds else ""
            raise MediaError(f"{part.where}: this model ({model}) takes {' and '.join(taken) or 'no media'} "
                                      f"input, not {part.kind}{why}")
        if part.kind in ("image", "video") and limits.max_image_tokens < 1:
            # the plan may have turned them off to fit the context: the flag alone may then not fit
            raise MediaError(f"{part.where}: pictures are off (the limit is 0 vision tokens per image or pair of video "
                             "frames); raise --max-image-tokens, with a --max-model-len that has room for them")
    for kind, limit in COUNT_LIMITS.items():
        count = sum(p.kind == kind for p in parts)
        limits.check(limit, count, part="the request", shown=LIMITS[limit].counted(count))


def check_placeholders(ids: Sequence[int], parts: Sequence[MediaPart], mm: MultimodalConfig) -> None:
    """The rendered prompt holds one placeholder per part of each kind (what ``expand`` pairs up, in order)."""
    for kind in mm.kinds:
        wrote = sum(1 for t in ids if t == mm.placeholder_id(kind))
        given = sum(p.kind == kind for p in parts)
        if wrote != given:
            raise InvalidRequestError(
                f"the chat template wrote {wrote} {kind} placeholder(s) for {given} {kind} part(s): this checkpoint's "
                f"template does not render {kind} parts where they are (send media in user messages), or the text "
                "holds placeholder tokens (served with --parse-special-tokens-in-content)")


def load_part(part: MediaPart, processing: MediaProcessing, policy: MediaPolicy, limits: MediaLimits,
              audio_in_video: bool = True) -> LoadedPart:
    """A part's bytes read under ``policy``, decoded and featurized within ``limits``."""
    if part.data is None:
        data = read_source(part.url, policy, part=part.where)
    elif part.data.lstrip()[:5].lower() == "data:":  # input_audio's data as a whole data: URL, as some clients send
        data = read_source(part.data, policy, part=part.where)
    else:
        data = decode_base64(part.data, policy, part=part.where)
    if part.kind == "audio":
        audio = _settings(processing.audio, part)
        samples = decode_audio(data, limits, rate=audio.sampling_rate, part=part.where)
        return LoadedPart(part, audio_features(samples, audio, part=part.where))
    # Pictures and frames above max_image_tokens are scaled down to it (a "low" detail picture further).
    vision = _settings(processing.vision, part)
    if part.detail == "low":
        limits = replace(limits, max_image_tokens=min(limits.max_image_tokens, LOW_DETAIL_PIXELS // vision.factor ** 2))
    vision = limits.vision_processing(vision)
    if part.kind == "image":
        return LoadedPart(part, image_features(decode_image(data, limits, part=part.where), vision, part=part.where))
    # A video's sound is decoded only when it goes into the prompt (a model with an audio tower, not turned off).
    frames, track = video_features(data, replace(processing, vision=vision, audio=processing.audio if audio_in_video
                                                 else None), limits, part=part.where)
    return LoadedPart(part, frames, track)


def _settings(settings: Any, part: MediaPart) -> Any:
    if settings is None:
        raise MediaError(f"{part.where}: the checkpoint has no {part.kind} preprocessing settings "
                         f"({PREPROCESSOR_FILE}); restore the file from the original checkpoint")
    return settings


def expand(ids: Sequence[int], loaded: Sequence[LoadedPart], mm: MultimodalConfig) -> tuple[list[int], list[MediaInput]]:
    """``ids`` with each placeholder repeated once per embedding row of its part (the parts of a kind in order),
    and the MediaInputs at those rows."""
    kinds = {mm.placeholder_id(kind): kind for kind in mm.kinds}
    queues = {kind: deque(item for item in loaded if item.part.kind == kind) for kind in mm.kinds}
    out: list[int] = []
    media: list[MediaInput] = []
    for token in ids:
        kind = kinds.get(token)
        if kind is None:
            out.append(token)
        elif (item := queues[kind].popleft()).track is None:
            media.append(MediaInput(kind, item.features, _run(out, kind, item.features.num_tokens, mm),
                                    digest(kind, item.features)))
        else:
            media += _interleaved(out, item.features, item.track, mm)
    return out, media


def _run(out: list[int], kind: str, count: int, mm: MultimodalConfig) -> np.ndarray:
    """Append ``count`` placeholders of ``kind``; their prompt indices."""
    start = len(out)
    out.extend([mm.placeholder_id(kind)] * count)
    return np.arange(start, start + count, dtype=np.int64)


def _interleaved(out: list[int], video: VisionFeatures, track: AudioFeatures, mm: MultimodalConfig) -> list[MediaInput]:
    """A video and its sound track in place of the video's placeholder: ``<|audio_bos|>``, chunks of each in turn
    (``models.mrope.audio_in_video_pieces``, which the positions follow too), ``<|audio_eos|>``."""
    layout = MediaLayout("video", np.arange(video.num_tokens), tuple(video.grid_thw), video.second_per_grid)
    runs: dict[str, list[np.ndarray]] = {"video": [], "audio": []}
    out.append(mm.audio_start_token_id)
    for kind, first, end in audio_in_video_pieces(layout, track.num_tokens, mm):
        runs[kind].append(_run(out, kind, end - first, mm))
    out.append(mm.audio_end_token_id)
    return [MediaInput("video", video, np.concatenate(runs["video"]), digest("video", video)),
            MediaInput("audio", track, np.concatenate(runs["audio"]), digest("audio", track))]


def digest(kind: str, features: VisionFeatures | AudioFeatures) -> bytes:
    """What identifies an item's embeddings: a hash of its kind, shape and features (equal media, equal digest)."""
    h = hashlib.sha256(kind.encode())
    if isinstance(features, VisionFeatures):
        grid = tuple(int(g) for g in features.grid_thw)
        h.update(repr((grid, int(features.merge_size), features.second_per_grid)).encode())
        h.update(np.ascontiguousarray(features.pixel_values, dtype=np.float32))
    else:
        h.update(repr(tuple(features.mel.shape)).encode())
        h.update(np.ascontiguousarray(features.mel, dtype=np.float32))
    return h.digest()
