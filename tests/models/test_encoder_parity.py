"""The vision and audio encoders against transformers 5.24's modules, loaded from checkpoints transformers saved.

Tiny fp32 towers with odd shapes: heads not a power of two, windows that do
not divide the grid, several full-attention blocks, a non-square image, a
video with grid_t 2 and several items in one call; audio clips whose frames
are not a multiple of the chunk, chunks of an odd token count (pooled pairs
cross chunk edges), two clips. Weights are redrawn at unit scale so every
layer moves the output (transformers' 0.02 init leaves deep layers near
identity). Reached: vision max abs error <= 4e-6 on outputs of magnitude ~3; the
audio tower is bit-identical (same operations in the same order).
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from edge_infer.errors import CheckpointError
from edge_infer.models.encoder_config import AudioConfig, VisionConfig, audio_output_length, encoder_configs
from edge_infer.models.encoder_weights import tower_prefix
from edge_infer.models.encoders import load_encoder, load_encoders
from edge_infer.models.vision import VisionEncoder

TOLERANCE = 1e-4

TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
# Windows of 2 merged patches a side (56 px); fullatt blocks 0 and 2 of 4; 3 heads of 16.
VL_VISION = dict(depth=4, hidden_size=48, intermediate_size=40, num_heads=3, out_hidden_size=32, window_size=56,
                 fullatt_block_indexes=[0, 2])
# Windows of 3 merged patches a side (84 px); 5 heads of 8.
OMNI_VISION = dict(depth=4, hidden_size=40, intermediate_size=36, num_heads=5, out_hidden_size=32, window_size=84,
                   fullatt_block_indexes=[1, 3])
# Chunks of 10 frames -> 5 tokens (odd); 3 heads of 8.
AUDIO = dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=3, encoder_ffn_dim=40, d_model=24,
             output_dim=32, n_window=5, max_source_positions=64)
# Non-square image, a 2-frame video, a small image: grids (t, h, w) in patches.
GRIDS = [(1, 10, 14), (2, 6, 8), (1, 4, 4)]
CLIPS = [37, 23]


def redraw(model: torch.nn.Module) -> None:
    """Unit-scale random weights: norms near 1, matrices scaled by fan-in, biases small."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and ("norm" in name or "ln_" in name):
                p.copy_(1 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))


def save(model: torch.nn.Module, path) -> torch.nn.Module:
    redraw(model)
    model.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    path = tmp_path_factory.mktemp("vl")
    model = save(Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=TEXT, vision_config=VL_VISION)), path)
    return path, model.model.visual


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    path = tmp_path_factory.mktemp("thinker")
    config = Qwen2_5OmniThinkerConfig(text_config=TEXT, vision_config=OMNI_VISION, audio_config=AUDIO)
    model = save(Qwen2_5OmniThinkerForConditionalGeneration(config), path)
    return path, model.model.visual, model.model.audio_tower


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    """The whole Omni model (thinker, talker, token2wav): its towers sit under ``thinker.``."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    path = tmp_path_factory.mktemp("omni")
    talker = dict(TEXT, vocab_size=96, embedding_size=32)
    dit = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ff_mult=1, emb_dim=16, head_dim=16,
               enc_emb_dim=16, enc_dim=16, enc_channels=[16, 16, 16, 16, 32], enc_kernel_sizes=[5, 3, 3, 3, 1],
               enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=8, enc_res2net_scale=2, enc_se_channels=8,
               mel_dim=8, num_embeds=20, repeats=1)
    bigvgan = dict(mel_dim=8, upsample_initial_channel=16, resblock_kernel_sizes=[3],
                   resblock_dilation_sizes=[[1, 3, 5]], upsample_rates=[2], upsample_kernel_sizes=[4])
    config = Qwen2_5OmniConfig(
        thinker_config=dict(text_config=TEXT, vision_config=OMNI_VISION, audio_config=AUDIO), talker_config=talker,
        token2wav_config=dict(dit_config=dit, bigvgan_config=bigvgan))
    model = save(Qwen2_5OmniForConditionalGeneration(config), path)
    return path, model.thinker.model.visual, model.thinker.model.audio_tower


def pixels(grids, patch_dim: int, seed: int = 0) -> torch.Tensor:
    rows = sum(t * h * w for t, h, w in grids)
    return torch.randn(rows, patch_dim, generator=torch.Generator().manual_seed(seed))


def reference_vision(module, px, grids) -> torch.Tensor:
    with torch.no_grad():
        return module(px, grid_thw=torch.tensor(grids)).pooler_output


def reference_audio(module, clips: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        lengths = torch.tensor([c.shape[1] for c in clips])
        return module(torch.cat(clips, dim=1), feature_lens=lengths).last_hidden_state


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert ref.abs().max() > 0.5, "reference output too small to test anything"
    err = (ours - ref).abs().max().item()
    assert err < TOLERANCE, f"max abs error {err:.2e}"


@pytest.mark.parametrize("grids", [GRIDS, [(1, 10, 14)], [(2, 6, 8)], [(1, 12, 12), (1, 4, 6)]],
                         ids=["image+video+image", "non-square", "video", "windows-divide"])
@pytest.mark.parametrize("family", ["vl", "thinker"])
def test_vision_matches_transformers(request, family, grids):
    path, module = request.getfixturevalue(family)[:2]
    vision, _ = load_encoders(path, torch.float32)
    px = pixels(grids, vision.cfg.patch_dim)
    with torch.no_grad():
        ours = vision(px, grids)
    assert ours.shape[0] == sum(t * h * w for t, h, w in grids) // 4
    assert_close(ours, reference_vision(module, px, grids))


def test_vision_items_do_not_attend_to_each_other(thinker):
    """Encoding items together equals encoding each alone (no attention across images or frames)."""
    vision, _ = load_encoders(thinker[0], torch.float32)
    px = pixels(GRIDS, vision.cfg.patch_dim)
    with torch.no_grad():
        together = vision(px, GRIDS)
        alone = torch.cat([vision(part, [g]) for part, g in zip(px.split([t * h * w for t, h, w in GRIDS]), GRIDS)])
    assert (together - alone).abs().max().item() < 1e-5


@pytest.mark.parametrize("frames", [CLIPS, [40], [3], [11]], ids=["two-clips", "whole-chunks", "one-token", "chunk+1"])
def test_audio_matches_transformers(thinker, frames):
    path, _, module = thinker
    _, audio = load_encoders(path, torch.float32)
    gen = torch.Generator().manual_seed(2)
    clips = [torch.randn(AUDIO["num_mel_bins"], n, generator=gen) for n in frames]
    with torch.no_grad():
        ours = torch.cat([audio(c) for c in clips])
    lengths = module._get_feat_extract_output_lengths(torch.tensor(frames))[1].tolist()
    assert [audio_output_length(n) for n in frames] == lengths
    assert_close(ours, reference_audio(module, clips))


def test_audio_too_short_gives_no_tokens(thinker):
    _, audio = load_encoders(thinker[0], torch.float32)
    assert audio(torch.randn(AUDIO["num_mel_bins"], 2)).shape == (0, AUDIO["output_dim"])


def test_whole_omni_checkpoint_loads_from_thinker_prefix(omni):
    path, visual, audio_tower = omni
    vision, audio = load_encoders(path, torch.float32)
    px = pixels(GRIDS, vision.cfg.patch_dim, seed=3)
    with torch.no_grad():
        assert_close(vision(px, GRIDS), reference_vision(visual, px, GRIDS))
        clip = torch.randn(AUDIO["num_mel_bins"], 29)
        assert_close(audio(clip), reference_audio(audio_tower, [clip]))


def test_tower_prefixes_of_every_layout(vl, thinker, omni):
    from edge_infer.models.checkpoint import read_tensor_index

    keys = {name: set(read_tensor_index(d[0])) for name, d in (("vl", vl), ("thinker", thinker), ("omni", omni))}
    assert tower_prefix(keys["vl"], "vision") == "visual."
    assert tower_prefix(keys["thinker"], "vision") == "visual."
    assert tower_prefix(keys["thinker"], "audio") == "audio_tower."
    # read_tensor_index names a whole Omni model's thinker tensors canonically (models/checkpoint.py)
    assert tower_prefix(keys["omni"], "vision") == "visual."
    assert tower_prefix(keys["omni"], "audio") == "audio_tower."
    # transformers 4.5x saved Qwen2.5-VL with the towers under model.
    assert tower_prefix({"model." + k for k in keys["vl"]}, "vision") == "model.visual."
    with pytest.raises(CheckpointError, match="no audio tower.*conv1.weight"):
        tower_prefix(keys["vl"], "audio")
    with pytest.raises(CheckpointError, match="several vision towers"):
        tower_prefix(keys["vl"] | {"a." + k for k in keys["vl"]}, "vision")


def _rewrite(src, dst, drop: str = "", config_edit=None) -> None:
    """Copy a checkpoint, leaving out tensor ``drop`` and editing config.json."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k != drop}
    save_file(tensors, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    if config_edit:
        config_edit(config)
    (dst / "config.json").write_text(json.dumps(config))


def test_missing_weight_is_named(thinker, tmp_path):
    _rewrite(thinker[0], tmp_path / "c", drop="visual.blocks.2.attn.k.bias")
    with pytest.raises(CheckpointError, match="visual.blocks.2.attn.k.bias"):
        load_encoders(tmp_path / "c", torch.float32)


def test_wrong_shape_is_named(vl, tmp_path):
    _rewrite(vl[0], tmp_path / "c", config_edit=lambda c: c["vision_config"].update(intermediate_size=44))
    with pytest.raises(CheckpointError, match="visual.blocks.0.mlp.gate_proj.weight, visual.blocks.0.mlp.up_proj.weight "
                                              "give 80 rows; config.json implies 88"):
        load_encoders(tmp_path / "c", torch.float32)


def test_config_errors_name_the_key():
    with pytest.raises(CheckpointError, match="'out_hidden_size' is missing"):
        VisionConfig.from_dict({k: v for k, v in VL_VISION.items() if k != "out_hidden_size"}, split_qkv=False)
    with pytest.raises(CheckpointError, match="head_dim=10 must be a multiple of 4"):
        VisionConfig.from_dict(dict(VL_VISION, hidden_size=30), split_qkv=False)
    with pytest.raises(CheckpointError, match="'d_model' is missing"):
        AudioConfig.from_dict({k: v for k, v in AUDIO.items() if k != "d_model"})
    with pytest.raises(CheckpointError, match="no encoders"):
        encoder_configs({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})


def test_hub_config_spellings():
    """Hub Qwen2.5-VL configs spell in_channels 'in_chans' and carry no rope_parameters; the Omni config nests the thinker."""
    hub_vl = {"model_type": "qwen2_5_vl", "vision_config": dict(VL_VISION, in_chans=3)}
    vision, audio = encoder_configs(hub_vl)
    assert audio is None and not vision.split_qkv and vision.rope_theta == 10000.0 and vision.in_channels == 3
    whole = {"model_type": "qwen2_5_omni", "thinker_config": {"vision_config": OMNI_VISION, "audio_config": AUDIO}}
    vision, audio = encoder_configs(whole)
    assert vision.split_qkv and audio.n_window == 5


def test_quantized_kernels_install_into_the_encoders(thinker):
    """The engine's int4 installer packs every encoder linear; outputs stay near fp32's."""
    from edge_infer.config import QuantConfig
    from edge_infer.models.loader import install_dense
    from edge_infer.quant.install import quantized_installer
    from edge_infer.quant.kernel import Int4Kernel, require_int4_kernel

    try:
        require_int4_kernel()
    except Exception as exc:  # pragma: no cover - depends on the PyTorch build
        pytest.skip(str(exc))
    path = thinker[0]
    install = quantized_installer(QuantConfig(group_size=32), fallback=install_dense("dense"))
    dense, _ = load_encoders(path, torch.float32)
    vision = load_encoder(VisionEncoder(dense.cfg), path, torch.float32, install)
    assert all(isinstance(block.qkv.kernel, Int4Kernel) for block in vision.blocks)
    px = pixels(GRIDS, dense.cfg.patch_dim)
    with torch.no_grad():
        ref, out = dense(px, GRIDS), vision(px, GRIDS)
    assert ((out - ref).norm() / ref.norm()).item() < 0.25


def test_configs_and_specs_are_torch_free(vl):
    """The planner and the media layer size towers and count tokens without importing torch."""
    import subprocess
    import sys

    code = (
        "import sys, json; from edge_infer.models.encoder_config import encoder_configs, audio_output_length; "
        "from edge_infer.models.encoder_weights import vision_weight_specs; "
        f"v, _ = encoder_configs(json.load(open({str(vl[0] / 'config.json')!r}))); "
        "n = sum(s.numel for s in vision_weight_specs(v)); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(n, audio_output_length(3000))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = sum(p.numel() for p in vl[1].parameters())
    assert out.stdout.split() == [str(expected), "750"]
