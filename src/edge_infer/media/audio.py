"""Audio into log-mel features, as transformers' WhisperFeatureExtractor computes them for Qwen2.5-Omni.

decode (soundfile: WAV, MP3, FLAC, OGG; PyAV for M4A, WebM and FFmpeg's other containers: container.py) ->
mono (the channels' mean) -> the model's rate (soxr, high quality: what librosa's default resampler is), a block
at a time -> log-mel. The Omni processor pads every clip to chunk_length seconds and passes an attention mask;
the audio tower reads only the masked frames, so log_mel returns exactly those, computed as if the padding were
there (it shapes the last frames and the clip's maximum).
"""
from __future__ import annotations

import io
import math
import re
from functools import lru_cache

import numpy as np

from edge_infer.errors import MediaError
from edge_infer.media.config import AudioProcessing
from edge_infer.media.features import AudioFeatures
from edge_infer.media.limits import MediaLimits

AUDIO_FORMATS = "WAV, MP3, FLAC, OGG, M4A or WebM"
DECODE_BLOCK_SAMPLES = 1 << 17  # samples (frames x channels) decoded, mixed and resampled at a time
_STFT_BLOCK = 1024  # spectrogram frames transformed at a time
_MEL_MAX_HZ = 8000.0  # Whisper's filter bank stops here whatever the rate
_LOG_FLOOR = 1e-10
_MIN_RATE, _MAX_RATE = 1000, 768_000


def decode_audio(data: bytes, limits: MediaLimits, *, rate: int = 16000, part: str = "audio") -> np.ndarray:
    """Mono float32 samples at `rate` from an encoded file; longer than max_audio_seconds is refused."""
    import soundfile

    if not data:
        raise MediaError(f"{part}: is empty (0 bytes); send {AUDIO_FORMATS} audio")
    from edge_infer.media.container import container_audio, container_format

    if (fmt := container_format(data)) is not None:  # a phone's voice memo, a browser's recording
        return container_audio(data, fmt, limits, rate, part)
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            mono = MonoStream(f.samplerate, rate, limits, part)
            if f.frames > 0:  # the header's length, refused before decoding anything
                limits.check("max_audio_seconds", f.frames / f.samplerate, part=part,
                             shown=f"{f.frames / f.samplerate:.1f} s")
            for block in f.blocks(max(1, DECODE_BLOCK_SAMPLES // f.channels), dtype="float32", always_2d=True):
                mono.add(block)
    except MediaError:
        raise
    except (RuntimeError, ValueError, TypeError, EOFError) as exc:  # LibsndfileError is a RuntimeError
        # libsndfile's "Error opening <_io.BytesIO object at 0x...>: " names our buffer, not the problem
        reason = re.sub(r"^Error opening <[^>]*>: ", "", str(exc))
        if "SF_INFO" in reason or "does not exist" in reason:  # its words for a bad header: its struct, or a pipe
            reason = "a damaged header, or a format variant libsndfile does not read"
        raise MediaError(f"{part}: cannot be decoded as {AUDIO_FORMATS} ({reason})") from None
    return mono.finish()


class MonoStream:
    """float32 [frames, channels] blocks at `source_rate`, mixed to mono (the channels' mean) and resampled to
    `rate` as they come (soxr, high quality: what librosa's default resampler is; its stream gives the samples
    resampling the whole clip gives). Only the output is kept, so a 768 kHz file costs no more than a 16 kHz one.
    Refused past max_audio_seconds, or when a sample is not a finite number."""

    def __init__(self, source_rate: int, rate: int, limits: MediaLimits, part: str):
        import soxr

        if not _MIN_RATE <= source_rate <= _MAX_RATE:
            raise MediaError(f"{part}: a sample rate of {source_rate} Hz is outside {_MIN_RATE}..{_MAX_RATE} Hz")
        self.source_rate, self.limits, self.part = source_rate, limits, part
        self._resampler = (soxr.ResampleStream(source_rate, rate, 1, dtype="float32", quality="HQ")
                           if source_rate != rate else None)
        self._out: list[np.ndarray] = []
        self.frames = 0  # source frames so far

    def add(self, block: np.ndarray) -> None:
        self.frames += len(block)
        self.limits.check("max_audio_seconds", self.frames / self.source_rate, part=self.part,
                          shown=f"more than {self.limits.max_audio_seconds:g} s")
        if not np.isfinite(block).all():  # float files can hold NaN or infinity: they would turn every logit NaN
            raise MediaError(f"{self.part}: has samples that are not finite numbers (NaN or infinity); send real samples")
        mono = block.mean(axis=1, dtype=np.float32)  # a copy, even of one channel: the caller may reuse its block
        self._out.append(mono if self._resampler is None else self._resampler.resample_chunk(mono, last=False))

    def finish(self) -> np.ndarray:
        if self.frames == 0:
            raise MediaError(f"{self.part}: has no audio samples; send a clip with sound (silence is fine)")
        if self._resampler is not None:
            self._out.append(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        return np.concatenate(self._out)


def audio_features(samples: np.ndarray, cfg: AudioProcessing, *, part: str = "audio") -> AudioFeatures:
    """A clip's features; a clip too short to give the audio tower one token is refused."""
    features = AudioFeatures(log_mel(samples, cfg)) if len(samples) else None  # a sample at 44.1 kHz resamples to none
    if features is None or features.num_tokens == 0:
        shortest = (2 * cfg.hop_length + 1) / cfg.sampling_rate
        raise MediaError(f"{part}: {len(samples) / cfg.sampling_rate * 1000:.0f} ms is too short for the audio "
                         f"encoder; send at least {shortest * 1000:.0f} ms")
    return features


def log_mel(samples: np.ndarray, cfg: AudioProcessing) -> np.ndarray:
    """float32 [feature_size, frames]: WhisperFeatureExtractor's features at the frames its attention mask keeps.

    The reference cuts the clip to n_samples, pads it with zeros to n_samples, takes a centered STFT
    (reflect padding at both ends of the padded clip), drops the last frame, then clamps every value to
    the clip's maximum minus 8 (log10 units). Frames past the clip read only zeros and sit at the floor,
    so the maximum is taken over the frames that read a real sample.
    """
    x = np.asarray(samples, dtype=np.float32).reshape(-1)[:cfg.n_samples]
    n, hop, half = len(x), cfg.hop_length, cfg.n_fft // 2
    if n == 0:
        raise MediaError("audio: has no samples")
    kept = min(-(-n // hop), cfg.n_samples // hop)  # the mask's ones: frames that start on a real sample
    touched = min(-(-(n + half) // hop), cfg.n_samples // hop)  # frames whose window reads a real sample
    # The padded clip as far as the touched frames read it; reflected past n_samples as the reference does.
    length = max(min(cfg.n_samples, (touched - 1) * hop + half), min(cfg.n_samples, half + 1))
    clip = np.zeros(length, dtype=np.float64)
    clip[:n] = x
    padded = np.pad(clip, half, mode="reflect")
    window = np.hanning(cfg.n_fft + 1)[:-1]  # periodic Hann, as torch.hann_window
    filters = _mel_filters(cfg.sampling_rate, cfg.n_fft, cfg.feature_size)
    frames = np.lib.stride_tricks.sliding_window_view(padded, cfg.n_fft)[::hop]
    log_spec = np.empty((touched, cfg.feature_size), dtype=np.float64)
    for start in range(0, touched, _STFT_BLOCK):
        block = frames[start:min(start + _STFT_BLOCK, touched)] * window
        power = np.abs(np.fft.rfft(block, axis=1)) ** 2
        log_spec[start:start + len(block)] = np.log10(np.maximum(power @ filters, _LOG_FLOOR))
    log_spec = np.maximum(log_spec[:kept], log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).T.astype(np.float32)


@lru_cache(maxsize=4)
def _mel_filters(rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels]: triangular filters on the Slaney mel scale, Slaney area-normalized, 0..8 kHz."""
    fft_hz = np.linspace(0, rate // 2, n_fft // 2 + 1)
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(_MEL_MAX_HZ), n_mels + 2))
    rising = (fft_hz[:, None] - edges_hz[None, :-2]) / np.diff(edges_hz)[:-1]
    falling = (edges_hz[None, 2:] - fft_hz[:, None]) / np.diff(edges_hz)[1:]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (edges_hz[2:] - edges_hz[:-2]))


# The Slaney mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4).
_LINEAR_HZ, _LINEAR_MELS, _LOG_STEP = 1000.0, 15.0, math.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    return 3.0 * hz / 200.0 if hz < _LINEAR_HZ else _LINEAR_MELS + math.log(hz / _LINEAR_HZ) / _LOG_STEP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    linear = 200.0 * mels / 3.0
    return np.where(mels >= _LINEAR_MELS, _LINEAR_HZ * np.exp(_LOG_STEP * (mels - _LINEAR_MELS)), linear)
