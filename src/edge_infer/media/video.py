"""Videos into one VisionFeatures (sampled frames) and, when the file has sound, its AudioFeatures.

Frames are sampled as Qwen's video processor samples them: `fps` frames per second (at least
min_frames, at most max_frames and the request limit), an even count (a multiple of the temporal
patch), spread evenly from the first frame. Every frame is resized to one smart_resize grid (the
video pixel range) and goes through the image pipeline (image.py); consecutive pairs form the
temporal patches. The audio track is mixed to mono and resampled like any audio clip (audio.py).
"""
from __future__ import annotations

import gc
import io
import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from edge_infer.errors import MediaError
from edge_infer.media.audio import audio_features
from edge_infer.media.config import MediaProcessing, VisionProcessing
from edge_infer.media.container import SoundTrack, container_format
from edge_infer.media.features import AudioFeatures, VisionFeatures
from edge_infer.media.image import grid_thw, patchify, resized_frame, smart_resize
from edge_infer.media.limits import MediaLimits

if TYPE_CHECKING:
    import av

log = logging.getLogger(__name__)

VIDEO_FORMATS = "MP4, MOV, WebM, MKV or AVI"
WITHOUT_SOUND = '"mm_processor_kwargs": {"use_audio_in_video": false}'
# The decoding work max_video_seconds allows: 60 frames a second at 1920x1080, or as many pixels. A file's own
# frame rate is not trusted: 200,000 tiny frames "at 1,700 fps" pass a 120 s limit and take a media thread
# for a quarter of an hour.
DECODE_PIXELS_PER_SECOND = 60 * 1920 * 1080


def sample_indices(total: int, video_fps: float, cfg: VisionProcessing, max_frames: int) -> list[int]:
    """The frame indices Qwen2VLVideoProcessor.sample_frames picks, at most `max_frames` of them."""
    tp = cfg.temporal_patch_size
    ceiling = math.floor(min(cfg.video_max_frames, max_frames, total) / tp) * tp
    wanted = min(max(total / video_fps * cfg.video_fps, cfg.video_min_frames), ceiling, total)
    count = math.floor(wanted / tp) * tp
    return [i * total // count for i in range(count)] if count else []


def video_features(data: bytes, cfg: MediaProcessing, limits: MediaLimits,
                   *, part: str = "video") -> tuple[VisionFeatures, AudioFeatures | None]:
    """A video file's sampled frames as vision patches, and its audio track's features (None without one)."""
    import av

    vision = cfg.vision
    if vision is None:
        raise MediaError(f"{part}: this model does not take images or video")
    if not data:
        raise MediaError(f"{part}: is empty (0 bytes); send {VIDEO_FORMATS} video")
    fmt = container_format(data)
    if fmt is None:
        raise MediaError(f"{part}: is not a video container edge-infer reads; send {VIDEO_FORMATS} video")
    try:
        # metadata_errors: a tag that is not UTF-8 (older cameras write Latin-1 titles) is not the video's fault
        with av.open(io.BytesIO(data), format=fmt, metadata_errors="replace") as container:
            return _decode(container, cfg, vision, limits, part)
    except MediaError:
        raise
    except (av.FFmpegError, ValueError) as exc:  # PyAV refuses some malformed streams with ValueError
        raise MediaError(f"{part}: cannot be decoded as {fmt} video ({exc})") from None


def _decode(container: "av.container.InputContainer", cfg: MediaProcessing, vision: VisionProcessing,
            limits: MediaLimits, part: str) -> tuple[VisionFeatures, AudioFeatures | None]:
    import av

    if not container.streams.video:
        raise MediaError(f"{part}: has no video stream; send audio as input_audio")
    stream = container.streams.video[0]
    if stream.codec_context is None:  # PyAV's FFmpeg has no decoder for it
        raise MediaError(f"{part}: its video is in a codec edge-infer cannot decode; re-encode it as H.264")
    fps = float(stream.average_rate or stream.guessed_rate or 0)
    if fps <= 0:
        raise MediaError(f"{part}: its frame rate is unknown; re-encode it with a constant frame rate")
    width, height = stream.codec_context.width, stream.codec_context.height
    if not width or not height:
        raise MediaError(f"{part}: its frame size is unknown; re-encode it")
    limits.check("max_image_pixels", width * height, part=part, shown=f"each frame, {width}x{height} pixels,")
    # The header's size binds no frame (a stream can switch to 12000x12000 frames after the first): FFmpeg's
    # decoders refuse a frame above the limit before they allocate it.
    stream.codec_context.options = {"max_pixels": str(limits.max_image_pixels)}
    total = _frame_count(container, stream, fps)
    limits.check("max_video_seconds", total / fps, part=part, shown=f"{total / fps:.1f} s")
    budget = max(1, int(limits.max_video_seconds * DECODE_PIXELS_PER_SECOND) // (width * height))
    if total > budget:
        _over_budget(part, f"{total} frames ({fps:g} per second)", width, height, budget, limits)
    if limits.max_video_frames < vision.temporal_patch_size:
        # the plan may have turned them off to fit the context: the flag alone may then not fit
        raise MediaError(f"{part}: videos are off (the limit is {limits.max_video_frames} sampled frames per video, "
                         f"and a video needs {vision.temporal_patch_size}); raise --max-video-frames, with a "
                         "--max-model-len that has room for them")
    wanted = sample_indices(total, fps, vision, limits.max_video_frames)
    if not wanted:
        raise MediaError(f"{part}: has {total} frame(s); a video needs at least {vision.temporal_patch_size} "
                         "(send a single frame as an image)")
    out_h, out_w = smart_resize(height, width, vision.factor, vision.video_min_pixels, vision.video_max_pixels,
                                part=part)

    audio_stream = container.streams.audio[0] if cfg.audio is not None and container.streams.audio else None
    if audio_stream is not None and audio_stream.codec_context is None:
        raise MediaError(f"{part}: its sound is in a codec edge-infer cannot decode; re-encode it with AAC or Opus "
                         f"sound, or send the video without its sound ({WITHOUT_SOUND})")
    frames: list[np.ndarray] = []
    track = SoundTrack(cfg.audio.sampling_rate, limits, f"{part} (its audio track)") if audio_stream else None
    origin, last, decoded, turn = None, None, 0, 0
    for packet in container.demux(*[s for s in (stream, audio_stream) if s is not None]):
        if packet.stream is stream and len(frames) == len(wanted):
            continue  # every sampled frame is in: only the sound track is still read
        for frame in _decoded(packet, limits, part):
            if isinstance(frame, av.AudioFrame):
                try:
                    track.add(frame)
                except MediaError as exc:  # longer than an audio clip may be, say: the picture alone is not
                    raise MediaError(f"{exc}; or send the video without its sound ({WITHOUT_SOUND})") from None
                continue
            decoded += 1
            if decoded > budget:  # more frames than the header counted (timestamps that do not advance, say)
                _over_budget(part, f"more than {budget} frames", width, height, budget, limits)
            # A frame's index from its timestamp: robust to hidden frames and metadata that miscounts.
            origin = frame.time if origin is None else origin
            index = round((frame.time - origin) * fps) if frame.time is not None else len(frames)
            if last is None:
                turn = _quarter_turns(frame)
                if turn % 2:  # the grid of the turned frame (smart_resize treats both sides alike)
                    out_h, out_w = out_w, out_h
            elif decoded == 2 and frame.rotation:
                # The first frame's side data, read for its matrix, and the frame refer to each other: collected
                # now, its pixels (12 MiB at 3840 x 2160) do not stay beside later frames, past the plan.
                last = None
                gc.collect(1)
            last = frame
            while len(frames) < len(wanted) and index >= wanted[len(frames)]:
                frames.append(_upright_resized(frame, turn, out_h, out_w, vision))
        if len(frames) == len(wanted) and audio_stream is None:
            break
    if last is None:
        raise MediaError(f"{part}: no frame decodes; re-encode it")
    if len(frames) < len(wanted):
        log.warning("%s: %d of %d sampled frames are past its last frame (its length is overstated); "
                    "repeating the last frame", part, len(wanted) - len(frames), len(wanted))
        frames.extend([_upright_resized(last, turn, out_h, out_w, vision)] * (len(wanted) - len(frames)))

    pixels = patchify(np.stack(frames), vision)
    sampled_fps = len(wanted) / total * fps
    features = VisionFeatures(pixels, grid_thw(len(wanted), out_h, out_w, vision), vision.merge_size,
                              second_per_grid=vision.temporal_patch_size / sampled_fps)
    sound = track.finish() if track is not None else None
    if sound is None:
        return features, None
    return features, audio_features(sound, cfg.audio, part=track.part)


def _quarter_turns(frame: "av.VideoFrame") -> int:
    """Counterclockwise quarter turns a player gives the frame: its display matrix's rotation (counterclockwise
    degrees, as PyAV reads it; a phone video shot upright is stored on its side with -90 or 90). A mirrored
    matrix, whose rotation PyAV reads as a turn, and an angle off a quarter turn are left as stored."""
    degrees = frame.rotation
    turns = round(degrees / 90)
    if not turns % 4 or abs(degrees - 90 * turns) >= 1:
        return 0
    from av.sidedata.sidedata import Type

    # A lookup by key, not iteration: PyAV 18.1.0 iterates side data's values, 18.1.1 its keys. The side data holds
    # a cycle with the frame: _decode collects it once the frame is done.
    matrix = frame.side_data.get(Type.DISPLAYMATRIX)
    if matrix is None:
        return turns % 4
    a, b, _, c, d = np.frombuffer(bytes(matrix), dtype="<i4")[:5].astype(np.int64)
    return 0 if a * d - b * c < 0 else turns % 4


def _upright_resized(frame: "av.VideoFrame", turns: int, height: int, width: int,
                     vision: VisionProcessing) -> np.ndarray:
    """The frame as a player shows it, turned by its display matrix (as photos are by their EXIF orientation),
    at ``height`` x ``width``. It is resized on its side and then turned: a turned copy of the whole frame would
    be 4 more bytes a decoded pixel than the plan holds; the two orders differ by the resize's rounding."""
    if not turns:
        return resized_frame(frame.to_image(), height, width, vision)
    on_side = (width, height) if turns % 2 else (height, width)
    return np.rot90(resized_frame(frame.to_image(), *on_side, vision), turns).copy()


def _over_budget(part: str, amount: str, width: int, height: int, budget: int, limits: MediaLimits) -> None:
    raise MediaError(f"{part}: {amount} of {width}x{height} pixels is more decoding than {limits.max_video_seconds:g} s "
                     f"of video allows ({budget} frames at this size: 60 frames a second at 1920x1080, or as many "
                     "pixels; --max-video-seconds); re-encode it at a lower frame rate or size")


def _decoded(packet: "av.Packet", limits: MediaLimits, part: str) -> list:
    """A packet's frames; a video frame FFmpeg refuses is named with the size limit it may have crossed."""
    import av

    try:
        return packet.decode()
    except av.FFmpegError as exc:
        if packet.stream.type != "video":
            raise
        raise MediaError(f"{part}: a frame cannot be decoded ({exc}): it is corrupt, or larger than the limit of "
                         f"{limits.max_image_pixels:,} pixels (--max-image-pixels); re-encode the video at a smaller "
                         "size or raise --max-image-pixels") from None


def _frame_count(container: "av.container.InputContainer", stream: "av.video.stream.VideoStream", fps: float) -> int:
    """Frames in the stream: the header's count, else its duration times the rate, else counted packets."""
    if stream.frames > 0:
        return stream.frames
    if stream.duration is not None and stream.time_base is not None:
        return max(1, round(float(stream.duration * stream.time_base) * fps))
    if container.duration is not None:
        return max(1, round(container.duration / 1_000_000 * fps))
    count = sum(1 for packet in container.demux(stream) if packet.size)
    container.seek(0)
    return count
