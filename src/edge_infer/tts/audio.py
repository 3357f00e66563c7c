"""Audio encodings of float32 PCM: WAV, raw PCM, FLAC, MP3 and Opus (through ``soundfile``).

``pcm`` is what OpenAI's speech endpoint calls pcm: 16-bit signed little
endian, mono, no header. A streamed WAV starts with a header whose sizes say
"unknown" (0xFFFFFFFF, as streaming WAV writers do) and then carries the
same 16-bit samples; players read it to the end of the stream. FLAC needs
the whole signal before its header is final, so it is encoded at the end, as
are MP3 (OpenAI's default format, what many clients ask for; libsndfile's
LAME encoder) and Opus (in Ogg, as OpenAI sends it), the two lossy ones.
"""
from __future__ import annotations

import io
import struct
from functools import lru_cache

import numpy as np

FORMATS = ("wav", "pcm", "flac", "mp3", "opus")  # mp3 and opus where this libsndfile encodes them: formats()
STREAMABLE = ("wav", "pcm")
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg"}
# soundfile's (format, subtype) of each encoded format; 16-bit samples for the lossless ones
_CONTAINERS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
               "opus": ("OGG", "OPUS")}
_UNKNOWN_SIZE = 0xFFFFFFFF


@lru_cache(maxsize=1)
def formats() -> tuple[str, ...]:
    """The formats this machine encodes: libsndfile before 1.1 has no MP3, one built without Opus no opus."""
    import soundfile

    missing = {"mp3"} if "MP3" not in soundfile.available_formats() else set()
    if "OPUS" not in soundfile.available_subtypes("OGG"):
        missing.add("opus")
    return tuple(f for f in FORMATS if f not in missing)


def pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> 16-bit signed little-endian bytes."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return (np.round(clipped * 32767.0)).astype("<i2").tobytes()


def wav_stream_header(sample_rate: int, channels: int = 1) -> bytes:
    """A 44-byte PCM WAV header for a stream of unknown length."""
    block = 2 * channels
    return (b"RIFF" + struct.pack("<I", _UNKNOWN_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
            + b"data" + struct.pack("<I", _UNKNOWN_SIZE))


def encode(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole signal in ``fmt`` (wav and flac with a complete header; mp3 and opus lossy)."""
    if fmt == "pcm":
        return pcm16(samples)
    if fmt not in formats():
        raise ValueError(f"unknown audio format {fmt!r}; use one of {', '.join(formats())}")
    import soundfile

    buffer = io.BytesIO()
    container, subtype = _CONTAINERS[fmt]
    # Our 16-bit samples, so every format carries the same ones (libsndfile would round floats its own way).
    soundfile.write(buffer, np.frombuffer(pcm16(samples), dtype="<i2"), sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()
