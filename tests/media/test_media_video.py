"""Videos: frames sampled as Qwen's video processor samples them, one grid, temporal pairs; the audio track.

transformers' Qwen2VLVideoProcessor needs torchvision, which does not import beside this CPU torch, so the
references are (a) the Pil image processor on a 2-frame static video, whose one temporal pair is an image,
and (b) an independent numpy formulation of the video processor's channel-first view/permute.
"""
from __future__ import annotations

import io
import math

import av
import numpy as np
import pytest
import soxr
import torch
from media_files import audio_file, frames_of, sine, video_file
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as reference_smart_resize

from edge_infer.errors import MediaError
from edge_infer.media.audio import log_mel
from edge_infer.media.config import AudioProcessing, MediaProcessing, VisionProcessing
from edge_infer.media.limits import MediaLimits
from edge_infer.media.video import sample_indices, video_features

OMNI = MediaProcessing(VisionProcessing(), AudioProcessing())
VL = MediaProcessing(VisionProcessing(), None)


def _decoded_frames(data: bytes) -> list[Image.Image]:
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_image() for frame in container.decode(video=0)]


def _transformers_sample(total: int, fps: float, cfg: VisionProcessing, limit: int) -> list[int]:
    """Qwen2VLVideoProcessor.sample_frames' arithmetic (its float32 torch.arange), max_frames lowered to `limit`."""
    tp = cfg.temporal_patch_size
    max_frames = math.floor(min(cfg.video_max_frames, limit, total) / tp) * tp
    count = min(max(total / fps * cfg.video_fps, cfg.video_min_frames), max_frames, total)
    count = math.floor(count / tp) * tp
    # float32 accumulation sometimes yields count + 1 indices there (an odd number of frames); the first
    # `count` are the intended ones, which we take exactly with integers.
    return torch.arange(0, total, total / count).int().tolist()[:count]


def _reference_patches(frames: list[Image.Image], cfg: VisionProcessing) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The video processor's pipeline in plain numpy, channel-first as it holds frames."""
    height, width = reference_smart_resize(frames[0].height, frames[0].width, cfg.factor, cfg.video_min_pixels,
                                           cfg.video_max_pixels)
    video = np.stack([np.asarray(f.resize((width, height), Image.BICUBIC)) for f in frames])
    video = (video.astype(np.float64) * (1 / 255)).astype(np.float32)
    video = (video - np.float32(cfg.image_mean)) / np.float32(cfg.image_std)
    video = video.transpose(0, 3, 1, 2)  # [T, C, H, W]
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if pad := -len(video) % tp:
        video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
    gt, gh, gw = len(video) // tp, height // p, width // p
    patches = video.reshape(gt, tp, 3, gh // m, m, p, gw // m, m, p).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, 3 * tp * p * p), (gt, gh, gw)


def test_sampling_follows_the_video_processor():
    cfg = VisionProcessing()
    for total in range(2, 300, 7):
        for fps in (1.0, 2.0, 7.5, 10.0, 25.0, 30.0, 60.0):
            for limit in (2, 8, 32, 768):
                assert sample_indices(total, fps, cfg, limit) == _transformers_sample(total, fps, cfg, limit)


@pytest.mark.parametrize("fmt,codec", [("mp4", "libx264"), ("webm", "libvpx-vp9")])
def test_sampled_frames_give_the_reference_patches(fmt, codec):
    data = video_file(frames_of(25, height=50, width=66), fps=10, fmt=fmt, codec=codec)
    got, audio = video_features(data, OMNI, MediaLimits())
    assert audio is None
    decoded = _decoded_frames(data)
    picked = _transformers_sample(len(decoded), 10.0, VisionProcessing(), 32)
    assert picked == [0, 6, 12, 18]  # 2.5 s at 2 fps: 5 frames, floored to an even 4
    expected, grid = _reference_patches([decoded[i] for i in picked], VisionProcessing())
    assert got.grid_thw == grid == (2, 20, 26)
    np.testing.assert_array_equal(got.pixel_values, expected)
    assert got.second_per_grid == pytest.approx(2 / (4 / 25 * 10))  # temporal patch / the sampled rate
    assert got.num_tokens == 2 * 20 * 26 // 4


def test_a_static_two_frame_video_is_its_image():
    """Two equal frames form one temporal pair: the Pil image processor's output for that frame."""
    frame = frames_of(1, height=70, width=90)[0]
    data = video_file([frame, frame], fps=2, fmt="matroska", codec="ffv1")  # lossless: frames come back exact
    got, _ = video_features(data, VL, MediaLimits())
    cfg = VisionProcessing()
    image = Image.fromarray(frame)
    processor = Qwen2VLImageProcessorPil(min_pixels=cfg.video_min_pixels, max_pixels=cfg.video_max_pixels)
    out = processor(images=image, return_tensors="np")
    assert got.grid_thw == tuple(int(v) for v in out["image_grid_thw"][0])
    np.testing.assert_array_equal(got.pixel_values, out["pixel_values"])
    assert got.second_per_grid == pytest.approx(1.0)


@pytest.mark.parametrize("rotation,turn", [(-90, Image.Transpose.ROTATE_270), (90, Image.Transpose.ROTATE_90),
                                           (180, Image.Transpose.ROTATE_180)])
def test_a_video_shot_on_its_side_is_turned_as_a_player_shows_it(rotation, turn):
    """A phone's portrait video is stored landscape with a display matrix; its frames reach the model upright: the
    reference's patches of the turned frames (transformers' video loaders ignore the matrix), but for the resize's
    rounding (a frame is resized on its side, then turned)."""
    frames = frames_of(4, height=50, width=66)
    for frame in frames:
        frame[:6] = 255  # a white band along the top of the stored frame
    data = video_file(frames, fps=2, fmt="matroska", codec="ffv1", rotation=rotation)
    got, _ = video_features(data, VL, MediaLimits())
    shown = [frame.transpose(turn) for frame in _decoded_frames(data)]
    expected, grid = _reference_patches(shown, VisionProcessing())
    assert got.grid_thw == grid and (grid[1] > grid[2]) == (rotation != 180)
    assert np.abs(got.pixel_values - expected).mean() < 0.01  # turned the other way, it would be ~1
    band = {-90: np.s_[:, -6:], 90: np.s_[:, :6], 180: np.s_[-6:, :]}[rotation]  # where a viewer sees the band
    assert (np.asarray(shown[0])[band] == 255).all()


@pytest.mark.parametrize("rotation", [0, -90])
def test_a_mirrored_display_matrix_leaves_the_frames_as_stored(rotation):
    """PyAV reads a mirror as a half turn (-180): turning the frame would show it upside down."""
    frames = frames_of(4, height=50, width=66)
    plain, _ = video_features(video_file(frames, fps=2, fmt="matroska", codec="ffv1"), VL, MediaLimits())
    got, _ = video_features(video_file(frames, fps=2, fmt="matroska", codec="ffv1", rotation=rotation, hflip=True),
                            VL, MediaLimits())
    assert got.grid_thw == plain.grid_thw
    np.testing.assert_array_equal(got.pixel_values, plain.pixel_values)


def test_the_frame_limit_lowers_the_sampling_rate():
    data = video_file(frames_of(100, height=28, width=28), fps=10, codec="libx264")  # 10 s: 20 frames at 2 fps
    got, _ = video_features(data, VL, MediaLimits(max_video_frames=8))
    assert got.grid_thw[0] == 4
    assert got.second_per_grid == pytest.approx(2 * 10 / 8)  # 8 frames over 10 s


def test_a_thin_small_video_at_a_low_token_limit_stays_within_the_plan():
    """Frames scaled up to the video range's minimum come out at most as large as the plan's largest frame, where
    the reference processor's rounding doubles them (258 tokens a pair at a limit of 128)."""
    from edge_infer.memory.media_shapes import media_shapes

    data = video_file(frames_of(4, height=19, width=2432), fps=2, fmt="matroska", codec="ffv1")
    limits = MediaLimits(max_image_tokens=128, max_video_frames=4)
    got, _ = video_features(data, MediaProcessing(limits.vision_processing(VL.vision), None), limits)
    planned = media_shapes(limits, VL)
    assert got.grid_thw[0] == planned.video_grid[0] == 2
    assert got.num_tokens <= planned.video_tokens == 2 * 160


@pytest.mark.parametrize("fmt", ["mp4", "webm"])
def test_the_audio_track_becomes_audio_features(fmt):
    seconds = 2.0
    track = sine(seconds, 48000, hz=1000)[:, 0]
    data = video_file(frames_of(20), fps=10, fmt=fmt, codec="libx264" if fmt == "mp4" else "libvpx-vp9",
                      audio=track)
    vision, audio = video_features(data, OMNI, MediaLimits())
    assert vision.grid_thw[0] == 2
    frames = audio.mel.shape[1]
    assert abs(frames - seconds * 100) <= 10  # codec priming and padding add a few 10 ms frames
    # The track decoded independently (PyAV to float, channel mean, soxr, log-mel) gives the same features.
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="fltp")
        blocks = [f.to_ndarray() for frame in container.decode(audio=0) for f in resampler.resample(frame)]
    samples = soxr.resample(np.concatenate(blocks, axis=1).mean(axis=0), 48000, 16000, quality="HQ")
    np.testing.assert_array_equal(audio.mel, log_mel(samples, AudioProcessing()))
    # and it is the tone: the loudest mel band is the one around 1 kHz
    assert abs(int(np.argmax(audio.mel[:, 20:-20].mean(axis=1))) - _mel_band(1000.0)) <= 1


def _mel_band(hz: float) -> int:
    """The Slaney-mel band (of 128 up to 8 kHz) whose centre is nearest `hz`."""
    to_mel = lambda f: 3 * f / 200 if f < 1000 else 15 + math.log(f / 1000) * 27 / math.log(6.4)  # noqa: E731
    edges = np.linspace(0, to_mel(8000), 130)
    return int(np.argmin(np.abs(edges[1:-1] - to_mel(hz))))


def test_a_model_without_audio_ignores_the_track():
    data = video_file(frames_of(20), fps=10, audio=sine(2.0, 48000)[:, 0])
    _, audio = video_features(data, VL, MediaLimits())
    assert audio is None


def test_a_long_audio_track_is_refused_naming_the_limit_and_how_to_send_the_picture_alone():
    data = video_file(frames_of(30), fps=10, audio=sine(3.0, 48000)[:, 0])
    with pytest.raises(MediaError, match=r"^video 1 \(its audio track\): more than 2 s is above the limit of 2 "
                                         r"seconds of audio per clip \(--max-audio-seconds\); cut it or raise "
                                         r"--max-audio-seconds; or send the video without its sound "
                                         r'\("mm_processor_kwargs": \{"use_audio_in_video": false\}\)$'):
        video_features(data, OMNI, MediaLimits(max_audio_seconds=2.0), part="video 1")
    # use_audio_in_video false decodes it with no audio processing, as for a model without an audio tower
    frames, sound = video_features(data, VL, MediaLimits(max_audio_seconds=2.0), part="video 1")
    assert sound is None and frames.num_tokens > 0


def test_a_long_video_is_refused_naming_the_limit():
    data = video_file(frames_of(40, height=16, width=16), fps=10)
    with pytest.raises(MediaError) as err:
        video_features(data, VL, MediaLimits(max_video_seconds=3.0), part="video 1")
    assert str(err.value) == ("video 1: 4.0 s is above the limit of 3 seconds per video (--max-video-seconds); "
                              "cut it or raise --max-video-seconds")


def test_video_refusals_name_the_video_and_the_fix():
    limits = MediaLimits()
    with pytest.raises(MediaError, match=r"^video 2: is empty \(0 bytes\); send MP4, MOV, WebM, MKV or AVI video$"):
        video_features(b"", OMNI, limits, part="video 2")
    with pytest.raises(MediaError, match=r"^video 2: is not a video container edge-infer reads; send MP4"):
        video_features(audio_file(sine(0.5, 16000), 16000, "WAV", "PCM_16"), OMNI, limits, part="video 2")
    with pytest.raises(MediaError, match=r"^video 2: is not a video container"):
        video_features(b"#EXTM3U\n#EXT-X-VERSION:3\nhttp://example.invalid/a.ts\n", OMNI, limits, part="video 2")
    mp4 = video_file(frames_of(20), fps=10)
    with pytest.raises(MediaError, match=r"^video 2: cannot be decoded as mp4 video \(.+\)$"):
        video_features(mp4[:200], OMNI, limits, part="video 2")
    one = video_file(frames_of(1), fps=10)
    with pytest.raises(MediaError, match=r"^video 2: has 1 frame\(s\); a video needs at least 2 \(send a single frame "
                                         r"as an image\)$"):
        video_features(one, OMNI, limits, part="video 2")
    with pytest.raises(MediaError, match=r"^video 2: each frame, 64x48 pixels, is above the limit of 1,000 pixels per "
                                         r"image \(--max-image-pixels\)"):
        video_features(mp4, OMNI, MediaLimits(max_image_pixels=1000), part="video 2")
    with pytest.raises(MediaError, match=r"^video 2: videos are off .*; raise --max-video-frames, with a "
                                         r"--max-model-len that has room for them$"):
        video_features(mp4, OMNI, MediaLimits(max_video_frames=0), part="video 2")
    with pytest.raises(MediaError, match=r"^video 2: this model does not take images or video$"):
        video_features(mp4, MediaProcessing(None, AudioProcessing()), limits, part="video 2")


def test_a_file_with_only_sound_has_no_video_stream():
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=48000)
        track = sine(0.5, 48000)[:, 0]
        for start in range(0, len(track), 1024):
            chunk = av.AudioFrame.from_ndarray(track[None, start:start + 1024], format="fltp", layout="mono")
            chunk.sample_rate, chunk.pts = 48000, start
            for packet in stream.encode(chunk):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    with pytest.raises(MediaError, match=r"^video: has no video stream; send audio as input_audio$"):
        video_features(buf.getvalue(), OMNI, MediaLimits())


def test_a_video_codec_without_a_decoder_is_refused_by_name():
    """An MP4 whose video codec FFmpeg has no decoder for (its sample entry renamed: the container still reads)."""
    data = video_file(frames_of(4), fps=4)
    entry = data.rindex(b"avc1")  # the sample entry (the first is a brand in the file type box)
    with pytest.raises(MediaError, match=r"^video: its video is in a codec edge-infer cannot decode; re-encode it as "
                                         r"H\.264$"):
        video_features(data[:entry] + b"qqq1" + data[entry + 4:], OMNI, MediaLimits())


def test_a_sound_codec_without_a_decoder_is_refused_with_how_to_send_the_picture_alone():
    """A Matroska video whose sound's codec ID no decoder knows: refused by name, not as an FFmpeg errno."""
    data = video_file(frames_of(20), fps=10, fmt="matroska", audio=sine(2.0, 48000)[:, 0])
    assert data.count(b"A_OPUS") == 1
    data = data.replace(b"A_OPUS", b"A_QQQQ")
    with pytest.raises(MediaError, match=r"^video: its sound is in a codec edge-infer cannot decode; re-encode it with "
                                         r"AAC or Opus sound, or send the video without its sound \("):
        video_features(data, OMNI, MediaLimits())
    frames, sound = video_features(data, VL, MediaLimits())  # as use_audio_in_video false decodes it
    assert sound is None and frames.num_tokens > 0


@pytest.mark.parametrize("fmt", ["avi", "matroska"])
def test_a_frame_larger_than_its_header_says_is_refused_before_it_is_decoded(fmt):
    """A stream whose header says 64x64 and whose later frames are large (MJPEG packets are whole JPEGs, of any
    size): the header's check alone let 12000x12000 frames through, 2.3 GiB for one request."""
    from fractions import Fraction

    def jpeg(width: int, height: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (width, height), (200, 0, 0)).save(buf, "JPEG", quality=10)
        return buf.getvalue()

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream("mjpeg", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuvj420p"
        for i, data in enumerate([jpeg(64, 64)] + [jpeg(640, 640)] * 3):
            packet = av.Packet(data)
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, Fraction(1, 10)
            out.mux(packet)
    data = buf.getvalue()
    assert video_features(data, VL, MediaLimits(max_image_pixels=640 * 640), part="video 1")[0].grid_thw[0] == 2
    with pytest.raises(MediaError, match=r"^video 1: a frame cannot be decoded \(.+\): it is corrupt, or larger than "
                                         r"the limit of 100,000 pixels \(--max-image-pixels\); re-encode the video"):
        video_features(data, VL, MediaLimits(max_image_pixels=100_000), part="video 1")


def test_decoding_is_bounded_by_frames_and_pixels_not_by_the_files_frame_rate(monkeypatch):
    """A file's frame rate is its own claim: 200,000 tiny frames "at 1,700 fps" are 117 s of video. What may be
    decoded is what max_video_seconds of 60 frames a second at 1920x1080 would cost, here scaled down to 20
    frames of 64x48 (so that the test builds a small file)."""
    import edge_infer.media.video as video

    monkeypatch.setattr(video, "DECODE_PIXELS_PER_SECOND", 20 * 64 * 48)  # one second of video: 20 such frames
    limits = MediaLimits(max_video_seconds=1.0)
    assert video_features(video_file(frames_of(20), fps=40), VL, limits, part="video 1")[0].grid_thw[0] >= 1
    with pytest.raises(MediaError) as err:
        video_features(video_file(frames_of(30), fps=40), VL, limits, part="video 1")  # 0.75 s, 30 frames
    assert str(err.value) == ("video 1: 30 frames (40 per second) of 64x48 pixels is more decoding than 1 s of video "
                              "allows (20 frames at this size: 60 frames a second at 1920x1080, or as many pixels; "
                              "--max-video-seconds); re-encode it at a lower frame rate or size")
    # Frames that outrun the header's count (one that understates it, with a sampled frame past the real ones)
    # are counted as they decode.
    monkeypatch.setattr(video, "_frame_count", lambda *args: 10)
    monkeypatch.setattr(video, "sample_indices", lambda *args: [0, 29])
    with pytest.raises(MediaError, match=r"^video 1: more than 20 frames of 64x48 pixels is more decoding than"):
        video_features(video_file(frames_of(30), fps=40), VL, limits, part="video 1")


def test_a_video_whose_metadata_is_not_utf8_decodes():
    """Older cameras write Latin-1 titles; PyAV reads tags as strict UTF-8 unless told otherwise (a 500 before)."""
    data = video_file(frames_of(8), fps=10, fmt="matroska", codec="mpeg4")
    titled = io.BytesIO()
    with av.open(io.BytesIO(data)) as src, av.open(titled, "w", format="matroska") as out:
        out.metadata["title"] = "cafés"
        stream = out.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                out.mux(packet)
    raw = titled.getvalue().replace("cafés".encode(), b"caf\xe9 s")  # as Latin-1 (and a space: the same length)
    assert raw != titled.getvalue()
    assert video_features(raw, VL, MediaLimits(), part="video 1")[0].grid_thw[0] >= 1
