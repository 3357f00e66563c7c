"""The vision and audio encoders against transformers 5.24's modules, loaded from checkpoints transformers saved.

Tiny fp32 towers (and bf16 ones against them) with odd shapes: heads not a power of two, windows that do
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

import pytest
import torch

from testutil import unit_scale
from edge_infer.errors import CheckpointError
from edge_infer.models.checkpoint import read_tensor_index
from edge_infer.models.config import ModelConfig
from edge_infer.models.encoder_config import AudioConfig, VisionConfig, audio_output_length
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


def save(model: torch.nn.Module, path) -> torch.nn.Module:
    unit_scale(model)
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


@pytest.mark.parametrize("native_bf16", [False, True], ids=["bf16-emulated", "bf16-native"])
def test_bf16_towers_track_the_fp32_ones(thinker, monkeypatch, native_bf16):
    """bf16 towers give bf16 tokens within bf16's rounding of the fp32 towers'. Where the CPU has no bf16
    arithmetic the front ends (the patch embedding, the audio convolutions) multiply in fp32 and round once, as
    PyTorch's emulated bf16 products run 9-37x slower; where it has, in bf16 (each stood in for here)."""
    products = (lambda d: d) if native_bf16 else (lambda d: torch.float32)
    for module in ("vision", "audio_encoder"):
        monkeypatch.setattr(f"edge_infer.models.{module}.products_dtype", products)
    vision32, audio32 = load_encoders(thinker[0], torch.float32)
    vision16, audio16 = load_encoders(thinker[0], torch.bfloat16)
    px, mel = pixels(GRIDS, vision32.cfg.patch_dim), torch.randn(AUDIO["num_mel_bins"], 37)
    with torch.no_grad():
        pairs = [(vision16(px, GRIDS), vision32(px, GRIDS)), (audio16(mel), audio32(mel)),
                 (audio16.embed(mel)[0], audio32.embed(mel)[0])]
    for ours, ref in pairs:
        assert ours.dtype == torch.bfloat16 and ours.shape == ref.shape
        assert (ours.float() - ref).abs().max() <= 0.02 * ref.abs().max()


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


def test_every_layout_keeps_the_towers_under_their_canonical_names(vl, thinker, omni):
    """The whole Omni model's thinker. prefix is dropped when the index is read (models/checkpoint.py)."""
    vision = {"visual.patch_embed.proj.weight", "visual.merger.ln_q.weight"}
    audio = {"audio_tower.conv1.weight", "audio_tower.ln_post.weight"}
    assert vision <= set(read_tensor_index(vl[0])) and not audio & set(read_tensor_index(vl[0]))
    for path in (thinker[0], omni[0]):
        assert vision | audio <= set(read_tensor_index(path))


def test_a_checkpoint_without_a_tower_says_so(vl, hf_checkpoints, tmp_path):
    _rewrite(vl[0], tmp_path / "c", drop="visual.")
    with pytest.raises(CheckpointError, match=r"has no vision tower: no tensor is named 'visual\.\*'"):
        load_encoders(tmp_path / "c", torch.float32)
    with pytest.raises(CheckpointError, match="holds a text model .* it has no media encoders"):
        load_encoders(hf_checkpoints["qwen2"], torch.float32)


def _rewrite(src, dst, drop: str = "", config_edit=None) -> None:
    """Copy a checkpoint, leaving out the tensors whose names start with ``drop`` and editing config.json."""
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if not drop or not k.startswith(drop)}
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


def test_hub_config_spellings():
    """Hub Qwen2.5-VL configs keep the text keys flat, spell in_channels 'in_chans' and carry no rope_parameters for
    the ViT; the hub's Omni config (Qwen2_5OmniModel) nests the thinker. ModelConfig parses the towers with the rest."""
    hub_vl = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], **TEXT, "vision_config": dict(VL_VISION, in_chans=3)}
    mm = ModelConfig.from_dict(hub_vl).multimodal
    assert mm.audio is None and not mm.vision.split_qkv and mm.vision.rope_theta == 10000.0
    assert mm.vision.in_channels == 3 and mm.vision.depth == VL_VISION["depth"]
    whole = {"architectures": ["Qwen2_5OmniModel"],
             "thinker_config": {"text_config": TEXT, "vision_config": OMNI_VISION, "audio_config": AUDIO}}
    mm = ModelConfig.from_dict(whole).multimodal
    assert mm.vision.split_qkv and mm.audio.n_window == 5


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
        "import sys; from edge_infer.models.config import ModelConfig; "
        "from edge_infer.models.encoder_config import audio_output_length; "
        "from edge_infer.models.encoder_weights import vision_weight_specs; "
        f"v = ModelConfig.from_dir({str(vl[0])!r}).multimodal.vision; "
        "n = sum(s.numel for s in vision_weight_specs(v)); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(n, audio_output_length(3000))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = sum(p.numel() for p in vl[1].parameters())
    assert out.stdout.split() == [str(expected), "750"]
