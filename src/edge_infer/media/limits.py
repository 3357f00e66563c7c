"""Per-request media limits, and the one check that refuses a part over one of them.

The memory plan sizes the encoders for these limits, so a request over a limit
is refused (a 400), never served with memory nobody planned. Each refusal names
the part, the amount, the limit and the flag that raises it. One limit refuses
nothing: an image above ``max_image_tokens`` is scaled down to it, as a
processor's ``max_pixels`` scales it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from edge_infer.errors import MediaError

if TYPE_CHECKING:
    from edge_infer.media.config import MediaProcessing, VisionProcessing


# Requests a frontend with an event loop (the server, LocalTextEngine) prepares at once, each on a thread of its
# own. Decoding is CPU work: more threads would share the same cores, and each running one holds a decoded item in
# memory, which the plan sizes for this many requests at the limits.
MEDIA_PREP_THREADS = 2


@dataclass(frozen=True)
class _Limit:
    unit: str  # what the amount counts, per what
    flag: str  # the operator's lever
    fix: str  # what the client can do instead
    one: str | None = None  # the unit after a limit of 1, where it differs ("image per request")

    def unit_for(self, limit: float) -> str:
        return self.one if limit == 1 and self.one else self.unit

    def counted(self, count: int) -> str:
        """``count`` of what a count limit counts: "2 audio clips", "1 audio clip"."""
        return f"{count} {self.unit_for(count).split(' per ')[0]}"


LIMITS = {
    "max_images": _Limit("images per request", "--max-images", "send fewer images", "image per request"),
    "max_image_pixels": _Limit("pixels per image", "--max-image-pixels", "resize it"),
    "max_image_tokens": _Limit("vision tokens per image or pair of video frames", "--max-image-tokens",
                               "send no images or videos"),
    "max_audio_seconds": _Limit("seconds of audio per clip", "--max-audio-seconds", "cut it",
                                "second of audio per clip"),
    "max_audios": _Limit("audio clips per request", "--max-audios", "send fewer clips", "audio clip per request"),
    "max_videos": _Limit("videos per request", "--max-videos", "send fewer videos", "video per request"),
    "max_video_frames": _Limit("sampled frames per video", "--max-video-frames", "send a shorter video"),
    "max_video_seconds": _Limit("seconds per video", "--max-video-seconds", "cut it", "second per video"),
}


# Each media kind's count limit.
COUNT_LIMITS = {"image": "max_images", "audio": "max_audios", "video": "max_videos"}

# The smallest default limit on a decoded image's pixels, whatever the checkpoint's max_pixels: a 4K screenshot is
# decoded and scaled down, not refused (a larger baseline JPEG photo is decoded at a reduced scale: media/image.py).
# The plan holds 9 bytes a pixel of it for each of MEDIA_PREP_THREADS requests being prepared.
MIN_IMAGE_PIXELS_LIMIT = 3840 * 2160


@dataclass(frozen=True)
class MediaLimits:
    """What one request may carry; the plan sizes memory for it.

    max_image_pixels bounds the decoded image (width x height, read from the header before decoding): the
    decoding work and its buffers. max_image_tokens bounds what the vision encoder sees: a larger image (or pair
    of video frames) is scaled down to it (``vision_processing``), not refused.
    A video is sampled at up to max_video_frames frames (fewer frames per second for longer videos,
    as Qwen's max_frames does); max_video_seconds bounds the decoding work (and the frames decoded, to what
    60 frames a second of 1920x1080 would be: video.DECODE_PIXELS_PER_SECOND), and its audio track is an
    audio clip under max_audio_seconds.
    """

    max_images: int = 4
    max_image_pixels: int = 16384 * 28 * 28  # Qwen2.5-VL/Omni checkpoints' max_pixels (above the floor below)
    max_image_tokens: int = 16384  # the same, in tokens (28 x 28 pixels each)
    max_audio_seconds: float = 30.0
    max_audios: int = 1
    max_videos: int = 1
    max_video_frames: int = 32
    max_video_seconds: float = 120.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{f.name} ({LIMITS[f.name].flag}) must be a number >= 0, got {value!r}")
            if f.type in (int, "int"):  # counts and pixels are whole (a YAML or JSON 1.0 is 1)
                if value != int(value):
                    raise ValueError(f"{f.name} ({LIMITS[f.name].flag}) must be a whole number, got {value!r}")
                object.__setattr__(self, f.name, int(value))

    @classmethod
    def for_processing(cls, media: "MediaProcessing", **overrides: Any) -> "MediaLimits":
        """The defaults for a checkpoint: images decoded up to its processor's max_pixels, and at least
        MIN_IMAGE_PIXELS_LIMIT (a processor that shrinks pictures to a few thousand pixels, as a small demo's may,
        still takes the pictures people send), and encoded at up to its max_pixels (the token limit rounded up, so
        that its own processing is unchanged)."""
        vision = media.vision
        if vision is None:
            return replace(cls(), **overrides)
        tokens = -(-max(vision.max_pixels, vision.video_max_pixels) // vision.factor ** 2)
        return replace(cls(max_image_pixels=max(vision.max_pixels, MIN_IMAGE_PIXELS_LIMIT), max_image_tokens=tokens),
                       **overrides)

    def vision_processing(self, vision: "VisionProcessing") -> "VisionProcessing":
        """``vision`` resizing to at most max_image_tokens: its max_pixels (and the video frames') lowered to that
        many tokens' pixels, never below its min_pixels (the processor scales small pictures up to those)."""
        cap = self.max_image_tokens * vision.factor ** 2
        return replace(vision, max_pixels=min(vision.max_pixels, max(vision.min_pixels, cap)),
                       video_max_pixels=min(vision.video_max_pixels, max(vision.video_min_pixels, cap)))

    def check(self, name: str, amount: float, *, part: str, shown: str | None = None) -> None:
        """Refuse `part` when `amount` is above the limit `name`; `shown` is how the message states the amount."""
        limit = getattr(self, name)
        if amount > limit:
            spec = LIMITS[name]
            raise MediaError(f"{part}: {shown or shown_number(amount)} is above the limit of {shown_number(limit)} "
                             f"{spec.unit_for(limit)} ({spec.flag}); {spec.fix} or raise {spec.flag}")


def shown_number(value: float) -> str:
    """A limit or an amount as the messages print it: 12,845,056 pixels, 2.5 s."""
    return f"{value:g}" if isinstance(value, float) else f"{value:,}"
