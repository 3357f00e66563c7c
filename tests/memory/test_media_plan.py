"""A thinker's plan tells what its media cost before anything loads: items, limits fitted or refused, the CLI."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

from edge_infer import plan_text_session
from edge_infer.cli import main as cli_main
from edge_infer.hardware.cpu import profile
from edge_infer.media.config import MediaProcessing, VisionProcessing
from edge_infer.media.image import MAX_ASPECT_RATIO, image_features, smart_resize
from edge_infer.media.limits import MediaLimits
from edge_infer.memory.encoder_sizing import (audio_input_bytes, calibration_prefix, encoder_activation_bytes,
                                              tower_weight_bytes, vision_input_bytes)
from edge_infer.memory.media_shapes import audio_frames, largest_resize, media_shapes
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_config import VisionConfig
from edge_infer.quant.native_build import missing_toolchain
from media.test_media_config import QWEN25_OMNI

MEDIA_ITEMS = {"vision encoder weights", "audio encoder weights", "encoder activations", "sequence media",
               "media preprocessing"}


@pytest.fixture(scope="module")
def omni(thinker_checkpoints, tmp_path_factory):
    """The tiny Omni thinker with Qwen2.5-Omni's own preprocessor_config.json (images to 12.8 MP, clips to 300 s)."""
    path = tmp_path_factory.mktemp("omni") / "thinker"
    shutil.copytree(thinker_checkpoints["qwen2_5_omni_thinker"], path)
    (path / "preprocessor_config.json").write_text(json.dumps(QWEN25_OMNI))
    return path


def plan(model, **kw):
    return plan_text_session(model, dtype="float32", max_model_len=2048, available_bytes=64 << 30, **kw)


def test_a_text_model_plans_as_before(tiny_model):
    p = plan(tiny_model, media_limits=MediaLimits())
    assert {i.name for i in p.items} == {"runtime overhead", "weights", "kv cache", "rope tables", "activations",
                                         "load transient", "checkpoint pages"}
    assert p.media_limits is None and "media_limits" not in p.settings and p.admitted


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen2_5_omni_thinker", "qwen2_5_omni"])
def test_a_thinker_plans_its_media(thinker_checkpoints, kind):
    path = thinker_checkpoints[kind]
    p = plan(path)
    names = {i.name for i in p.items}
    expected = MEDIA_ITEMS - ({"audio encoder weights"} if kind == "qwen2_5_vl" else set())
    assert expected <= names and p.admitted, p.table()
    assert all(p.item(n) > 0 for n in expected)
    # the encoders load beside the decoder: inside the load window
    assert p.load_peak_bytes == sum(p.item(n) for n in ("runtime overhead", "weights", "load transient")) + sum(
        p.item(n) for n in expected if n.endswith("encoder weights"))
    assert p.media_limits is not None and p.settings["media_limits"]["max_images"] == 4
    assert any("no vision preprocessing in preprocessor_config.json" in n for n in p.notes)  # none written
    vision = ModelConfig.from_dir(path).multimodal.vision
    assert p.item("vision encoder weights") == tower_weight_bytes(vision, 4, None)


def test_nothing_is_planned_for_a_kind_the_chat_template_refuses(synth_thinkers, tmp_path):
    # The same Qwen2.5-VL checkpoint with a template that renders images only (as the embedded demo's does).
    full = synth_thinkers["qwen2_5_vl"]
    images_only = tmp_path / "images-only"
    shutil.copytree(full, images_only)
    config = json.loads((images_only / "tokenizer_config.json").read_text())
    video = "{%- elif part.type in ['video', 'video_url'] %}"
    assert video in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(video, "{%- elif false %}")
    (images_only / "tokenizer_config.json").write_text(json.dumps(config))
    both, one = plan(full), plan(images_only)
    assert both.media_kinds == ("image", "video") and both.media_limits.max_videos == 1
    assert one.media_kinds == ("image",) and one.media_limits.max_videos == 0
    assert "the chat template renders no video parts: max_videos 0, nothing planned for them" in one.notes
    # planned as a server told --max-videos 0: the images get the context videos would have shared
    no_video = plan(full, media_limits={"max_videos": 0})
    assert one.media_limits == no_video.media_limits and one.steady_bytes == no_video.steady_bytes
    assert one.media_limits.max_image_tokens > both.media_limits.max_image_tokens


def test_the_plans_encoder_weights_are_the_loaded_bytes(thinker_checkpoints):
    import torch

    from edge_infer.models.encoders import load_encoders
    from edge_infer.models.layers.linear import onednn_bf16_available
    from edge_infer.models.loader import install_dense

    path = thinker_checkpoints["qwen2_5_omni"]
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        backend = "onednn" if torch_dtype == torch.bfloat16 and onednn_bf16_available() else "dense"
        towers = load_encoders(path, torch_dtype, install_dense(backend))
        p = plan_text_session(path, dtype=dtype, max_model_len=2048, available_bytes=64 << 30)
        for name, tower in zip(("vision", "audio"), towers):
            assert tower.resident_bytes() == p.item(f"{name} encoder weights"), (dtype, name)


def test_default_limits_fit_the_context_and_say_so(omni):
    p = plan(omni)
    limits, shapes = p.media_limits, media_shapes(p.media_limits, MediaProcessing.from_dir(omni))
    assert p.admitted, p.table()
    assert limits.max_image_tokens < QWEN25_OMNI["max_pixels"] // 28 ** 2 and limits.max_images == 4  # counts are kept
    # the context bounds the tokens an image is scaled down to, not the pictures a request may send
    assert limits.max_image_pixels == QWEN25_OMNI["max_pixels"]
    assert 2000 <= shapes.request_tokens <= 2047  # every kind at its limit, one token left to generate
    assert any(n.startswith("max_image_tokens defaulted to") and "--max-image-tokens" in n for n in p.notes)
    shorter = plan_text_session(omni, dtype="float32", max_model_len=1024, available_bytes=64 << 30)
    assert shorter.admitted and shorter.media_limits.max_image_tokens < limits.max_image_tokens


def test_limits_given_are_kept_or_refused_with_levers(omni):
    given = plan(omni, media_limits={"max_image_pixels": 448 * 448, "max_images": 1})
    assert given.admitted and given.media_limits.max_image_pixels == 448 * 448 and given.media_limits.max_images == 1
    refused = plan(omni, media_limits={"max_image_tokens": 16384})
    assert not refused.admitted and refused.engine_config is None
    reason = next(r for r in refused.reasons if "media tokens" in r)
    assert "4 image(s) of up to 16384 tokens (--max-image-tokens 16384)" in reason and "max_model_len=2048" in reason
    assert any(lever.startswith("--max-image-tokens ") for lever in refused.levers)
    lever = next(lever for lever in refused.levers if lever.startswith("--max-image-tokens "))
    fixed = plan(omni, media_limits={"max_image_tokens": int(lever.split()[1])})
    assert fixed.admitted, fixed.table()
    every = plan(omni, media_limits=MediaLimits(max_image_pixels=448 * 448, max_images=1, max_audio_seconds=120))
    assert not every.admitted and any(lever.startswith("--max-audio-seconds") for lever in every.levers)
    with pytest.raises(Exception, match="max_pictures"):
        plan(omni, media_limits={"max_pictures": 3})


def test_encoder_activations_are_sized_for_the_largest_item(omni):
    p = plan(omni, media_limits={"max_image_pixels": 448 * 448, "max_images": 1, "max_video_frames": 0,
                                 "max_audio_seconds": 10})
    shapes = media_shapes(p.media_limits, MediaProcessing.from_dir(omni))
    assert shapes.video_grid is None and shapes.audio_frames == 1000
    # the largest 448x448-pixel image is not the square one: rounding makes a thin one bigger
    assert shapes.image_grid[1] * shapes.image_grid[2] > 32 * 32
    note = next(i.note for i in p.items if i.name == "encoder activations")
    assert "patch grid 1x" in note and "1000 mel frames" in note
    assert "image(s) of up to" in p.settings["media_sized_for"]


def test_bf16_towers_are_planned_with_the_calibration_of_the_cpus_bf16_kernels(omni):
    # oneDNN's bf16 primitives hold different peaks on AVX512-BF16, on AMX's tile kernels and emulated on AVX-512
    # without bf16 arithmetic (an Ice Lake's encode held 40% more than the first's calibration): each CPU's plan
    # takes its own; fp32 has one for every CPU
    limits = {"max_image_pixels": 448 * 448, "max_images": 1, "max_video_frames": 0, "max_audio_seconds": 10}
    classes = {"avx512-bf16": "bf16", "amx": "bf16_amx", "avx512": "bf16_emulated", "avx2": "bf16"}
    items = {}
    for name, calibration in classes.items():
        cpu = profile(name)
        assert calibration_prefix("vision", 2, cpu) == f"encoder_vision_{calibration}_"
        items[name] = {dtype: plan_text_session(omni, dtype=dtype, max_model_len=2048, available_bytes=64 << 30,
                                                media_limits=limits, cpu=cpu).item("encoder activations")
                       for dtype in ("float32", "bfloat16")}
    assert len({i["float32"] for i in items.values()}) == 1
    assert len({items[name]["bfloat16"] for name in ("avx512-bf16", "amx", "avx512")}) == 3
    # emulated, a dense linear holds an fp32 copy of its output while it runs; quantized towers' int8 kernels do not
    vision = VisionConfig.from_dict(dict(depth=2, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                         out_hidden_size=2048, fullatt_block_indexes=[1]), split_qkv=True)
    dense, quantized = (encoder_activation_bytes(vision, 1024, 2, cpu=profile("avx512"), dense=d) for d in (True, False))
    assert dense > 1.2 * quantized
    assert len({encoder_activation_bytes(vision, 1024, 2, cpu=profile("avx512-bf16"), dense=d) for d in (True, False)}) == 1


def test_the_workers_block_cache_is_planned_as_one_encodes_activations(omni):
    """The worker keeps freed blocks for reuse up to one encode's activations beyond its live peak
    (quant/csrc/block_cache.cpp): an item of its own, and the budget the engine is configured with."""
    p = plan(omni)
    cache = p.item("block cache")
    if missing_toolchain() is not None:
        assert cache == 0 and p.engine_config.block_cache_bytes == 0
    else:
        assert cache == p.item("encoder activations") > 0 and p.engine_config.block_cache_bytes == cache
    assert plan(omni, media_limits={"max_images": 1, "max_image_pixels": 224 * 224, "max_audio_seconds": 1,
                                    "max_video_frames": 0}).item("block cache") <= cache


def test_sequence_media_are_each_items_input_or_its_embeddings(omni):
    """A sequence holds an item's features until it is encoded, then its embeddings only (engine/core.py drops the
    features): sized per item as the larger of the two, not both."""
    p = plan(omni, max_num_seqs=2, media_limits={"max_images": 1, "max_image_pixels": 448 * 448,
                                                 "max_video_frames": 0, "max_audio_seconds": 10})
    cfg = ModelConfig.from_dir(omni)
    shapes = media_shapes(p.media_limits, MediaProcessing.from_dir(omni))
    image_input, image_rows = vision_input_bytes(shapes.image_grid, cfg.multimodal.vision), shapes.image_tokens
    clip_input, clip_rows = audio_input_bytes(shapes.audio_frames, cfg.multimodal.audio), shapes.audio_tokens
    assert image_input > image_rows * cfg.hidden_size * 4 and clip_input < clip_rows * cfg.hidden_size * 4  # both ways
    per_sequence = image_input + clip_rows * cfg.hidden_size * 4
    assert p.item("sequence media") == 2 * per_sequence


def test_video_frames_given_keep_videos_on_at_a_smaller_frame_size(omni):
    """The frames of a video are scaled down to --max-image-tokens a pair as images are: with the frame count given,
    the frame size is what the plan lowers to fit the context, not the videos that are turned off."""
    p = plan(omni, media_limits={"max_video_frames": 8, "max_audio_seconds": 5})
    shapes = media_shapes(p.media_limits, MediaProcessing.from_dir(omni))
    assert p.admitted and shapes.video_frames == 8 and shapes.request_tokens <= 2047
    assert 0 < p.media_limits.max_image_tokens < QWEN25_OMNI["max_pixels"] // 28 ** 2
    assert any(n.startswith("max_image_tokens defaulted to") for n in p.notes)


@pytest.mark.parametrize("limit", [3136, 5000, 20000, 50000, 100352])
def test_the_largest_resize_is_the_largest_any_image_gives(limit):
    """Every (height, width) within the limit and the aspect ratio, resized, is at most the planned frame."""
    cfg = VisionProcessing(min_pixels=3136, max_pixels=12845056)
    planned = largest_resize(limit, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    best = 0
    for height in range(1, limit + 1):
        widest = min(limit // height, height * MAX_ASPECT_RATIO)
        if widest * MAX_ASPECT_RATIO < height:
            continue
        for width in range(max(1, math.ceil(height / MAX_ASPECT_RATIO)), widest + 1) if height < 60 else (widest,):
            h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
            best = max(best, h * w)
    assert planned[0] * planned[1] == best


@pytest.mark.parametrize("factor,min_pixels,max_pixels", [(4, 2048, 2048), (4, 2048, 6144), (6, 1800, 3600),
                                                       (6, 1800, 10800), (10, 2700, 2700), (28, 200000, 200000)])
def test_the_largest_resize_holds_in_a_narrow_pixel_range(factor, min_pixels, max_pixels):
    """Where max_pixels is lowered near min_pixels (a video's frames at a small token limit), every input, thin ones
    scaled up included, at every width, resizes to at most the planned frame, and one reaches it."""
    limit = 20000
    planned = largest_resize(limit, factor, min_pixels, max_pixels)
    best = max(math.prod(smart_resize(height, width, factor, min_pixels, max_pixels))
               for height in range(1, limit + 1)
               for width in range(math.ceil(height / MAX_ASPECT_RATIO),
                                  min(limit // height, height * MAX_ASPECT_RATIO) + 1))
    assert planned[0] * planned[1] == best


def test_planned_inputs_are_what_preprocessing_makes():
    """The features of the largest image and the longest clip have the planned shapes."""
    from PIL import Image

    from edge_infer.media.audio import log_mel
    from edge_infer.media.config import AudioProcessing

    cfg = VisionProcessing(min_pixels=3136, max_pixels=12845056)
    media = MediaProcessing(vision=cfg, audio=AudioProcessing(chunk_length=300))
    limit = 448 * 448
    shapes = media_shapes(MediaLimits(max_image_pixels=limit, max_audio_seconds=12.5), media)
    _, h, w = shapes.image_grid
    worst = next((width, height) for height in range(1, 7000) for width in [min(limit // height, 200 * height)]
                 if smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels) == (h * 14, w * 14))
    features = image_features(Image.new("RGB", worst), cfg)
    assert features.grid_thw == shapes.image_grid and worst[0] * worst[1] <= limit
    tower = VisionConfig(depth=1, hidden_size=16, num_heads=1, intermediate_size=16, out_hidden_size=16)
    assert features.pixel_values.nbytes == vision_input_bytes(shapes.image_grid, tower)
    assert log_mel(np.zeros(12 * 16000 + 8000, dtype=np.float32), media.audio).shape[1] == shapes.audio_frames
    assert audio_frames(400, media.audio) == 30000  # cut at the extractor's chunk_length (300 s)


def test_plan_cli_prints_and_carries_the_media_items(omni, capsys):
    assert cli_main(["plan", str(omni), "--dtype", "float32", "--max-model-len", "2048", "--max-images", "2",
                     "--max-audio-seconds", "20"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in MEDIA_ITEMS) and "media_sized_for" in out and "ADMITTED" in out
    assert cli_main(["plan", str(omni), "--dtype", "float32", "--max-model-len", "2048", "--json",
                     "--max-image-tokens", "16384"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert MEDIA_ITEMS <= {i["name"] for i in d["items"]} and d["settings"]["media_limits"]["max_image_tokens"] == 16384
    assert any("--max-image-tokens" in lever for lever in d["levers"])


def test_planning_media_does_not_import_torch(omni):
    code = (f"import sys; from edge_infer.memory.plan import plan_text_session; "
            f"p = plan_text_session({str(omni)!r}, max_model_len=2048); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(p.admitted)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "True"
