"""Media files built on the spot: images with Pillow, audio with soundfile, videos with PyAV."""
from __future__ import annotations

import base64
import io

import numpy as np

from edge_infer.bench.harness.media_bench import noise_png as png  # noqa: F401 (the tests' picture)


def sine(seconds: float, rate: int, hz: float = 440.0, channels: int = 1, amplitude: float = 0.3) -> np.ndarray:
    """float32 [samples, channels]; channel c at hz * (c + 1), so a mix-down is not any one channel."""
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([amplitude * np.sin(2 * np.pi * hz * (c + 1) * t) for c in range(channels)], axis=1).astype(np.float32)


def audio_file(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def video_file(frames: list[np.ndarray], fps: int, fmt: str = "mp4", codec: str = "libx264",
               audio: np.ndarray | None = None, audio_rate: int = 48000, options: dict | None = None,
               rotation: int = 0, hflip: bool = False) -> bytes:
    """A video of uint8 RGB frames [H, W, 3], with a mono float32 audio track when `audio` is given; `rotation`:
    the display matrix's counterclockwise degrees (a phone's portrait video: -90), mirrored after it with `hflip`."""
    import av

    buf = io.BytesIO()
    height, width = frames[0].shape[:2]
    with av.open(buf, "w", format=fmt) as out:
        video = out.add_stream(codec, rate=fps, options=options or {})
        video.width, video.height = width, height
        video.pix_fmt = "yuv420p" if codec != "ffv1" else "bgr0"
        if rotation or hflip:
            video.set_display_rotation(rotation, hflip=hflip)
        sound = None
        if audio is not None:
            sound = out.add_stream("aac" if fmt == "mp4" else "libopus", rate=audio_rate)
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if sound is not None:
            _mux_mono(out, sound, audio, audio_rate)
    return buf.getvalue()


def recording(samples: np.ndarray, rate: int, fmt: str = "ipod", codec: str = "aac") -> bytes:
    """Mono float32 samples [N, 1] encoded by FFmpeg: AAC in M4A (a phone's voice memo; "ipod" is FFmpeg's
    name), Opus in WebM (a browser's MediaRecorder)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        _mux_mono(out, out.add_stream(codec, rate=rate, layout="mono"), samples[:, 0], rate)
    return buf.getvalue()


def _mux_mono(out, sound, samples: np.ndarray, rate: int) -> None:
    """1-D float32 ``samples`` encoded into the ``sound`` stream of ``out``, 960 at a time."""
    import av

    for start in range(0, len(samples), 960):
        chunk = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[start:start + 960])[None], format="fltp",
                                           layout="mono")
        chunk.sample_rate, chunk.pts = rate, start
        for packet in sound.encode(chunk):
            out.mux(packet)
    for packet in sound.encode():
        out.mux(packet)


def frames_of(count: int, height: int = 48, width: int = 64) -> list[np.ndarray]:
    """Frames that differ from each other everywhere: a gradient shifted by the frame's index."""
    y, x = np.mgrid[0:height, 0:width]
    return [np.stack([(x * 4 + i * 9) % 256, (y * 5 + i * 13) % 256, ((x + y) * 3 + i * 7) % 256], axis=-1)
            .astype(np.uint8) for i in range(count)]


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()
