"""Images: equal to transformers' Qwen2VLImageProcessorPil, and every refusal names the image and the fix."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference_smart_resize

from edge_infer.errors import MediaError
from edge_infer.media.config import MediaProcessing, VisionProcessing
from edge_infer.media.image import decode_image, image_features, smart_resize
from edge_infer.media.limits import MediaLimits


def _reference(image: Image.Image, processor: Qwen2VLImageProcessorPil | None = None) -> tuple[np.ndarray, tuple]:
    out = (processor or Qwen2VLImageProcessorPil())(images=image, return_tensors="np")
    return out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])


def _noise(width: int, height: int, mode: str, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    bands = {"RGB": 3, "RGBA": 4, "CMYK": 4, "LA": 2}.get(mode, 1)
    pixels = rng.integers(0, 256, size=(height, width, bands), dtype=np.uint8)
    if mode in ("L", "P"):
        return Image.fromarray(pixels[..., 0], mode="L").convert(mode)
    if mode == "LA":
        return Image.fromarray(np.concatenate([pixels, pixels[..., :1]], axis=-1)[..., :2].copy(), mode="LA")
    return Image.fromarray(pixels, mode=mode)


def _encoded(image: Image.Image, fmt: str, **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save)
    return buf.getvalue()


@pytest.mark.parametrize("width,height,mode", [
    (101, 77, "RGB"),  # odd sides
    (3, 5, "RGB"),  # tiny: scaled up to min_pixels
    (1500, 1100, "RGB"),  # above max_pixels: scaled down
    (300, 40, "RGB"),  # far from square
    (224, 224, "RGB"),  # already on the grid
    (90, 61, "RGBA"),  # transparency over white
    (64, 50, "LA"),
    (80, 45, "L"),  # greyscale
    (57, 91, "P"),  # palette
    (40, 33, "CMYK"),
])
def test_image_features_equal_the_pil_processor(width, height, mode):
    image = _noise(width, height, mode)
    expected, grid = _reference(image)
    got = image_features(image, VisionProcessing())
    assert got.grid_thw == grid
    assert got.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(got.pixel_values, expected)  # bit for bit
    assert got.num_tokens == grid[0] * grid[1] * grid[2] // 4


def test_palette_transparency_is_composited_like_the_processor():
    image = _noise(30, 20, "P")
    image.info["transparency"] = 7
    expected, _ = _reference(image)
    np.testing.assert_array_equal(image_features(image, VisionProcessing()).pixel_values, expected)


@pytest.mark.parametrize("mode,key", [("RGB", (12, 200, 7)), ("L", 9), ("LA", None), ("RGBA", None)])
def test_colour_keys_and_alpha_are_composited_like_the_processor_strip_by_strip(mode, key):
    """An RGB or greyscale PNG's colour key (tRNS) and an alpha band go over white as the processor composites them,
    bit for bit, though edge-infer composites 64 rows at a time (a picture of several strips)."""
    image = _noise(97, 203, mode)
    if key is not None:
        pixels = np.asarray(image).copy()
        pixels[::3] = key  # every third row is the transparent colour
        image = Image.fromarray(pixels, mode)
    decoded = decode_image(_encoded(image, "PNG", **({"transparency": key} if key is not None else {})), MediaLimits())
    reference = Image.open(io.BytesIO(_encoded(image, "PNG", **({"transparency": key} if key is not None else {}))))
    expected, grid = _reference(reference)
    got = image_features(decoded, VisionProcessing())
    assert got.grid_thw == grid
    np.testing.assert_array_equal(got.pixel_values, expected)


def test_a_16_bit_grey_png_keeps_its_shades():
    """Pillow converts 16-bit grey to RGB by clipping at 255 (a ramp came out 98.75% white, as the processor's own
    loading gives it); edge-infer keeps each value's top byte, a strip of rows at a time, and is the processor's
    for that 8-bit picture."""
    ramp = (np.arange(150 * 80).reshape(150, 80) * 13 % 65536).astype(np.uint16)  # several strips of rows
    decoded = decode_image(_encoded(Image.fromarray(ramp), "PNG"), MediaLimits())
    assert decoded.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(decoded), np.repeat((ramp >> 8).astype(np.uint8)[..., None], 3, axis=2))
    expected, _ = _reference(Image.fromarray((ramp >> 8).astype(np.uint8), "L"))
    np.testing.assert_array_equal(image_features(decoded, VisionProcessing()).pixel_values, expected)


def test_checkpoint_settings_reach_the_pixels(tmp_path):
    """Non-default settings, read from the processor's own saved file, give the processor's output."""
    processor = Qwen2VLImageProcessorPil(min_pixels=20 * 20, max_pixels=21 * 21 * 9, patch_size=7, merge_size=3,
                                         temporal_patch_size=3, image_mean=[0.1, 0.2, 0.3], image_std=[0.5, 0.25, 0.2])
    processor.to_json_file(tmp_path / "preprocessor_config.json")
    cfg = MediaProcessing.from_dir(tmp_path).vision
    for size in ((131, 95), (9, 12), (40, 400)):
        image = _noise(*size, "RGB", seed=size[0])
        expected, grid = _reference(image, processor)
        got = image_features(image, cfg)
        assert got.grid_thw == grid and got.merge_size == 3
        np.testing.assert_array_equal(got.pixel_values, expected)


@pytest.mark.parametrize("tokens", [5, 64, 300])
def test_a_token_limit_scales_pictures_down_as_the_processors_max_pixels_does(tokens):
    """--max-image-tokens: the processor run with max_pixels of that many tokens (and never below its min_pixels),
    bit for bit; a picture within it is not touched."""
    cfg = VisionProcessing(max_pixels=12845056)
    capped = MediaLimits(max_image_tokens=tokens).vision_processing(cfg)
    reference = Qwen2VLImageProcessorPil(min_pixels=cfg.min_pixels, max_pixels=max(cfg.min_pixels, tokens * 28 * 28))
    for size in ((1500, 1100), (97, 203), (20, 20)):
        image = _noise(*size, "RGB", seed=size[0])
        expected, grid = _reference(image, reference)
        got = image_features(image, capped)
        assert got.grid_thw == grid and got.num_tokens <= max(tokens, 4)
        np.testing.assert_array_equal(got.pixel_values, expected)
    small = _noise(56, 84, "RGB")
    if tokens >= 6:  # within the limit: as the checkpoint's own processor resizes it
        assert image_features(small, capped).grid_thw == image_features(small, cfg).grid_thw == (1, 6, 4)


def test_smart_resize_equals_the_reference_everywhere():
    rng = np.random.default_rng(1)
    sizes = [(1, 1), (1, 200), (27, 29), (28, 28), (56, 56), (4000, 3000), (10000, 51)]
    sizes += [tuple(int(v) for v in rng.integers(1, 5000, size=2)) for _ in range(500)]
    for h, w in sizes:
        if max(h, w) / min(h, w) > 200:
            continue
        for factor, lo, hi in ((28, 56 * 56, 28 * 28 * 1280), (28, 3136, 12845056), (14, 100, 5000)):
            assert smart_resize(h, w, factor, lo, hi) == reference_smart_resize(h, w, factor, lo, hi), (h, w, factor)


def test_a_small_picture_scaled_up_past_a_lowered_max_is_fitted_within_it():
    """At a max_pixels lowered near min_pixels (the video range at a few hundred tokens), scaling a thin frame up
    rounds it to twice the max in the reference; here it stays within the max the plan holds."""
    video_min = 128 * 28 * 28
    assert reference_smart_resize(19, 2432, 28, video_min, video_min) == (56, 3612)
    h, w = smart_resize(19, 2432, 28, video_min, video_min)
    assert h * w <= video_min and h % 28 == w % 28 == 0 and w / h == pytest.approx(2432 / 19, rel=0.2)
    assert smart_resize(19, 2432, 28, video_min, 768 * 28 * 28) == (56, 3612)  # the checkpoint's range: as the reference


def test_extreme_aspect_ratio_is_refused_naming_the_image():
    with pytest.raises(ValueError):
        reference_smart_resize(1, 300, 28, 3136, 1003520)
    with pytest.raises(MediaError, match=r"image 3: 300x1 pixels has an aspect ratio above 200:1.*crop or pad it"):
        smart_resize(1, 300, 28, 3136, 1003520, part="image 3")
    with pytest.raises(MediaError, match=r"image: 1x250 pixels has an aspect ratio above 200:1"):
        image_features(Image.new("RGB", (1, 250)), VisionProcessing())


@pytest.mark.parametrize("fmt,save", [("PNG", {}), ("JPEG", {"quality": 90}), ("WEBP", {"lossless": True}),
                                      ("GIF", {}), ("BMP", {}), ("TIFF", {})])
def test_decoded_files_give_the_processors_features(fmt, save):
    image = _noise(75, 52, "RGB" if fmt != "GIF" else "P")
    data = _encoded(image, fmt, **save)
    decoded = decode_image(data, MediaLimits())
    assert decoded.mode == "RGB" and decoded.size == (75, 52)
    expected, _ = _reference(Image.open(io.BytesIO(data)))
    np.testing.assert_array_equal(image_features(decoded, VisionProcessing()).pixel_values, expected)


def test_transparent_png_is_decoded_over_white():
    image = _noise(40, 30, "RGBA")
    decoded = decode_image(_encoded(image, "PNG"), MediaLimits())
    np.testing.assert_array_equal(image_features(decoded, VisionProcessing()).pixel_values, _reference(image)[0])
    clear = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert decode_image(_encoded(clear, "PNG"), MediaLimits()).getpixel((0, 0)) == (255, 255, 255)


def test_exif_orientation_is_applied():
    image = _noise(60, 20, "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the viewer turns it 90 degrees clockwise
    decoded = decode_image(_encoded(image, "JPEG", exif=exif, quality=95), MediaLimits())
    assert decoded.size == (20, 60)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_gives_the_pixels_pillows_transpose_gives(orientation):
    from PIL import ImageOps

    image = _noise(30, 20, "RGB", seed=orientation)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encoded(image, "PNG", exif=exif)
    want = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert np.array_equal(np.asarray(decode_image(data, MediaLimits())), np.asarray(want))


def test_a_malformed_exif_tag_does_not_stop_the_image():
    """XResolution stored as ASCII: Pillow's exif_transpose raised TypeError rewriting it (a 500)."""
    entries = [struct.pack("<HHI4s", 0x0112, 3, 1, struct.pack("<HH", 6, 0)),
               struct.pack("<HHI4s", 0x011A, 2, 3, b"72\0\0")]
    ifd = struct.pack("<H", len(entries)) + b"".join(entries) + struct.pack("<I", 0)
    data = _encoded(_noise(40, 30, "RGB"), "JPEG", exif=b"Exif\0\0II*\0" + struct.pack("<I", 8) + ifd)
    assert decode_image(data, MediaLimits()).size == (30, 40)  # and still turned upright


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height; its pixel data is a few bytes (a decompression bomb's shape)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_oversized_image_is_refused_from_its_header():
    with pytest.raises(MediaError) as err:
        decode_image(_png_header_only(5000, 4000), MediaLimits(), part="image 2")
    assert str(err.value) == ("image 2: 5000x4000 pixels is above the limit of 12,845,056 pixels per image "
                              "(--max-image-pixels); resize it or raise --max-image-pixels")
    # Past Pillow's own decompression-bomb guard, which checks before we can: still our limit and lever.
    with pytest.raises(MediaError) as err:
        decode_image(_png_header_only(40000, 30000), MediaLimits(), part="image 2")
    assert str(err.value) == ("image 2: 1,200,000,000 pixels is above the limit of 12,845,056 pixels per image "
                              "(--max-image-pixels); resize it or raise --max-image-pixels")
    # With the limit raised past Pillow's guard, the guard's refusal still names the size.
    with pytest.raises(MediaError, match=r"^image 2: 1,200,000,000 pixels is more than Pillow decodes safely; resize it$"):
        decode_image(_png_header_only(40000, 30000), MediaLimits(max_image_pixels=2_000_000_000), part="image 2")
    with pytest.raises(MediaError, match=r"image: 20x20 pixels is above the limit of 100 pixels per image"):
        decode_image(_encoded(_noise(20, 20, "RGB"), "PNG"), MediaLimits(max_image_pixels=100))


def _photo() -> Image.Image:
    """A 1600 x 1200 picture with smooth gradients, as JPEG compresses a photo's."""
    y, x = np.mgrid[0:1200, 0:1600]
    return Image.fromarray(np.stack([x * 255 // 1600, y * 255 // 1200, (x + y) % 256], -1).astype(np.uint8))


def test_a_jpeg_above_the_limit_is_decoded_at_the_largest_reduced_scale_within_it():
    """A photo above --max-image-pixels in JPEG: libjpeg decodes it at 1/2, 1/4 or 1/8 of each side, the largest
    that fits, close to the whole picture scaled; other formats, and a JPEG no scale brings within it, are refused."""
    picture = _photo()
    jpeg = _encoded(picture, "JPEG", quality=95)
    for limit, size in ((1600 * 1200, (1600, 1200)), (800 * 600, (800, 600)), (799 * 600, (400, 300)),
                        (200 * 150, (200, 150))):
        decoded = decode_image(jpeg, MediaLimits(max_image_pixels=limit))
        assert decoded.size == size and decoded.mode == "RGB"
    whole = np.asarray(decode_image(jpeg, MediaLimits()).resize((400, 300), Image.Resampling.BICUBIC), np.float32)
    reduced = np.asarray(decode_image(jpeg, MediaLimits(max_image_pixels=400 * 300)), np.float32)
    assert np.abs(whole - reduced).mean() < 3  # the same picture, within JPEG's own error
    with pytest.raises(MediaError, match=r"^image: 1600x1200 pixels is above the limit of 29,999 pixels per image"):
        decode_image(jpeg, MediaLimits(max_image_pixels=29999))
    # sides that are not multiples of the scale: libjpeg rounds them up
    for (width, height), limit, size in (((1601, 1201), 801 * 601, (801, 601)), ((1601, 1201), 201 * 151, (201, 151)),
                                          ((1599, 1199), 200 * 150, (200, 150)), ((999, 7), 500 * 4, (500, 4))):
        odd = _encoded(picture.resize((width, height)), "JPEG")
        assert decode_image(odd, MediaLimits(max_image_pixels=limit)).size == size
    with pytest.raises(MediaError, match=r"^image: 1600x1200 pixels is above the limit of 480,000 pixels per image"):
        decode_image(_encoded(picture, "PNG"), MediaLimits(max_image_pixels=800 * 600))


def test_a_jpeg_past_pillows_own_guard_is_decoded_at_a_reduced_scale(monkeypatch):
    """Pillow refuses above 2 x MAX_IMAGE_PIXELS (179 megapixels; a 200 MP phone photo) when it opens a file, before a
    reduced decode could fit it: a JPEG is still decoded within the limit (the guard lowered here to keep it small)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 400_000)
    jpeg = _encoded(_photo(), "JPEG", quality=95)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(jpeg))
    assert decode_image(jpeg, MediaLimits(max_image_pixels=800 * 600)).size == (800, 600)
    with pytest.raises(MediaError, match=r"^image: 1600x1200 pixels is above the limit of 29,999 pixels per image"):
        decode_image(jpeg, MediaLimits(max_image_pixels=29999))
    with pytest.raises(MediaError, match=r"^image: 1,920,000 pixels is above the limit of 480,000 pixels per image"):
        decode_image(_encoded(Image.new("RGB", (1600, 1200)), "PNG"), MediaLimits(max_image_pixels=800 * 600))


def _with_thumbnail(jpeg: bytes) -> bytes:
    """``jpeg`` with an APP1 segment holding a whole small JPEG after its start, as a camera's EXIF thumbnail."""
    thumbnail = _encoded(_noise(32, 24, "RGB"), "JPEG")
    body = b"Exif\0\0" + thumbnail
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


def _declaring(jpeg: bytes, width: int, height: int) -> bytes:
    """``jpeg`` with its frame header declaring width x height (its data still a small picture's)."""
    at = max(jpeg.find(b"\xff\xc0"), jpeg.find(b"\xff\xc2"))
    return jpeg[:at + 5] + struct.pack(">HH", height, width) + jpeg[at + 9:]


def test_a_progressive_jpeg_decode_is_held_to_the_plan_with_its_coefficients():
    """libjpeg holds a progressive JPEG's coefficients for the whole picture at any scale (2 bytes each): a 4 KB
    file declaring 400 megapixels would take 2.4 GB at 1/8; it is refused from its header. Near the limit, one
    with unsubsampled colour is decoded at half its sides, within the plan; with 4:2:0 colour, whole."""
    picture = _photo()
    limits = MediaLimits(max_image_pixels=1600 * 1200)
    full = _encoded(picture, "JPEG", progressive=True, subsampling=0)
    assert decode_image(full, limits).size == (800, 600)
    assert decode_image(_encoded(picture, "JPEG", progressive=True), limits).size == (1600, 1200)
    assert decode_image(_encoded(picture, "JPEG", subsampling=0), limits).size == (1600, 1200)  # baseline: whole
    small = _encoded(_noise(64, 64, "RGB"), "JPEG", progressive=True)
    with pytest.raises(MediaError, match=r"^image 3: a progressive or multi-scan JPEG of 20000x20000 pixels needs "
                                         r"1,168\.3 MiB to decode at any scale \(libjpeg holds all its coefficients\), "
                                         r"above the 110\.2 MiB the limit of 12,845,056 pixels per image plans "
                                         r"\(--max-image-pixels\); save it as a baseline JPEG"):
        decode_image(_declaring(small, 20000, 20000), MediaLimits(), part="image 3")


def test_a_sequential_jpeg_scanned_a_component_at_a_time_holds_its_coefficients_too():
    """libjpeg buffers a baseline picture whose first scan codes one of its components as it buffers a progressive
    one: a 400-byte file declaring 8192 x 8192 in three components took 405 MiB at 1/4; refused."""
    gray = _encoded(Image.new("L", (64, 64), 100), "JPEG")
    at = gray.index(b"\xff\xc0")
    one = gray[at + 10:at + 13]  # the component's id, sampling and table
    frame = (b"\xff\xc0" + struct.pack(">HBHHB", 8 + 3 * 3, 8, 8192, 8192, 3) + one
             + bytes([2, 0x11, one[2]]) + bytes([3, 0x11, one[2]]))
    three = gray[:at] + frame + gray[at + 2 + int.from_bytes(gray[at + 2:at + 4], "big"):]
    with pytest.raises(MediaError, match=r"^image: a progressive or multi-scan JPEG of 8192x8192 pixels needs "
                                         r"388\.0 MiB to decode"):
        decode_image(three, MediaLimits())


def test_an_exif_thumbnails_scan_is_not_the_pictures():
    """Scans are counted in the picture's own segments: a baseline photo with a thumbnail is one scan, decoded
    at a reduced scale above the limit, not taken for a progressive one."""
    from edge_infer.media.image import jpeg_scans

    picture = _photo()
    photo = _with_thumbnail(_encoded(picture, "JPEG"))
    assert photo.count(b"\xff\xda") == 2 and jpeg_scans(photo) == (1, 3)
    assert jpeg_scans(_encoded(picture, "JPEG", progressive=True))[0] > 2
    assert decode_image(photo, MediaLimits(max_image_pixels=400 * 300)).size == (400, 300)


# The child's peak RSS from VmHWM (its own address space's; ru_maxrss would start at the forking parent's).
CHILD_DECODE = """
import sys
from edge_infer.media.config import VisionProcessing
from edge_infer.media.image import decode_image, image_features
from edge_infer.media.limits import MediaLimits
peak = lambda: int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
data = open(sys.argv[1], "rb").read()
limits = MediaLimits(max_image_pixels=int(sys.argv[2]), max_image_tokens=256)
vision = limits.vision_processing(VisionProcessing(max_pixels=12845056))
before = peak()
features = image_features(decode_image(data, limits), vision)
print(peak() - before, features.pixel_values.nbytes)
"""


@pytest.mark.parametrize("kind", ["rgba", "rotated jpeg", "palette", "progressive jpeg"])
def test_a_picture_at_the_decode_limit_becomes_features_within_the_planned_buffers(kind, tmp_path):
    """The plan's media preprocessing item holds an image's decode at IMAGE_DECODE_BYTES a pixel beside its patch
    copies: a transparent picture composited whole took 20 bytes a pixel (four RGBA copies), a rotated photo two
    copies of its pixels. Measured in a child process (its peak RSS), at 2048 x 2048 pixels."""
    import subprocess
    import sys

    from edge_infer.media.image import IMAGE_DECODE_BYTES

    side = 2048
    y, x = np.mgrid[0:side, 0:side]
    pixels = np.stack([x % 256, y % 256, (x * y) % 256, (x + y) % 256], -1).astype(np.uint8)
    if kind == "rgba":
        data = _encoded(Image.fromarray(pixels, "RGBA"), "PNG")
    elif kind == "rotated jpeg":
        picture = Image.fromarray(pixels[..., :3].copy(), "RGB")
        exif = picture.getexif()
        exif[0x0112] = 6
        data = _encoded(picture, "JPEG", exif=exif)
    elif kind == "progressive jpeg":  # its coefficients beside the decode: 6 bytes a pixel without subsampling
        data = _encoded(Image.fromarray(pixels[..., :3].copy(), "RGB"), "JPEG", progressive=True, subsampling=0)
    else:
        data = _encoded(Image.fromarray(pixels[..., :3].copy(), "RGB").quantize(64), "PNG", transparency=5)
    path = tmp_path / "picture"
    path.write_bytes(data)
    run = subprocess.run([sys.executable, "-c", CHILD_DECODE, str(path), str(side * side)], capture_output=True,
                         text=True, timeout=120, check=True)
    grown, patches = map(int, run.stdout.split())
    planned = IMAGE_DECODE_BYTES * side * side + 2 * patches // 8 + 2 * patches // 4 + patches
    assert grown <= planned, (grown / side ** 2, planned / side ** 2)


@pytest.mark.parametrize("data,message", [
    (b"", r"image 1: is empty \(0 bytes\); send a PNG, JPEG, WebP, GIF or BMP image"),
    (b"this is not an image at all", r"image 1: is not an image edge-infer decodes \(.*\); send a PNG, JPEG"),
    (b"P6\n4 4\n255\n" + bytes(48), r"image 1: is not an image edge-infer decodes"),  # PPM: a format left out
])
def test_undecodable_images_are_refused(data, message):
    with pytest.raises(MediaError, match=message):
        decode_image(data, MediaLimits(), part="image 1")


def test_truncated_and_damaged_images_are_refused():
    png = _encoded(_noise(64, 64, "RGB"), "PNG")
    with pytest.raises(MediaError, match=r"image 1: the PNG data is damaged or truncated"):
        decode_image(png[: len(png) // 2], MediaLimits(), part="image 1")
    with pytest.raises(MediaError, match=r"image 1: the PNG data is damaged or truncated"):
        decode_image(_png_header_only(64, 64), MediaLimits(), part="image 1")  # too little pixel data


def test_a_jpeg_of_many_tiny_scans_is_refused_before_it_is_decoded():
    """Each scan of a progressive JPEG is a pass over the image and may be 12 bytes long: such a file held a
    media thread for seconds per megabyte. Ordinary progressive files (about 10 scans) still decode."""
    buf = io.BytesIO()
    _noise(64, 64, "RGB").save(buf, "JPEG", progressive=True, quality=50)
    jpeg = buf.getvalue()
    assert 5 <= jpeg.count(b"\xff\xda") <= 20 and decode_image(jpeg, MediaLimits()).size == (64, 64)
    # Repeat its last scan: every copy is a valid refinement of the same coefficients.
    last_scan = jpeg.rindex(b"\xff\xda")
    end = jpeg.rindex(b"\xff\xd9")
    bomb = jpeg[:end] + jpeg[last_scan:end] * 300 + jpeg[end:]
    # libjpeg reads past junk between segments, a zero length and stuffed zeros: so does the count
    comment = jpeg.index(b"\xff\xdb")  # after the start and the header segments, before the tables
    for junk in (b"", b"\xff\xfe\x00\x04ab!", b"\xff\xfe\x00\x00", b"\xff\x00"):
        hidden = bomb[:comment] + junk + bomb[comment:]
        with pytest.raises(MediaError, match=r"^image 1: the JPEG has \d+ scans, above the 256 edge-infer decodes"):
            decode_image(hidden, MediaLimits(), part="image 1")
