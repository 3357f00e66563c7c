"""Files FFmpeg demuxes, through PyAV: the demuxer named from the magic bytes, and an audio stream mixed and
resampled as it decodes (a video's sound track; an M4A voice memo or a browser's WebM recording sent as audio)."""
from __future__ import annotations

import io
from typing import TYPE_CHECKING

import numpy as np

from edge_infer.errors import MediaError
from edge_infer.media.audio import MonoStream
from edge_infer.media.limits import MediaLimits

if TYPE_CHECKING:
    import av

def container_format(data: bytes) -> str | None:
    """The demuxer named from the file's magic bytes. Naming it keeps FFmpeg from probing into formats
    that open other files or URLs (playlists, concat lists)."""
    if data[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide"):
        return "mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    return None


class SoundTrack:
    """An audio stream's frames, whatever their sample format and channels, into a MonoStream at ``rate``; the
    first frame's rate is the stream's (resampled as the first rate, a later one would change pitch)."""

    def __init__(self, rate: int, limits: MediaLimits, part: str):
        import av

        self.rate, self.limits, self.part = rate, limits, part
        self._to_float = av.AudioResampler(format="fltp")  # sample format only; channels and rate as they are
        self._mono: MonoStream | None = None

    def add(self, frame: "av.AudioFrame") -> None:
        if self._mono is None:
            self._mono = MonoStream(frame.sample_rate, self.rate, self.limits, self.part)
        elif frame.sample_rate != self._mono.source_rate:
            raise MediaError(f"{self.part}: its sample rate changes ({self._mono.source_rate} to {frame.sample_rate} "
                             "Hz); re-encode it with one rate")
        for block in self._to_float.resample(frame):
            self._mono.add(block.to_ndarray().T)  # [samples, channels]

    def finish(self) -> np.ndarray | None:
        """The samples at ``rate``; None when no frame came."""
        return None if self._mono is None or self._mono.frames == 0 else self._mono.finish()


def container_audio(data: bytes, fmt: str, limits: MediaLimits, rate: int, part: str) -> np.ndarray:
    """Mono float32 samples at ``rate`` from the first audio stream of a ``fmt`` file."""
    import av

    try:
        with av.open(io.BytesIO(data), format=fmt, metadata_errors="replace") as container:
            if not container.streams.audio:
                raise MediaError(f"{part}: the {fmt} file has no audio stream; send a clip with sound")
            if container.duration:  # the header's length, refused before decoding anything
                seconds = container.duration / av.time_base
                limits.check("max_audio_seconds", seconds, part=part, shown=f"{seconds:.1f} s")
            track = SoundTrack(rate, limits, part)
            for packet in container.demux(container.streams.audio[0]):
                for frame in packet.decode():
                    track.add(frame)
    except MediaError:
        raise
    except (av.FFmpegError, ValueError) as exc:  # PyAV refuses some malformed streams with ValueError
        raise MediaError(f"{part}: cannot be decoded as {fmt} audio ({exc})") from None
    samples = track.finish()
    if samples is None:
        raise MediaError(f"{part}: has no audio samples; send a clip with sound (silence is fine)")
    return samples
