"""The plan's encoder activation item against one measured encode: the largest image, the longest clip.

Each encode runs in a fresh process (memory/encoder_probe.py: the towers loaded from a checkpoint
transformers wrote, glibc's mmap threshold pinned as in an engine worker) and its RssAnon growth, by a
sampler and by the kernel's high-water mark, is compared with what the plan sized for the same limits.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edge_infer import plan_text_session
from edge_infer.media.config import MediaProcessing
from edge_infer.memory.media_shapes import media_shapes
from media.test_media_config import QWEN25_OMNI
from testutil import write_thinker_checkpoint

pytestmark = pytest.mark.slow
# Towers wide enough that an encode's tensors, not the fixed scratch around them, are what is measured.
VISION = dict(hidden_size=256, intermediate_size=512, num_heads=8)
AUDIO = dict(num_mel_bins=128, d_model=512, encoder_ffn_dim=1024, encoder_attention_heads=8, n_window=100,
             max_source_positions=1500)
LIMITS = {
    "image": {"max_images": 1, "max_image_pixels": 896 * 896, "max_video_frames": 0, "max_audio_seconds": 1},
    "audio": {"max_images": 0, "max_video_frames": 0, "max_audio_seconds": 60},
}
# bf16 on every CPU: where bf16 is emulated (dtype auto's choice beside quantized linears) these dense towers'
# products run emulated and their front ends in fp32 (encoder_sizing.products_bytes); the plan holds either way.
DTYPES = ["float32", "bfloat16"]
THREADS = min(2, len(os.sched_getaffinity(0)))  # as memory/overhead.json was calibrated


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    path = write_thinker_checkpoint(tmp_path_factory.mktemp("wide") / "omni", "qwen2_5_omni_thinker", vision=VISION,
                                    audio=AUDIO)
    (path / "preprocessor_config.json").write_text(json.dumps(QWEN25_OMNI))
    return path


def measure(path, dtype: str, args: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "edge_infer.memory.encoder_probe", "--checkpoint", str(path),
                          "--dtype", dtype, "--threads", str(THREADS), *args],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["image", "audio"])
def test_the_encoder_activation_item_is_one_encodes_measured_peak(omni, kind, dtype):
    plan = plan_text_session(omni, dtype=dtype, max_model_len=2048, available_bytes=64 << 30,
                             media_limits=LIMITS[kind])
    assert plan.admitted, plan.table()
    shapes = media_shapes(plan.media_limits, MediaProcessing.from_dir(omni))
    if kind == "image":
        args = ["--image-grid", *map(str, shapes.image_grid)]
        assert shapes.image_grid[1] * shapes.image_grid[2] > 64 * 64  # the thin worst case, not the square image
    else:
        args = ["--audio-frames", str(shapes.audio_frames)]
        assert shapes.audio_frames == 6000
    measured = measure(omni, dtype, args)
    planned = plan.item("encoder activations")
    assert measured["mmap_threshold_pinned"] and measured["weight_bytes"] == plan.item(
        ("vision" if kind == "image" else "audio") + " encoder weights")
    assert 0.9 * measured["peak_bytes"] <= planned <= 1.1 * measured["peak_bytes"], \
        f"planned {planned:,} B, measured {measured}"
