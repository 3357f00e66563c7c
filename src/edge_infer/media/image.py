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
from edge_infer.media.limits import MediaLimits, shown_number

if TYPE_CHECKING:
    from PIL import Image

# Decoders we accept; Pillow's rarer formats stay out of reach of untrusted bytes.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # JPEG also opens MPO (multi-picture JPEG)
MAX_ASPECT_RATIO = 200
# Each scan of a progressive JPEG is a pass over the whole image, and a scan can be 12 bytes: 200,000 of them
# in 2.4 MB held a media thread for 16 s. Encoders write about 10 (libjpeg's progressive script) to a few dozen.
MAX_JPEG_SCANS = 256
# Bytes per decoded pixel while an image becomes RGB: the decoded picture and its RGB copy (or its upright copy),
# 4 bytes a pixel each (Pillow keeps RGB in 4), and about one more for the strips being composited over white and
# the resize's intermediate rows. Measured with the patches (tests/media/test_media_image.py, 2048 x 2048): a
# transparent PNG 9.5, a rotated JPEG 9.3, a palette PNG 8.3 bytes a pixel. The plan sizes a decode by it
# (memory/encoder_sizing.py), and a JPEG's decode is held to it (_set_jpeg_scale).
IMAGE_DECODE_BYTES = 9
# libjpeg decodes a progressive (or multi-scan) JPEG through a buffer of the whole picture's DCT coefficients,
# 2 bytes each, at any output scale; Pillow's output beside it takes 4 bytes a pixel.
JPEG_COEFFICIENT_BYTES = 2
DECODED_PIXEL_BYTES = 4
# Rows of a transparent picture composited over white at a time (to_rgb).
COMPOSITE_ROWS = 64
# The reduced scales libjpeg decodes at directly (1/2, 1/4, 1/8 of each side).
JPEG_SCALES = (2, 4, 8)
JPEG_MAGIC = b"\xff\xd8\xff"  # start of image, then a marker
# A marker: 0xFF (any number: fill bytes), then neither 0x00 (a stuffed zero in entropy-coded data) nor 0xFF.
_JPEG_MARKER = re.compile(rb"\xff+([^\x00\xff])")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                 *, part: str = "image") -> tuple[int, int]:
    """The (height, width) Qwen's processors resize to: multiples of `factor`, area about [min, max] pixels (a
    very thin picture keeps a short side of one factor, above max_pixels).

    One departure: scaling a small picture up to min_pixels rounds both sides up, which can overshoot a
    max_pixels close to min_pixels (a thin 19x2432 frame becomes 56x3612, twice the max): such a picture is
    scaled down to max_pixels instead, where that is smaller. It matters only where --max-image-tokens lowers
    max_pixels near min_pixels; Qwen2.5's own ranges are wider than that rounding reaches.
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
            fitted = _scaled_within(height, width, factor, max_pixels)
            if fitted[0] * fitted[1] < h_bar * w_bar:  # not where a side at its one-factor floor makes it larger
                return fitted
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
    if kind in ("JPEG", "MPO"):
        scans, first = jpeg_scans(data)
        if scans > MAX_JPEG_SCANS:
            raise MediaError(f"{part}: the JPEG has {scans} scans, above the {MAX_JPEG_SCANS} edge-infer decodes (each "
                             "is a pass over the whole image; encoders write about 10); save it again as a baseline "
                             "JPEG or PNG")
        # libjpeg buffers the whole picture's coefficients when it is progressive, or its first scan leaves out
        # a component (jdinput.c)
        buffered = bool(image.info.get("progressive")) or 0 < first < len(image.layer)
        _set_jpeg_scale(image, buffered, limits, part)
    limits.check("max_image_pixels", image.size[0] * image.size[1], part=part, shown=f"{width}x{height} pixels")
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


def jpeg_scans(data: bytes) -> tuple[int, int]:
    """The scans of the file's first picture and the components its first scan codes, its markers found as
    libjpeg finds them: each segment skipped by its length (an EXIF thumbnail's scans, inside its APP1 segment,
    are not the picture's), then the next marker searched for past any junk, fill bytes, stuffed zeros and the
    entropy-coded data."""
    scans = first = 0
    at = 2  # past start of image
    while (found := _JPEG_MARKER.search(data, at)) is not None:
        marker, at = found[1][0], found.end()
        if marker == 0xD9:  # end of image
            break
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:  # restarts, TEM and a stray start: no length
            continue
        if marker == 0xDA:
            scans += 1
            first = first or (data[at + 2] if at + 2 < len(data) else 0)
        at += max(2, int.from_bytes(data[at:at + 2], "big"))  # libjpeg skips nothing for a bogus length
    return scans, first


def _set_jpeg_scale(image: "Image.Image", buffered: bool, limits: MediaLimits, part: str) -> None:
    """Have libjpeg decode at the largest of 1, 1/2, 1/4 and 1/8 of each side whose pixels are within the limit and
    whose decode is within the plan's IMAGE_DECODE_BYTES a pixel of it, where a ``buffered`` (progressive or
    multi-scan) JPEG adds its whole picture's coefficients at every scale.

    A 24- or 200-megapixel photo so costs a fraction of a whole decode, its pixels close to, not equal to, a
    whole decode's (transformers' processor would decode it whole); a progressive picture near the limit with
    unsubsampled colour (6 bytes a pixel of coefficients) is decoded at half its sides. A buffered file whose
    coefficients alone pass the budget is refused: a 4 KB file can declare 800 megapixels.
    """
    width, height = image.size
    if buffered and (not image.layer or min(min(h, v) for _, h, v, _ in image.layer) < 1):
        raise MediaError(f"{part}: the JPEG data is damaged (its frame header gives no sampling factors)")
    held = _jpeg_coefficient_bytes(image) if buffered else 0
    budget = IMAGE_DECODE_BYTES * limits.max_image_pixels
    for scale in (1, *JPEG_SCALES):
        pixels = -(-width // scale) * -(-height // scale)  # the size libjpeg gives: sides rounded up
        if pixels <= limits.max_image_pixels and held + DECODED_PIXEL_BYTES * pixels <= budget:
            if scale > 1:
                # Pillow picks the largest scale the requested size allows (min(width // w, height // h)): ask for
                # the sides rounded down, or an odd-sized photo gets the next smaller scale, or none.
                image.draft("RGB", (max(1, width // scale), max(1, height // scale)))
            return
    if held and pixels <= limits.max_image_pixels:  # within the limit at 1/8: its coefficients are what is over
        needs = held + DECODED_PIXEL_BYTES * pixels
        raise MediaError(f"{part}: a progressive or multi-scan JPEG of {width}x{height} pixels needs "
                         f"{needs / 2**20:,.1f} MiB to decode at any scale (libjpeg holds all its coefficients), above "
                         f"the {budget / 2**20:,.1f} MiB the limit of {shown_number(limits.max_image_pixels)} pixels "
                         "per image plans (--max-image-pixels); save it as a baseline JPEG or resize it, or raise "
                         "--max-image-pixels")


def _jpeg_coefficient_bytes(image: "Image.Image") -> int:
    """libjpeg's whole-picture coefficient buffer: per component, 8x8 blocks of its sampled size, rounded up to
    whole MCUs (``layer``: Pillow's (id, horizontal sampling, vertical sampling, table) per component)."""
    width, height = image.size
    h_max = max(h for _, h, _, _ in image.layer)
    v_max = max(v for _, _, v, _ in image.layer)
    blocks = 0
    for _, h, v, _ in image.layer:
        across = -(-width * h // (8 * h_max))
        down = -(-height * v // (8 * v_max))
        blocks += -(-across // h) * h * (-(-down // v) * v)
    return blocks * 64 * JPEG_COEFFICIENT_BYTES


def upright(image: "Image.Image") -> "Image.Image":
    """Phone photos: the pixels a viewer shows, the EXIF orientation applied. Pillow's exif_transpose also rewrites
    the EXIF, which fails on a malformed tag (an ASCII resolution, say); only the pixels matter here."""
    from PIL import Image

    method = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}.get(image.getexif().get(0x0112))
    return image if method is None else image.transpose(method)


def to_rgb(image: "Image.Image") -> "Image.Image":
    """RGB as the reference converts: transparent pixels over white (RGBA, LA, P with transparency); others convert,
    but 16-bit grey, which the reference clips to white, is scaled to 8 bits.

    The reference composites the whole picture at once, four RGBA copies of it beside the decoded one (20 bytes
    a pixel for a decoded RGBA); compositing is per pixel, so a strip of rows at a time gives its bits with the
    decoded picture and the RGB result alone in memory (what the plan sizes: IMAGE_DECODE_BYTES).
    """
    from PIL import Image

    width, height = image.size
    if image.mode.startswith("I;16"):  # 16-bit grey (a PNG depth map, a scan): Pillow's conversion clips at 255
        grey = Image.new("L", image.size)
        for top in range(0, height, COMPOSITE_ROWS):  # a strip at a time: no whole-picture copy beside the plan's
            box = (0, top, width, min(top + COMPOSITE_ROWS, height))
            grey.paste(Image.fromarray((np.array(image.crop(box)) >> 8).astype(np.uint8), "L"), box[:2])
        return grey.convert("RGB")
    keyed = image.info.get("transparency") is not None  # a palette's transparent entry, an RGB or L colour key
    if image.mode == "RGB" and not keyed:
        return image
    if "A" not in image.getbands() and not keyed:
        return image.convert("RGB")
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
