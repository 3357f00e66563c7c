"""How a checkpoint preprocesses its media, read from the processor files it ships.

Qwen2.5-VL and Qwen2.5-Omni checkpoints ship ``preprocessor_config.json``: the
Qwen2VLImageProcessor keys, and for Omni the WhisperFeatureExtractor keys in the
same flat object. Checkpoints saved by newer transformers may add
``video_preprocessor_config.json`` (the Qwen2VLVideoProcessor keys) or a
``processor_config.json`` holding each part as a nested object. Every key is
either used, checked to hold the one value we implement, or known not to change
the output; anything else is refused with the key and the file named, so a
checkpoint never gets preprocessing silently different from its reference.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from edge_infer.errors import CheckpointError

PREPROCESSOR_FILE = "preprocessor_config.json"
VIDEO_PREPROCESSOR_FILE = "video_preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

IMAGE_PROCESSORS = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil")
VIDEO_PROCESSORS = ("Qwen2VLVideoProcessor",)
FEATURE_EXTRACTORS = ("WhisperFeatureExtractor",)
PIL_FILTERS = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}

# Keys that do not change what the processors compute (bookkeeping, output containers, devices).
_INERT = frozenset({
    "processor_class", "auto_map", "default_to_square", "data_format", "input_data_format", "device",
    "return_tensors", "crop_size", "pad_size", "disable_grouping", "return_metadata", "video_metadata",
    "do_sample_frames", "max_video_tokens", "return_attention_mask",
})


@dataclass(frozen=True)
class VisionProcessing:
    """Qwen2VLImageProcessor's settings (defaults = its class defaults), plus how videos are sampled."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL's BICUBIC
    # Videos: qwen-vl-utils' sampling defaults and the Omni processor's frame-size range.
    video_fps: float = 2.0
    video_min_frames: int = 4
    video_max_frames: int = 768
    video_min_pixels: int = 128 * 28 * 28
    video_max_pixels: int = 768 * 28 * 28

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merge window of patches."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class AudioProcessing:
    """WhisperFeatureExtractor's settings (the Omni checkpoint's chunk_length is 300)."""

    sampling_rate: int = 16000
    feature_size: int = 128
    n_fft: int = 400
    hop_length: int = 160
    chunk_length: int = 30

    @property
    def n_samples(self) -> int:
        """Samples the extractor keeps; longer clips are cut here."""
        return self.chunk_length * self.sampling_rate


@dataclass(frozen=True)
class MediaProcessing:
    """A checkpoint's media preprocessing; a part the checkpoint does not take is None."""

    vision: VisionProcessing | None = None
    audio: AudioProcessing | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "MediaProcessing":
        """Read the processor files in `model_dir`; a text-only checkpoint (none of them) gives no media."""
        sections: dict[str, list[_Keys]] = {"image": [], "audio": [], "video": []}
        for path in (Path(model_dir) / name for name in (PREPROCESSOR_FILE, VIDEO_PREPROCESSOR_FILE, PROCESSOR_FILE)):
            if path.is_file():
                for kind, keys in _sections(path, _read(path)):
                    sections[kind].append(keys)
        image = _one(sections["image"], _image)
        video = sections["video"]
        if video and image is None:
            raise CheckpointError(f"{video[0].where} configures videos but no file configures images "
                                  f"(an image processor in {PREPROCESSOR_FILE}); restore it from the original checkpoint")
        media = cls(vision=_one(video, lambda keys: _video(keys, image)) if video else image,
                    audio=_one(sections["audio"], _audio))
        # Checked once every part has read its keys: Omni's flat file holds the image's and the audio's.
        for keys in {id(k): k for found in sections.values() for k in found}.values():
            keys.check_known()
        return media


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); restore the file from the original checkpoint") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object; restore the file from the original checkpoint")
    return data


def _sections(path: Path, data: dict[str, Any]) -> list[tuple[str, "_Keys"]]:
    """The parts one file configures. Flat files hold whole parts; processor_config.json nests them."""
    where = str(path)
    if path.name == PROCESSOR_FILE:
        nested = {"image": "image_processor", "audio": "feature_extractor", "video": "video_processor"}
        found = []
        for kind, key in nested.items():
            if isinstance(data.get(key), dict):
                found.append((kind, _Keys(data[key], f"{where} ({key})")))
        return found  # its other keys configure the tokenizer and the prompt layout, not preprocessing
    keys = _Keys(data, where)
    if path.name == VIDEO_PREPROCESSOR_FILE:
        return [("video", keys)]
    found = []
    if "image_processor_type" in data:
        found.append(("image", keys))
    if "feature_extractor_type" in data:
        found.append(("audio", keys))
    if not found:
        raise CheckpointError(f"{where} names neither an image_processor_type nor a feature_extractor_type; "
                              "edge-infer reads Qwen2VLImageProcessor and WhisperFeatureExtractor settings")
    return found


def _one(found: list["_Keys"], parse):
    """Parse each file's copy of a part; copies in two files must agree."""
    parsed = [(keys.where, parse(keys)) for keys in found]
    for where, value in parsed[1:]:
        if value != parsed[0][1]:
            differ = [f.name for f in fields(value) if getattr(value, f.name) != getattr(parsed[0][1], f.name)]
            raise CheckpointError(f"{parsed[0][0]} and {where} disagree on {', '.join(differ)}; "
                                  "keep one of them (as in the original checkpoint)")
    return parsed[0][1] if parsed else None


class _Keys:
    """Typed reads of one processor object; errors name the key and the file; it remembers what it read."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where
        self.used: set[str] = set()

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, kind: type, default: Any) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        if value is None:
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
            self.fail(key, f"must be {kind.__name__}, got {value!r}")
        return value

    def positive(self, key: str, kind: type, default: Any) -> Any:
        value = self.get(key, kind, default)
        if value is not None and value <= 0:
            self.fail(key, f"must be > 0, got {value!r}")
        return value

    def only(self, key: str, value: Any, meaning: str) -> None:
        """A setting edge-infer implements one way: absent, or `value`."""
        got = self.get(key, type(value), value)
        if got != value:
            self.fail(key, f"is {got!r}; edge-infer supports only {value!r} ({meaning})")

    def fail(self, key: str, problem: str) -> None:
        raise CheckpointError(f"{self.where}: {key!r} {problem}")

    def check_known(self) -> None:
        unknown = sorted(set(self.data) - self.used - _INERT)
        if unknown:
            self.fail(unknown[0], "is not a key edge-infer knows; it may change preprocessing in ways edge-infer "
                                  "does not implement (remove it only if the reference ignores it)")


def _type(keys: _Keys, key: str, allowed: tuple[str, ...]) -> None:
    name = keys.get(key, str, None)
    if name not in allowed:
        keys.fail(key, f"is {name!r}; edge-infer implements only {', '.join(allowed)}")


def _pixel_range(keys: _Keys, default_min: int, default_max: int) -> tuple[int, int]:
    """min/max pixels from min_pixels/max_pixels and the size object (both spellings transformers has saved)."""
    size = keys.get("size", dict, {})
    aliases = {"shortest_edge": "min_pixels", "longest_edge": "max_pixels", "min_pixels": "min_pixels",
               "max_pixels": "max_pixels"}
    for name in size:
        if name not in aliases:
            keys.fail("size", f"has {name!r}; edge-infer resizes by a pixel range (shortest_edge/longest_edge)")
    bounds = {}
    for bound, default in (("min_pixels", default_min), ("max_pixels", default_max)):
        given = {keys.positive(bound, int, None)} - {None}
        given |= {v for k, v in size.items() if aliases[k] == bound}
        for v in given:
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                keys.fail("size", f"{bound} must be a positive integer, got {v!r}")
        if len(given) > 1:
            keys.fail(bound, f"contradicts size: {sorted(given)}; keep one value")
        bounds[bound] = given.pop() if given else default
    if bounds["min_pixels"] > bounds["max_pixels"]:
        keys.fail("min_pixels", f"{bounds['min_pixels']} is above max_pixels {bounds['max_pixels']}")
    return bounds["min_pixels"], bounds["max_pixels"]


def _triple(keys: _Keys, key: str, default: tuple[float, float, float], positive: bool = False):
    """Per-channel numbers; one number stands for all three channels, as transformers reads it."""
    keys.used.add(key)
    value = keys.data.get(key)
    value = default if value is None else value
    value = (value,) * 3 if isinstance(value, (int, float)) else value
    if (not isinstance(value, (list, tuple)) or len(value) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        keys.fail(key, f"must be 3 numbers (R, G, B), got {value!r}")
    if positive and min(value) <= 0:
        keys.fail(key, f"must be > 0, got {value!r}")
    return tuple(float(v) for v in value)


def _pixels(keys: _Keys, base: VisionProcessing) -> dict[str, Any]:
    """The per-frame pixel pipeline keys the image and the video processor share."""
    for key, meaning in (("do_resize", "frames resized to the patch grid"), ("do_rescale", "pixels scaled"),
                         ("do_normalize", "pixels normalized"), ("do_convert_rgb", "RGB input")):
        keys.only(key, True, meaning)
    keys.only("do_center_crop", False, "no cropping")
    keys.only("do_pad", False, "no padding")
    resample = keys.get("resample", int, base.resample)
    if resample not in PIL_FILTERS:
        keys.fail("resample", f"is {resample}; Pillow's filters are {PIL_FILTERS}")
    return dict(
        patch_size=keys.positive("patch_size", int, base.patch_size),
        temporal_patch_size=keys.positive("temporal_patch_size", int, base.temporal_patch_size),
        merge_size=keys.positive("merge_size", int, base.merge_size),
        image_mean=_triple(keys, "image_mean", base.image_mean),
        image_std=_triple(keys, "image_std", base.image_std, positive=True),
        rescale_factor=keys.positive("rescale_factor", float, base.rescale_factor),
        resample=resample,
    )


def _image(keys: _Keys) -> VisionProcessing:
    _type(keys, "image_processor_type", IMAGE_PROCESSORS)
    base = VisionProcessing()
    shared = _pixels(keys, base)
    min_pixels, max_pixels = _pixel_range(keys, base.min_pixels, base.max_pixels)
    return VisionProcessing(**shared, min_pixels=min_pixels, max_pixels=max_pixels)


def _video(keys: _Keys, image: VisionProcessing) -> VisionProcessing:
    """The video part: its frame sampling and frame sizes; its pixel pipeline must be the image part's."""
    _type(keys, "video_processor_type", VIDEO_PROCESSORS)
    shared = _pixels(keys, image)
    for name, value in shared.items():
        if value != getattr(image, name):
            keys.fail(name, f"is {value!r} but the image processor's is {getattr(image, name)!r}; "
                            "edge-infer runs one vision pipeline for images and video frames")
    if keys.has("num_frames"):
        keys.fail("num_frames", "is set; edge-infer samples videos by fps (set fps instead)")
    keys.used.add("num_frames")
    keys.only("cap_pixels_per_frame", False, "per-frame pixels bounded by min_pixels/max_pixels only")
    min_pixels, max_pixels = _pixel_range(keys, image.video_min_pixels, image.video_max_pixels)
    fps = keys.positive("fps", float, image.video_fps)
    min_frames = keys.positive("min_frames", int, image.video_min_frames)
    max_frames = keys.positive("max_frames", int, image.video_max_frames)
    if min_frames > max_frames:
        keys.fail("min_frames", f"{min_frames} is above max_frames {max_frames}")
    return VisionProcessing(**{f.name: getattr(image, f.name) for f in fields(image)} | dict(
        video_fps=fps, video_min_frames=min_frames, video_max_frames=max_frames,
        video_min_pixels=min_pixels, video_max_pixels=max_pixels))


def _audio(keys: _Keys) -> AudioProcessing:
    _type(keys, "feature_extractor_type", FEATURE_EXTRACTORS)
    base = AudioProcessing()
    cfg = AudioProcessing(
        sampling_rate=keys.positive("sampling_rate", int, base.sampling_rate),
        feature_size=keys.positive("feature_size", int, base.feature_size),
        n_fft=keys.positive("n_fft", int, base.n_fft),
        hop_length=keys.positive("hop_length", int, base.hop_length),
        chunk_length=keys.positive("chunk_length", int, base.chunk_length),
    )
    if cfg.hop_length > cfg.n_fft:
        keys.fail("hop_length", f"{cfg.hop_length} is above n_fft {cfg.n_fft}; frames would skip samples")
    for key, derived in (("n_samples", cfg.n_samples), ("nb_max_frames", cfg.n_samples // cfg.hop_length)):
        given = keys.get(key, int, derived)
        if given != derived:
            keys.fail(key, f"is {given} but chunk_length, sampling_rate and hop_length give {derived}")
    keys.only("padding_value", 0.0, "silence pads the clip")
    keys.only("padding_side", "right", "the clip starts at frame 0")
    keys.only("dither", 0.0, "no random noise, so features are reproducible")
    return cfg
