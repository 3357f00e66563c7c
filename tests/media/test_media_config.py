"""Processor settings from a checkpoint's files; anything edge-infer does not implement is refused by key and file."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import WhisperFeatureExtractor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from edge_infer.errors import CheckpointError, InvalidRequestError, MediaError
from edge_infer.media.config import AudioProcessing, MediaProcessing, VisionProcessing
from edge_infer.media.limits import MediaLimits

CLIP = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
# The files as the released checkpoints ship them.
QWEN25_VL = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
             **CLIP, "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}
QWEN25_OMNI = {"chunk_length": 300, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor",
               "feature_size": 128, "hop_length": 160, **CLIP, "image_processor_type": "Qwen2VLImageProcessor",
               "max_pixels": 12845056, "merge_size": 2, "min_pixels": 3136, "n_fft": 400, "n_samples": 4800000,
               "nb_max_frames": 30000, "padding_side": "right", "padding_value": 0.0, "patch_size": 14,
               "processor_class": "Qwen2_5OmniProcessor", "return_attention_mask": True, "sampling_rate": 16000,
               "temporal_patch_size": 2}
VIDEO = {"video_processor_type": "Qwen2VLVideoProcessor", "fps": 1.5, "min_frames": 2, "max_frames": 64,
         "size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 256 * 28 * 28}, "do_sample_frames": False,
         "resample": 3, "rescale_factor": 1 / 255, **CLIP, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
         "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True}


def _write(directory: Path, name: str, data: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data))
    return directory


def test_qwen25_vl_takes_images_only(tmp_path):
    media = MediaProcessing.from_dir(_write(tmp_path, "preprocessor_config.json", QWEN25_VL))
    assert media.audio is None
    assert media.vision == VisionProcessing(min_pixels=3136, max_pixels=12845056)


def test_qwen25_omni_takes_images_and_audio(tmp_path):
    media = MediaProcessing.from_dir(_write(tmp_path, "preprocessor_config.json", QWEN25_OMNI))
    assert media.vision == VisionProcessing(min_pixels=3136, max_pixels=12845056)
    assert media.audio == AudioProcessing(chunk_length=300)
    assert media.audio.n_samples == 4_800_000


def test_a_text_checkpoint_takes_no_media(tmp_path):
    assert MediaProcessing.from_dir(tmp_path) == MediaProcessing(None, None)


def test_files_the_processors_save_are_read(tmp_path):
    image_dir = tmp_path / "image"
    image_dir.mkdir()
    Qwen2VLImageProcessorPil(min_pixels=1000, max_pixels=90000).to_json_file(image_dir / "preprocessor_config.json")
    assert MediaProcessing.from_dir(image_dir).vision == VisionProcessing(min_pixels=1000, max_pixels=90000)
    audio_dir = tmp_path / "audio"
    audio_dir.mkdir()
    WhisperFeatureExtractor(feature_size=80, chunk_length=20).to_json_file(audio_dir / "preprocessor_config.json")
    assert MediaProcessing.from_dir(audio_dir) == MediaProcessing(None, AudioProcessing(feature_size=80, chunk_length=20))


def test_video_settings_come_from_the_video_file(tmp_path):
    _write(tmp_path, "preprocessor_config.json", QWEN25_OMNI)
    media = MediaProcessing.from_dir(_write(tmp_path, "video_preprocessor_config.json", VIDEO))
    assert (media.vision.video_fps, media.vision.video_min_frames, media.vision.video_max_frames) == (1.5, 2, 64)
    assert (media.vision.video_min_pixels, media.vision.video_max_pixels) == (4 * 28 * 28, 256 * 28 * 28)
    assert (media.vision.min_pixels, media.vision.max_pixels) == (3136, 12845056)  # images keep theirs


def test_a_nested_processor_config_is_read(tmp_path):
    image = {k: v for k, v in QWEN25_OMNI.items() if k in QWEN25_VL}
    audio = {k: v for k, v in QWEN25_OMNI.items() if k not in QWEN25_VL or k == "processor_class"}
    nested = {"processor_class": "Qwen2_5OmniProcessor", "image_processor": image, "feature_extractor": audio,
              "video_processor": VIDEO, "seconds_per_chunk": 2.0, "position_id_per_seconds": 25}
    media = MediaProcessing.from_dir(_write(tmp_path, "processor_config.json", nested))
    assert media.audio == AudioProcessing(chunk_length=300)
    assert media.vision.video_fps == 1.5 and media.vision.max_pixels == 12845056


def test_the_same_settings_in_two_files_must_agree(tmp_path):
    _write(tmp_path, "preprocessor_config.json", QWEN25_VL)
    _write(tmp_path, "processor_config.json", {"image_processor": {**QWEN25_VL, "max_pixels": 1003520}})
    with pytest.raises(CheckpointError, match=r"preprocessor_config.json and .*processor_config.json \(image_processor\) "
                                              r"disagree on max_pixels; keep one of them"):
        MediaProcessing.from_dir(tmp_path)


@pytest.mark.parametrize("change,message", [
    ({"image_processor_type": "SiglipImageProcessor"},
     r"'image_processor_type' is 'SiglipImageProcessor'; edge-infer implements only Qwen2VLImageProcessor"),
    ({"shiny_new_option": 1}, r"'shiny_new_option' is not a key edge-infer knows"),
    ({"size": {"shortest_edge": 4000, "longest_edge": 12845056}},
     r"'min_pixels' contradicts size: \[3136, 4000\]; keep one value"),
    ({"size": {"height": 224, "width": 224}}, r"'size' has 'height'; edge-infer resizes by a pixel range"),
    ({"min_pixels": 20000000}, r"'min_pixels' 20000000 is above max_pixels 12845056"),
    ({"patch_size": 0}, r"'patch_size' must be > 0, got 0"),
    ({"patch_size": "14"}, r"'patch_size' must be int, got '14'"),
    ({"image_mean": [0.5, 0.5]}, r"'image_mean' must be 3 numbers \(R, G, B\)"),
    ({"image_std": [0.5, 0.0, 0.5]}, r"'image_std' must be > 0"),
    ({"do_resize": False}, r"'do_resize' is False; edge-infer supports only True"),
    ({"do_center_crop": True}, r"'do_center_crop' is True; edge-infer supports only False"),
    ({"resample": 9}, r"'resample' is 9; Pillow's filters are"),
    ({"n_samples": 480000}, r"'n_samples' is 480000 but chunk_length, sampling_rate and hop_length give 4800000"),
    ({"nb_max_frames": 3000}, r"'nb_max_frames' is 3000 but .* give 30000"),
    ({"dither": 1e-4}, r"'dither' is 0.0001; edge-infer supports only 0.0"),
    ({"padding_side": "left"}, r"'padding_side' is 'left'; edge-infer supports only 'right'"),
    ({"feature_extractor_type": "SeamlessM4TFeatureExtractor"},
     r"'feature_extractor_type' is 'SeamlessM4TFeatureExtractor'; edge-infer implements only WhisperFeatureExtractor"),
    ({"hop_length": 500}, r"'hop_length' 500 is above n_fft 400"),
])
def test_unsupported_settings_are_refused_naming_key_and_file(tmp_path, change, message):
    path = tmp_path / "preprocessor_config.json"
    _write(tmp_path, path.name, {**QWEN25_OMNI, **change})
    with pytest.raises(CheckpointError, match=f"^{path}: {message}"):
        MediaProcessing.from_dir(tmp_path)


@pytest.mark.parametrize("change,message", [
    ({"merge_size": 3}, r"'merge_size' is 3 but the image processor's is 2; edge-infer runs one vision pipeline"),
    ({"image_mean": [0.5, 0.5, 0.5]}, r"'image_mean' is \(0.5, 0.5, 0.5\) but the image processor's is"),
    ({"num_frames": 16}, r"'num_frames' is set; edge-infer samples videos by fps"),
    ({"cap_pixels_per_frame": True}, r"'cap_pixels_per_frame' is True; edge-infer supports only False"),
    ({"min_frames": 100}, r"'min_frames' 100 is above max_frames 64"),
    ({"video_processor_type": "LlavaNextVideoProcessor"}, r"'video_processor_type' is 'LlavaNextVideoProcessor'"),
])
def test_unsupported_video_settings_are_refused(tmp_path, change, message):
    _write(tmp_path, "preprocessor_config.json", QWEN25_OMNI)
    path = tmp_path / "video_preprocessor_config.json"
    _write(tmp_path, path.name, {**VIDEO, **change})
    with pytest.raises(CheckpointError, match=f"^{path}: {message}"):
        MediaProcessing.from_dir(tmp_path)


def test_broken_files_are_refused(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"preprocessor_config.json is not valid JSON .*; restore the file"):
        MediaProcessing.from_dir(tmp_path)
    _write(tmp_path, "preprocessor_config.json", {"processor_class": "X"})
    with pytest.raises(CheckpointError, match=r"names neither an image_processor_type nor a feature_extractor_type"):
        MediaProcessing.from_dir(tmp_path)
    video_only = _write(tmp_path / "v", "video_preprocessor_config.json", VIDEO)
    with pytest.raises(CheckpointError, match=r"configures videos but no file configures images"):
        MediaProcessing.from_dir(video_only)


def test_limits_default_to_the_checkpoints_image_size(tmp_path):
    media = MediaProcessing.from_dir(_write(tmp_path, "preprocessor_config.json", {**QWEN25_VL, "max_pixels": 2000000}))
    # rounded up: the checkpoint's own processing is unchanged (a cap 400 pixels below max_pixels would move grids)
    assert MediaLimits.for_processing(media).max_image_tokens == -(-2000000 // (28 * 28))
    # pictures people send (a 4K screenshot) are decoded and scaled down, not refused
    assert MediaLimits.for_processing(media).max_image_pixels == 3840 * 2160
    big = MediaProcessing.from_dir(_write(tmp_path, "preprocessor_config.json", {**QWEN25_VL, "max_pixels": 20000000}))
    assert MediaLimits.for_processing(big).max_image_pixels == 20000000  # what the processor itself would encode
    small = MediaProcessing.from_dir(_write(tmp_path, "preprocessor_config.json", {**QWEN25_VL, "max_pixels": 112 * 112}))
    assert MediaLimits.for_processing(small).max_image_tokens == 768  # its video frames' range is the larger
    assert MediaLimits.for_processing(media, max_images=2).max_images == 2
    assert MediaLimits.for_processing(MediaProcessing()) == MediaLimits()
    with pytest.raises(ValueError, match=r"max_audio_seconds \(--max-audio-seconds\) must be a number >= 0, got -1"):
        MediaLimits(max_audio_seconds=-1)


def test_limit_refusals_name_the_part_the_limit_and_the_lever():
    with pytest.raises(MediaError) as err:
        MediaLimits().check("max_images", 5, part="request", shown="5 images")
    assert str(err.value) == ("request: 5 images is above the limit of 4 images per request (--max-images); "
                              "send fewer images or raise --max-images")
    assert isinstance(err.value, InvalidRequestError)  # the server answers it with a 400
    MediaLimits().check("max_images", 4, part="request")  # at the limit is fine


def test_media_preprocessing_does_not_import_torch(tmp_path):
    """The frontend prepares media: nothing here may pull in torch or transformers."""
    code = f"""
import io, sys
import numpy as np
from PIL import Image
from edge_infer.media.audio import audio_features, decode_audio
from edge_infer.media.config import MediaProcessing
from edge_infer.media.image import decode_image, image_features
from edge_infer.media.limits import MediaLimits
from edge_infer.media.sources import MediaPolicy, read_source
from edge_infer.media.video import video_features
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from media_files import audio_file, frames_of, sine, video_file
media = MediaProcessing.from_dir({str(_write(tmp_path, "preprocessor_config.json", QWEN25_OMNI))!r})
buf = io.BytesIO(); Image.new("RGB", (50, 40)).save(buf, format="PNG")
image_features(decode_image(buf.getvalue(), MediaLimits()), media.vision)
audio_features(decode_audio(audio_file(sine(0.5, 44100), 44100, "WAV"), MediaLimits()), media.audio)
video_features(video_file(frames_of(4), fps=2, audio=sine(2.0, 48000)[:, 0]), media, MediaLimits())
read_source("data:image/png;base64,AAAA", MediaPolicy())
heavy = [m for m in ("torch", "transformers", "torchvision") if m in sys.modules]
assert not heavy, heavy
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
