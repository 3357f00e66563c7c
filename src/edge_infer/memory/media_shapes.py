"""The largest media one request may carry under its limits, as encoder shapes and prompt tokens (torch-free).

A limit bounds what a request sends (``media.limits.MediaLimits``); what the
encoders and the context see is what preprocessing makes of it (``media/``):

- an image of at most ``max_image_pixels`` decoded pixels is resized by
  ``smart_resize`` to sides that are multiples of ``patch_size x merge_size``,
  within the processor's ``[min_pixels, max_pixels]``, max_pixels lowered to
  ``max_image_tokens`` tokens (``MediaLimits.vision_processing``). Rounding lets
  a thin image come out larger than it went in (a 42 x 4778 image becomes
  56 x 4788), so the largest grid is searched, not assumed square;
- a video samples at most ``min(max_video_frames, the processor's max_frames)``
  frames, floored to whole temporal patches, each frame (at most
  ``max_image_pixels``, like an image) resized into the video pixel range (its
  top lowered to ``max_image_tokens`` too); its sound track is an audio clip
  under ``max_audio_seconds``;
- an audio clip of ``max_audio_seconds`` gives ``seconds x rate / hop`` mel
  frames (the extractor cuts clips at ``chunk_length`` seconds).

``MediaShapes`` holds the largest item of each kind and what a request at the
limits costs in prompt tokens: placeholders plus two markers per item.
``fit_limits`` lowers the limits a caller did not set until such a request fits
the context (``docs/memory.md``, "Multimodal models").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from edge_infer.media.config import AudioProcessing, MediaProcessing, VisionProcessing
from edge_infer.media.image import MAX_ASPECT_RATIO, smart_resize
from edge_infer.media.limits import LIMITS, MediaLimits, shown_number
from edge_infer.models.encoder_config import audio_output_length

MARKERS = 2  # start and end tokens around every media item in a prompt
AUDIO_SECONDS_STEP = 0.1  # fitted audio limits are whole tenths of a second


@dataclass(frozen=True)
class MediaShapes:
    """The largest image, video and clip a request may carry, and how many of each; None: the kind is off."""

    image_grid: tuple[int, int, int] | None  # (1, h, w) in patches
    images: int
    video_grid: tuple[int, int, int] | None  # (t, h, w): t temporal patches of frame pairs
    videos: int
    audio_frames: int | None  # mel frames of the longest clip (a video's track too)
    audios: int
    merge_unit: int  # patches per vision token
    temporal_patch: int

    @property
    def image_tokens(self) -> int:
        return _vision_tokens(self.image_grid, self.merge_unit)

    @property
    def video_tokens(self) -> int:
        return _vision_tokens(self.video_grid, self.merge_unit)

    @property
    def audio_tokens(self) -> int:
        return audio_output_length(self.audio_frames) if self.audio_frames else 0

    @property
    def video_frames(self) -> int:
        return self.video_grid[0] * self.temporal_patch if self.video_grid else 0

    def kind_tokens(self) -> dict[str, int]:
        """Prompt tokens a request at the limits spends on each kind: placeholders and markers.

        A video's sound track (Omni) is interleaved with it: the video's count includes it.
        """
        track = self.audio_tokens + MARKERS if self.audio_frames else 0
        return {
            "images": self.images * (self.image_tokens + MARKERS) if self.image_grid else 0,
            "videos": self.videos * (self.video_tokens + MARKERS + track) if self.video_grid else 0,
            "audio": self.audios * (self.audio_tokens + MARKERS) if self.audio_frames else 0,
        }

    @property
    def request_tokens(self) -> int:
        return sum(self.kind_tokens().values())

    @property
    def largest_vision_patches(self) -> int:
        """Patches of the largest vision encode: one image or one whole video (its frames go through together)."""
        return max(_patches(self.image_grid), _patches(self.video_grid))


def _patches(grid: tuple[int, int, int] | None) -> int:
    return grid[0] * grid[1] * grid[2] if grid else 0


def _vision_tokens(grid: tuple[int, int, int] | None, merge_unit: int) -> int:
    return _patches(grid) // merge_unit


def media_shapes(limits: MediaLimits, media: MediaProcessing) -> MediaShapes:
    """The largest items ``limits`` let through, as ``media`` preprocesses them (a part ``media`` lacks: off)."""
    vision, audio = media.vision, media.audio
    frames = audio_frames(limits.max_audio_seconds, audio) if audio is not None else 0
    return MediaShapes(
        image_grid(limits, vision), limits.max_images, video_grid(limits, vision), limits.max_videos, frames or None,
        limits.max_audios if audio is not None else 0,
        vision.merge_size ** 2 if vision else 4, vision.temporal_patch_size if vision else 2)


def image_grid(limits: MediaLimits, vision: VisionProcessing | None) -> tuple[int, int, int] | None:
    """(1, h, w) in patches of the largest image, or None when images are off."""
    if vision is None or limits.max_images < 1 or limits.max_image_tokens < 1:
        return None
    vision = limits.vision_processing(vision)
    h, w = largest_resize(limits.max_image_pixels, vision.factor, vision.min_pixels, vision.max_pixels)
    return (1, h // vision.patch_size, w // vision.patch_size) if h else None


def video_grid(limits: MediaLimits, vision: VisionProcessing | None) -> tuple[int, int, int] | None:
    """(t, h, w) of the largest video: its sampled frames in temporal patches, each frame (at most
    max_image_pixels, as an image) resized into the video pixel range (at most max_image_tokens a pair); None
    when videos are off."""
    if vision is None or limits.max_videos < 1 or limits.max_image_tokens < 1:
        return None
    vision = limits.vision_processing(vision)
    pairs = min(limits.max_video_frames, vision.video_max_frames) // vision.temporal_patch_size
    if pairs < 1:
        return None
    h, w = largest_resize(limits.max_image_pixels, vision.factor, vision.video_min_pixels, vision.video_max_pixels)
    return (pairs, h // vision.patch_size, w // vision.patch_size) if h else None


def audio_frames(seconds: float, audio: AudioProcessing) -> int:
    """Mel frames ``log_mel`` keeps for a clip of ``seconds`` (cut at the extractor's chunk_length)."""
    samples = min(math.ceil(seconds * audio.sampling_rate), audio.n_samples)
    return min(-(-samples // audio.hop_length), audio.n_samples // audio.hop_length)


@lru_cache(maxsize=512)
def largest_resize(max_pixels_in: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) of the largest resized frame any image of at most ``max_pixels_in`` pixels gives
    (``smart_resize``, aspect ratio at most MAX_ASPECT_RATIO); (0, 0) when no image is allowed.

    An input whose rounded sides give an area within [min_pixels, max_pixels] keeps them; for a rounded
    height of ``a`` factors, the shortest input height that rounds to it leaves the most room for the width,
    and then either the widest input is the largest, or (where that one is scaled down) the widest that still
    rounds to an area within max_pixels: a few candidates per ``a`` (and per boundary of the aspect-ratio
    limit) cover every input, in both orientations. Inputs scaled up to min_pixels are bounded apart.
    """
    if max_pixels_in < 1:
        return 0, 0
    best = (0, 0)
    tallest = math.isqrt(max_pixels_in * MAX_ASPECT_RATIO)
    shortest = max(1, math.isqrt(max_pixels_in // MAX_ASPECT_RATIO))
    heights = {1, shortest, shortest + 1, tallest, tallest + 1}
    for a in range(1, tallest // factor + 2):
        lowest = math.ceil((a - 0.5) * factor)
        heights.update((lowest - 1, lowest, lowest + 1))
    for height in heights:
        widest = min(max_pixels_in // max(height, 1), height * MAX_ASPECT_RATIO)
        if height < 1 or widest < 1 or height > widest * MAX_ASPECT_RATIO:
            continue
        kept = _widest_rounding_to(max_pixels // max(round(height / factor) * factor, factor) // factor, factor)
        for width in {widest, min(widest, kept)}:
            if width >= 1 and height <= width * MAX_ASPECT_RATIO:
                h_bar, w_bar = smart_resize(height, width, factor, min_pixels, max_pixels)
                if h_bar * w_bar > best[0] * best[1]:
                    best = (h_bar, w_bar)
    up = _largest_scale_up(factor, min_pixels, max_pixels)
    return up if up[0] * up[1] > best[0] * best[1] else best


def _widest_rounding_to(sides: int, factor: int) -> int:
    """The widest input side that ``smart_resize`` rounds to ``sides`` factors (round half to even)."""
    width = sides * factor + factor // 2
    while round(width / factor) > sides:
        width -= 1
    return width


def _largest_scale_up(factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """A bound on what ``smart_resize``'s scale-up branch (an input rounding below min_pixels) gives within
    max_pixels (above it, the input is scaled down, which ``largest_resize``'s candidates cover, or keeps the
    scale-up where that is smaller, below what they cover).

    Scaled up, an input of aspect ratio r = h/w comes out as ceil(sqrt(min r)/f) by ceil(sqrt(min/r)/f)
    factors, whatever its size; a height of ``a`` factors is widest at the least r that still rounds to it,
    just above ((a-1) f)^2 / min, where the width is min / ((a-1) f^2) factors rounded up, plus one where
    floating point lands a side exactly on a multiple (19 x 2432 at 28 and 100,352: 2 x 129 factors, not 1 x 129).
    """
    widest = math.isqrt(min_pixels * MAX_ASPECT_RATIO // factor ** 2) + 1  # the aspect-ratio limit, likewise
    best = (0, 0)
    for a in range(1, widest + 1):
        b = min(widest, min_pixels // ((a - 1) * factor ** 2) + 1 if a > 1 else widest,
                max_pixels // (a * factor ** 2))  # narrower inputs of the same height still fit
        if a * b > best[0] * best[1] // factor ** 2:
            best = (a * factor, b * factor)
    return best


def fit_limits(limits: MediaLimits, media: MediaProcessing, budget: int, fixed: frozenset[str]) -> tuple[MediaLimits, list[str]]:
    """``limits`` with the size limits not in ``fixed`` lowered until a request at the limits fits ``budget``
    prompt tokens, and a note per lowered limit.

    Each kind the model takes (images, videos, audio) gets an equal share of the budget, a kind needing
    less leaving the rest to the others; a kind over its share has its size limit lowered (the largest
    image's tokens, the video's frames, the clip's seconds) to the largest value within it; videos whose
    frames the caller set have their frame size lowered instead (``max_image_tokens``, which caps a pair of frames
    as it caps an image). A kind that does not fit at all is turned off and the others share again. Counts are
    never changed. Lowering audio shortens a video's track too, so the shares are settled until nothing changes.
    """
    off: set[str] = set()
    while True:
        fitted = _fit(replace(limits, **{_SIZE_LIMIT[k]: 0 for k in off}), media, budget, fixed)
        demand = media_shapes(fitted, media).kind_tokens()
        gone = {k for k, name in _SIZE_LIMIT.items() if name not in fixed and not demand[k] and k not in off
                and media_shapes(limits, media).kind_tokens()[k]}
        if not gone:
            break
        off |= gone
    notes = [_fitted_note(name, getattr(fitted, name), getattr(limits, name), budget)
             for name in _SIZE_LIMIT.values() if getattr(fitted, name) != getattr(limits, name)]
    return fitted, notes


def _fit(limits: MediaLimits, media: MediaProcessing, budget: int, fixed: frozenset[str]) -> MediaLimits:
    for _ in range(3):
        demand = media_shapes(limits, media).kind_tokens()
        if sum(demand.values()) <= budget:
            break
        adjustable = {k for k, flag in _SIZE_LIMIT.items() if demand[k] and (flag not in fixed or (
            k == "videos" and "max_image_tokens" not in fixed))}
        shares = _shares({k: v for k, v in demand.items() if v}, adjustable, budget)
        for kind in sorted(adjustable, key=lambda k: demand[k]):
            if demand[kind] > shares[kind]:
                lower = _lower_frame_size if _SIZE_LIMIT[kind] in fixed else _LOWER[kind]
                limits = lower(limits, media, shares[kind])
    return limits


# Each kind's size limit: what fit_limits lowers.
_SIZE_LIMIT = {"images": "max_image_tokens", "videos": "max_video_frames", "audio": "max_audio_seconds"}


def _shares(demand: dict[str, int], adjustable: set[str], budget: int) -> dict[str, int]:
    """Water-filling: fixed kinds keep their demand; the adjustable ones split the rest equally, a kind under
    its share giving the difference to the others."""
    left = budget - sum(v for k, v in demand.items() if k not in adjustable)
    shares = {k: v for k, v in demand.items() if k not in adjustable}
    waiting = sorted(adjustable, key=lambda k: demand[k])
    while waiting:
        share = max(0, left) // len(waiting)
        kind = waiting.pop(0)
        shares[kind] = min(demand[kind], share)
        left -= shares[kind]
    return shares


def _largest(fits, high: float, step: float) -> float:
    """The largest multiple of ``step`` in [0, high] for which ``fits`` holds (monotone), or 0."""
    lo, hi = 0, int(high / step)
    if fits(hi * step):
        return hi * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * step) else (lo, mid)
    return lo * step


def _lower_images(limits: MediaLimits, media: MediaProcessing, share: int) -> MediaLimits:
    def fits(tokens: float) -> bool:
        grid = image_grid(replace(limits, max_image_tokens=int(tokens)), media.vision)
        return grid is None or limits.max_images * (grid[1] * grid[2] // media.vision.merge_size ** 2 + MARKERS) <= share

    return replace(limits, max_image_tokens=int(_largest(fits, limits.max_image_tokens, 1)))


def _lower_videos(limits: MediaLimits, media: MediaProcessing, share: int) -> MediaLimits:
    step = media.vision.temporal_patch_size

    def fits(frames: float) -> bool:
        return media_shapes(replace(limits, max_video_frames=int(frames)), media).kind_tokens()["videos"] <= share

    return replace(limits, max_video_frames=int(_largest(fits, limits.max_video_frames, step)))


def _lower_frame_size(limits: MediaLimits, media: MediaProcessing, share: int) -> MediaLimits:
    """Videos of a fixed frame count: their frames' size (``max_image_tokens``) lowered to fit ``share``."""
    def fits(tokens: float) -> bool:
        return media_shapes(replace(limits, max_image_tokens=int(tokens)), media).kind_tokens()["videos"] <= share

    return replace(limits, max_image_tokens=int(_largest(fits, limits.max_image_tokens, 1)))


def _lower_audio(limits: MediaLimits, media: MediaProcessing, share: int) -> MediaLimits:
    def fits(seconds: float) -> bool:
        return media_shapes(replace(limits, max_audio_seconds=seconds), media).kind_tokens()["audio"] <= share

    seconds = _largest(fits, limits.max_audio_seconds, AUDIO_SECONDS_STEP)
    return replace(limits, max_audio_seconds=round(seconds, 1))


_LOWER = {"images": _lower_images, "videos": _lower_videos, "audio": _lower_audio}


def _fitted_note(name: str, value: float, default: float, budget: int) -> str:
    off = {"max_video_frames": " (videos are off)", "max_image_tokens": " (images are off)",
           "max_audio_seconds": " (audio is off)"}[name] if value == 0 else ""
    return (f"{name} defaulted to {shown_number(value)}{off}, not {shown_number(default)}: a request with every kind "
            f"of media at its limit must fit max_model_len ({budget + 1} tokens, one left to generate); set "
            f"{LIMITS[name].flag} or --max-model-len to change")

