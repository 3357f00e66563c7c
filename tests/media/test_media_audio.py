"""Audio: decoding, mono, resampling to 16 kHz, and log-mel equal to transformers' WhisperFeatureExtractor."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from media_files import audio_file, frames_of, recording, sine, video_file
from transformers import WhisperFeatureExtractor
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

from edge_infer.errors import MediaError
from edge_infer.media.audio import audio_features, decode_audio, log_mel
from edge_infer.media.config import AudioProcessing
from edge_infer.media.limits import MediaLimits

RATE = 16000
# transformers computes the spectrogram with torch.stft in float32 when torch is installed (here), and in
# float64 with numpy otherwise. We compute in float64: equal to the numpy path to float32 rounding, and to
# the float32 torch path within its own rounding (measured at most 4e-5 on features of magnitude ~1).
TOL_TORCH_PATH = 1e-4
TOL_NUMPY_PATH = 1e-6


def _speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = round(seconds * RATE)
    t = np.arange(n) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


def _omni_reference(samples: np.ndarray, chunk_length: int = 30):
    """What Qwen2.5-Omni's processor gives: padded to chunk_length with an attention mask over the real frames."""
    extractor = WhisperFeatureExtractor(feature_size=128, chunk_length=chunk_length)
    out = extractor(samples, sampling_rate=RATE, padding="max_length", return_attention_mask=True, return_tensors="np")
    frames = int(out["attention_mask"][0].sum())
    padded = np.zeros(extractor.n_samples, dtype=np.float32)
    padded[:min(len(samples), extractor.n_samples)] = samples[:extractor.n_samples]
    numpy_path = extractor._np_extract_fbank_features(padded[None], "cpu")[0]
    return out["input_features"][0][:, :frames], numpy_path[:, :frames], frames


@pytest.mark.parametrize("seconds", [0.02, 0.3, 0.999, 3.0137, 12.0, 30.0, 31.5])
def test_log_mel_equals_the_extractor_at_the_masked_frames(seconds):
    samples = _speechlike(seconds)
    expected, numpy_path, frames = _omni_reference(samples)
    got = log_mel(samples, AudioProcessing())
    assert got.shape == (128, frames) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=TOL_TORCH_PATH, rtol=0)
    np.testing.assert_allclose(got, numpy_path, atol=TOL_NUMPY_PATH, rtol=0)


def test_clips_past_the_chunk_are_cut_like_the_extractor():
    got = log_mel(_speechlike(31.5), AudioProcessing())
    assert got.shape == (128, 3000)  # 30 s of 10 ms frames


def test_omni_chunk_length_of_300_s():
    """Qwen2.5-Omni's checkpoints pad to 300 s: the maximum and the masked frames follow that padding."""
    samples = _speechlike(2.5, seed=3)
    expected, numpy_path, frames = _omni_reference(samples, chunk_length=300)
    got = log_mel(samples, AudioProcessing(chunk_length=300))
    assert got.shape == (128, frames)
    np.testing.assert_allclose(got, expected, atol=TOL_TORCH_PATH, rtol=0)
    np.testing.assert_allclose(got, numpy_path, atol=TOL_NUMPY_PATH, rtol=0)


def test_a_click_in_the_last_window_sets_the_maximum_as_in_the_reference():
    """The frame after the last masked one still reads the clip's end; the reference's maximum includes it.

    960 samples: the mask keeps frames 0-5; frame 6 is centred on the last samples, frame 5 sees them
    through its window's tail, so the loudest frame is one the mask drops.
    """
    samples = np.zeros(960, dtype=np.float32)
    samples[-3:] = 0.9
    expected, numpy_path, _ = _omni_reference(samples)
    got = log_mel(samples, AudioProcessing())
    np.testing.assert_allclose(got, numpy_path, atol=TOL_NUMPY_PATH, rtol=0)
    np.testing.assert_allclose(got, expected, atol=TOL_TORCH_PATH, rtol=0)


def test_silence_is_valid_and_equals_the_reference():
    samples = np.zeros(RATE, dtype=np.float32)
    expected, _, _ = _omni_reference(samples)
    got = audio_features(samples, AudioProcessing())
    np.testing.assert_array_equal(got.mel, expected)
    assert got.num_tokens == 25  # 1 s: 100 frames -> 25 tokens


def test_a_clip_that_resamples_to_no_samples_is_too_short_by_name():
    """One sample at 44.1 kHz is none at 16 kHz: refused as any clip too short, naming the part."""
    samples = decode_audio(audio_file(np.full((1, 1), 0.5, np.float32), 44100, "WAV"), MediaLimits(), part="audio 2")
    assert len(samples) == 0
    with pytest.raises(MediaError, match=r"^audio 2: 0 ms is too short for the audio encoder; send at least 20 ms$"):
        audio_features(samples, AudioProcessing(), part="audio 2")


@pytest.mark.parametrize("frames", [1, 2, 3, 4, 5, 99, 100, 101, 3000])
def test_num_tokens_is_the_audio_towers_output_length(frames):
    samples = np.ones(frames * 160, dtype=np.float32) * 0.1
    features = audio_features(samples, AudioProcessing()) if frames >= 3 else None
    expected = int(_get_feat_extract_output_lengths(np.array(frames)))
    if features is None:
        assert expected == 0
        with pytest.raises(MediaError, match=r"audio 2: \d+ ms is too short for the audio encoder; send at least 20 ms"):
            audio_features(samples, AudioProcessing(), part="audio 2")
    else:
        assert features.frames == frames and features.num_tokens == expected


@pytest.mark.parametrize("fmt,subtype", [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"),
                                         ("MP3", "MPEG_LAYER_III")])
def test_files_decode_to_their_samples(fmt, subtype):
    source = sine(1.0, RATE, hz=500)
    decoded = decode_audio(audio_file(source, RATE, fmt, subtype), MediaLimits())
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    if fmt in ("WAV", "FLAC"):  # lossless: the samples back, to 16-bit quantization
        assert len(decoded) == RATE
        np.testing.assert_allclose(decoded, source[:, 0], atol=1 / 32768 if subtype == "PCM_16" else 0)
    else:  # lossy: the same tone (codec delay shifts it; compare spectra)
        assert abs(len(decoded) - RATE) < 0.1 * RATE
        spectrum = np.abs(np.fft.rfft(decoded))
        assert abs(np.argmax(spectrum) * RATE / len(decoded) - 500) < 5


@pytest.mark.parametrize("fmt,codec", [("ipod", "aac"), ("webm", "libopus")])
def test_voice_memos_and_browser_recordings_decode_to_their_tone(fmt, codec):
    """A phone's voice memo (AAC in M4A) and a browser's MediaRecorder clip (Opus in WebM), which libsndfile does
    not read, decode through FFmpeg to the same tone at the model's rate."""
    decoded = decode_audio(recording(sine(1.0, 48000, hz=500), 48000, fmt, codec), MediaLimits())
    assert decoded.dtype == np.float32 and decoded.ndim == 1
    assert abs(len(decoded) - RATE) < 0.02 * RATE
    spectrum = np.abs(np.fft.rfft(decoded))
    assert abs(np.argmax(spectrum) * RATE / len(decoded) - 500) < 5
    assert 0.27 < np.abs(decoded).max() < 0.33  # the tone's amplitude, 0.3


def test_a_recording_is_held_to_the_limits_and_needs_sound():
    long = recording(sine(2.5, 48000), 48000)
    with pytest.raises(MediaError, match=r"^audio 3: 2\.5 s is above the limit of 2 seconds of audio per clip "
                                         r"\(--max-audio-seconds\)"):
        decode_audio(long, MediaLimits(max_audio_seconds=2.0), part="audio 3")
    with pytest.raises(MediaError, match=r"^audio 3: the mp4 file has no audio stream; send a clip with sound$"):
        decode_audio(video_file(frames_of(4), fps=2), MediaLimits(), part="audio 3")
    with pytest.raises(MediaError, match=r"^audio 3: cannot be decoded as mp4 audio"):
        decode_audio(long[:200], MediaLimits(), part="audio 3")


def test_stereo_is_mixed_to_the_mean_of_its_channels():
    stereo = sine(1.2, RATE, hz=300, channels=2)
    decoded = decode_audio(audio_file(stereo, RATE, "WAV", "FLOAT"), MediaLimits())
    mono = stereo.mean(axis=1)
    np.testing.assert_array_equal(decoded, mono)
    expected, _, _ = _omni_reference(mono)
    np.testing.assert_allclose(log_mel(decoded, AudioProcessing()), expected, atol=TOL_TORCH_PATH, rtol=0)


@pytest.mark.parametrize("source_rate", [44100, 48000, 8000, 22050])
def test_resampling_to_16k_keeps_a_tone(source_rate):
    """soxr's band-limited resampling of a tone below both Nyquist rates is that tone sampled at 16 kHz.

    The reference is the analytic sine at 16 kHz. Away from the clip's edges (the filter's settling, 10 ms)
    the difference must stay below 1e-5 of full scale (soxr HQ measured at most 1.2e-6 for these rates).
    """
    hz = 1000.0
    source = sine(1.0, source_rate, hz=hz)
    data = audio_file(source, source_rate, "WAV", "FLOAT")
    got = decode_audio(data, MediaLimits())
    assert len(got) == RATE
    reference = sine(1.0, RATE, hz=hz)[:, 0]
    edge = RATE // 100
    assert np.max(np.abs(got[edge:-edge] - reference[edge:-edge])) < 1e-5
    at_rate = reference[:, None].astype(np.float32)  # at the model's rate already: passed through as it is
    np.testing.assert_array_equal(decode_audio(audio_file(at_rate, RATE, "WAV", "FLOAT"), MediaLimits()), at_rate[:, 0])


def test_decoded_audio_goes_to_the_models_rate():
    got = decode_audio(audio_file(sine(0.5, 48000), 48000, "WAV", "FLOAT"), MediaLimits(), rate=24000)
    assert len(got) == 12000


def test_empty_and_undecodable_audio_are_refused():
    with pytest.raises(MediaError,
                       match=r"^audio 1: is empty \(0 bytes\); send WAV, MP3, FLAC, OGG, M4A or WebM audio$"):
        decode_audio(b"", MediaLimits(), part="audio 1")
    with pytest.raises(MediaError, match=r"^audio 1: cannot be decoded as WAV, MP3, FLAC, OGG, M4A or WebM \(.+\)$"):
        decode_audio(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 4, MediaLimits(), part="audio 1")
    with pytest.raises(MediaError, match=r"^audio 1: cannot be decoded as WAV, MP3, FLAC, OGG, M4A or WebM"):
        decode_audio(bytes(range(256)) * 8, MediaLimits(), part="audio 1")


def test_undecodable_audio_is_refused_without_naming_our_buffer():
    with pytest.raises(MediaError) as err:
        decode_audio(b"\x00\x01garbage" * 100, MediaLimits(), part="audio 1")
    assert str(err.value) == "audio 1: cannot be decoded as WAV, MP3, FLAC, OGG, M4A or WebM (Format not recognised.)"
    # a WAV header claiming 4 GHz: libsndfile speaks of its own struct
    header = (b"RIFF" + struct.pack("<I", 36) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 4_000_000_000,
                                                                          4_000_000_000, 2, 16) + b"data" + bytes(4))
    with pytest.raises(MediaError) as err:
        decode_audio(header, MediaLimits(), part="audio 1")
    assert str(err.value) == ("audio 1: cannot be decoded as WAV, MP3, FLAC, OGG, M4A or WebM (a damaged header, "
                              "or a format variant libsndfile does not read)")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_samples_that_are_not_finite_are_refused(bad):
    # a float WAV holds them as readily as numbers; encoded, they would make every logit of the request NaN
    samples = sine(1.0, RATE)
    samples[RATE // 2] = bad
    with pytest.raises(MediaError, match=r"^audio 1: has samples that are not finite numbers \(NaN or infinity\); "
                                         r"send real samples$"):
        decode_audio(audio_file(samples, RATE, "WAV", "FLOAT"), MediaLimits(), part="audio 1")


def test_a_file_without_samples_is_refused():
    empty = audio_file(np.zeros((0, 1), dtype=np.float32), RATE, "WAV", "PCM_16")
    with pytest.raises(MediaError, match=r"^audio 1: has no audio samples; send a clip with sound \(silence is fine\)$"):
        decode_audio(empty, MediaLimits(), part="audio 1")


def test_too_long_audio_is_refused_naming_the_limit():
    data = audio_file(sine(2.5, RATE), RATE, "FLAC", "PCM_16")
    with pytest.raises(MediaError) as err:
        decode_audio(data, MediaLimits(max_audio_seconds=2.0), part="audio 3")
    assert str(err.value) == ("audio 3: 2.5 s is above the limit of 2 seconds of audio per clip "
                              "(--max-audio-seconds); cut it or raise --max-audio-seconds")
    assert len(decode_audio(data, MediaLimits(max_audio_seconds=2.5))) == 40000


def test_absurd_sample_rates_are_refused():
    with pytest.raises(MediaError, match=r"audio: a sample rate of 500 Hz is outside 1000\.\.768000 Hz"):
        decode_audio(audio_file(np.zeros((100, 1), np.float32), 500, "WAV", "PCM_16"), MediaLimits())


@pytest.mark.parametrize("rate,channels", [(768_000, 1), (192_000, 8), (48_000, 2)])
def test_a_clip_decodes_in_what_the_plan_gives_it_whatever_its_rate(rate, channels):
    """Samples are resampled a block at a time: a 768 kHz clip once held 48x its output at its own rate (two
    such requests at once took the server 3x past the plan's preprocessing item). Numpy's buffers are traced."""
    import tracemalloc

    from edge_infer.memory.encoder_sizing import audio_decode_bytes

    data = audio_file(np.repeat(sine(5.0, rate), channels, axis=1) * 0.5, rate, "WAV", "PCM_16")
    tracemalloc.start()
    try:
        got = decode_audio(data, MediaLimits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 5 * RATE
    assert peak <= audio_decode_bytes(len(got))
