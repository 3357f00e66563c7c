"""Images into vision patches, as transformers' Qwen2VLImageProcessorPil computes them.

decode -> RGB (transparency over white) -> resize to the smart_resize grid (Pillow) ->
rescale and normalize -> patches. The pixel math is exact: each uint8 value maps through a
per-channel table computed with the reference's operations (x * rescale in float64, then
float32 (x - mean) / std), so no float64 image is ever built and the values are the reference's bits.
"""
from __future__ import annotations

import io
import math
import re
import struct
import warnings
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from edge_infer.errors import MediaError
from edge_infer.media.config import VisionProcessing
from edge_infer.media.features import VisionFeatures
from edge_infer.media.limits import MediaLimits

if TYPE_CHECKING:
    from PIL import Image

# Decoders we accept; Pillow's rarer formats stay out of reach of untrusted bytes.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # JPEG also opens MPO (multi-picture JPEG)
MAX_ASPECT_RATIO = 200
# Each scan of a progressive JPEG is a pass over the whole image, and a scan can be 12 bytes: 200,000 of them
# in 2.4 MB held a media thread for 16 s. Encoders write about 10 (libjpeg's progressive script) to a few
# dozen; start-of-scan markers are counted in the raw bytes (they cannot occur in entropy-coded data).
MAX_JPEG_SCANS = 256
# Rows of a transparent picture composited over white at a time (to_rgb).
COMPOSITE_ROWS = 64
# The reduced scales libjpeg decodes at directly (1/2, 1/4, 1/8 of each side).
JPEG_SCALES = (2, 4, 8)
JPEG_MAGIC = b"\xff\xd8\xff"  # start of image, then a marker


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 *, part: str = "image") -> tuple[int, int]:
    """The (height, width) Qwen's processors resize to: multiples of `factor`, area within [min, max] pixels.

    One departure: scaling a small picture up to min_pixels rounds both sides up, which can overshoot a
    max_pixels close to min_pixels (a thin 19x2432 frame becomes 56x3612, twice the max), where the reference
    would exceed the tokens the plan holds; such a picture is fitted within max_pixels instead. With a
    checkpoint's own range, far wider than that rounding, the result is always the reference's.
    """
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"{part}: {width}x{height} pixels has an aspect ratio above {MAX_ASPECT_RATIO}:1, which the "
                         "vision encoder does not take; crop or pad it")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        return _scaled_within(height, width, factor, max_pixels)
    if h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
        if h_bar * w_bar > max_pixels:
            return _scaled_within(height, width, factor, max_pixels)
    return h_bar, w_bar


def _scaled_within(height: int, width: int, factor: int, max_pixels: int) -> tuple[int, int]:
    """Sides scaled to ``max_pixels`` and rounded down to multiples of ``factor`` (at least one factor each)."""
    beta = math.sqrt(height * width / max_pixels)
    return (max(factor, math.floor(height / beta / factor) * factor),
            max(factor, math.floor(width / beta / factor) * factor))


def decode_image(data: bytes, limits: MediaLimits, *, part: str = "image") -> "Image.Image":
    """An RGB image from encoded bytes; sizes over the limit are refused from the header, before decoding (a JPEG is
    decoded at a reduced scale within it instead, where one fits)."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise MediaError(f"{part}: is empty (0 bytes); send a PNG, JPEG, WebP, GIF or BMP image")
    try:
        image = _open(data, limits, part)
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        # Pillow's "cannot identify image file <_io.BytesIO object at 0x...>" says less than this
        reason = "no known image format" if isinstance(exc, UnidentifiedImageError) else _reason(exc)
        raise MediaError(f"{part}: is not an image edge-infer decodes ({reason}); "
                         "send a PNG, JPEG, WebP, GIF or BMP image") from None
    width, height, kind = *image.size, image.format
    if width * height > limits.max_image_pixels and kind in ("JPEG", "MPO"):
        _decode_reduced(image, limits.max_image_pixels)
    limits.check("max_image_pixels", image.size[0] * image.size[1], part=part, shown=f"{width}x{height} pixels")
    if kind in ("JPEG", "MPO") and (scans := data.count(b"\xff\xda")) > MAX_JPEG_SCANS:
        raise MediaError(f"{part}: the JPEG has {scans} scans, above the {MAX_JPEG_SCANS} edge-infer decodes (each is "
                         "a pass over the whole image; encoders write about 10); save it again as a baseline JPEG or PNG")
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb guard: a warning over its threshold; here any such image is an error.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
            image = upright(image)
            return to_rgb(image)
    except (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as exc:
        raise MediaError(f"{part}: the {kind} data is damaged or truncated ({_reason(exc)})") from None


def _open(data: bytes, limits: MediaLimits, part: str) -> "Image.Image":
    """The image's header, read by Pillow past its decompression-bomb guard where our decode limit decides."""
    from PIL import Image, JpegImagePlugin

    try:
        with warnings.catch_warnings():  # Pillow's warning over its threshold: our limit decides
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)  # reads the header only
    except Image.DecompressionBombError as exc:  # Pillow's own guard (179 megapixels) checks at open
        if data.startswith(JPEG_MAGIC):
            # A 200-megapixel phone photo is decoded at a reduced scale within our limit, or refused by it; Pillow
            # opens a JPEG without its guard when asked for the format's own class.
            return JpegImagePlugin.JpegImageFile(io.BytesIO(data))
        # its message carries the header's pixel count: "Image size (1200000000 pixels) exceeds limit of ..."
        found = re.search(r"\((\d+) pixels\)", str(exc))
        bomb = 2 * Image.MAX_IMAGE_PIXELS
        pixels, shown = (int(found[1]), f"{int(found[1]):,} pixels") if found else (bomb + 1, f"more than {bomb} pixels")
        limits.check("max_image_pixels", pixels, part=part, shown=shown)
        raise MediaError(f"{part}: {shown} is more than Pillow decodes safely; resize it") from None


def _decode_reduced(image: "Image.Image", max_pixels: int) -> None:
    """A JPEG above the decode limit (a 24-megapixel photo): have libjpeg decode it at 1/2, 1/4 or 1/8 scale, the
    largest that fits, which costs a fraction of a whole decode. Its pixels then differ a little from a whole
    decode's (transformers' processor would decode it whole); pictures within the limit are decoded whole."""
    width, height = image.size
    for scale in JPEG_SCALES:
        if -(-width // scale) * -(-height // scale) <= max_pixels:  # the size libjpeg gives: sides rounded up
            # Pillow picks the largest scale the requested size allows (min(width // w, height // h)): ask for the
            # sides rounded down, or an odd-sized photo gets the next smaller scale, or none.
            image.draft("RGB", (max(1, width // scale), max(1, height // scale)))
            return


def upright(image: "Image.Image") -> "Image.Image":
    """Phone photos: the pixels a viewer shows, the EXIF orientation applied. Pillow's exif_transpose also rewrites
    the EXIF, which fails on a malformed tag (an ASCII resolution, say); only the pixels matter here."""
    from PIL import Image

    method = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}.get(image.getexif().get(0x0112))
    return image if method is None else image.transpose(method)


def to_rgb(image: "Image.Image") -> "Image.Image":
    """RGB as the reference converts: transparent pixels over white (RGBA, LA, P with transparency); others convert.

    The reference composites the whole picture at once, four RGBA copies of it beside the decoded one (20 bytes
    a pixel for a decoded RGBA); compositing is per pixel, so a strip of rows at a time gives its bits with the
    decoded picture and the RGB result alone in memory (what the plan sizes: encoder_sizing.IMAGE_DECODE_BYTES).
    """
    from PIL import Image

    keyed = image.info.get("transparency") is not None  # a palette's transparent entry, an RGB or L colour key
    if image.mode == "RGB" and not keyed:
        return image
    if "A" not in image.getbands() and not keyed:
        return image.convert("RGB")
    width, height = image.size
    out = Image.new("RGB", image.size)
    for top in range(0, height, COMPOSITE_ROWS):
        box = (0, top, width, min(top + COMPOSITE_ROWS, height))
        rgba = image.crop(box).convert("RGBA")  # the crop keeps a palette's transparency index
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        out.paste(Image.alpha_composite(white, rgba).convert("RGB"), box[:2])
    return out


def image_features(image: "Image.Image", cfg: VisionProcessing, *, part: str = "image") -> VisionFeatures:
    """One image's patches, equal to Qwen2VLImageProcessorPil's pixel_values and image_grid_thw."""
    height, width = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels, part=part)
    frame = resized_frame(to_rgb(image), height, width, cfg)
    return VisionFeatures(patchify(frame[None], cfg), grid_thw(1, height, width, cfg), cfg.merge_size)


def resized_frame(rgb: "Image.Image", height: int, width: int, cfg: VisionProcessing) -> np.ndarray:
    """uint8 [height, width, 3]: `rgb` resized with the processor's filter."""
    return np.asarray(rgb.resize((width, height), resample=cfg.resample), dtype=np.uint8)


def grid_thw(frames: int, height: int, width: int, cfg: VisionProcessing) -> tuple[int, int, int]:
    return -(-frames // cfg.temporal_patch_size), height // cfg.patch_size, width // cfg.patch_size


def patchify(frames: np.ndarray, cfg: VisionProcessing) -> np.ndarray:
    """uint8 frames [T, H, W, 3] -> normalized float32 patches in the processor's order.

    Rows run over (t, merge-window row, merge-window column, row in window, column in window); each row is
    (channel, frame in temporal patch, y, x). T is padded to a multiple of temporal_patch_size by repeating
    the last frame (an image is its own temporal pair).
    """
    t, height, width, channels = frames.shape
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if pad := -t % tp:
        frames = np.concatenate([frames, np.broadcast_to(frames[-1:], (pad, height, width, channels))])
    gt, gh, gw = grid_thw(t, height, width, cfg)
    blocks = frames.reshape(gt, tp, gh // m, m, p, gw // m, m, p, channels)
    # -> (gt, window row, window column, row in window, column in window, channel, frame, y, x)
    blocks = blocks.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7).reshape(gt * gh * gw, channels, tp * p * p)
    table = _normalize_table(cfg.rescale_factor, cfg.image_mean, cfg.image_std)
    out = np.empty(blocks.shape, dtype=np.float32)
    for c in range(channels):
        np.take(table[c], blocks[:, c], out=out[:, c])
    return out.reshape(gt * gh * gw, channels * tp * p * p)


@lru_cache(maxsize=8)
def _normalize_table(rescale: float, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """float32 [3, 256]: each uint8 value rescaled (float64, then float32) and normalized in float32."""
    scaled = (np.arange(256, dtype=np.float64) * rescale).astype(np.float32)
    mean32 = np.asarray(mean, dtype=np.float32)[:, None]
    std32 = np.asarray(std, dtype=np.float32)[:, None]
    return (scaled[None, :] - mean32) / std32


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
