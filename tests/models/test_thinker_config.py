"""The thinkers' configs and weights in every layout they ship in: transformers 5.24's nested config, the hub's
flat Qwen2.5-VL config, the full Omni model, the nested tensor names of transformers 4.5x saves; tied heads
decided as transformers decides them; planning them with `edge-infer plan`."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from mm_prompts import OMNI_TOKEN_IDS
from testutil import THINKER_AUDIO, THINKER_TEXT, THINKER_VISION, load_thinker, write_thinker_checkpoint
from edge_infer.cli import main
from edge_infer.config import EngineConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.errors import CheckpointError
from edge_infer.models.checkpoint import read_tensor_index
from edge_infer.models.config import ModelConfig

PROMPT = [5, 17, 99, 3, 250, 41, 7]


def greedy(path, n: int = 16) -> list[int]:
    core = EngineCore(EngineConfig(model=str(path), dtype="float32", max_model_len=128, max_num_seqs=2,
                                   max_num_batched_tokens=16, kv_cache_memory_bytes=1 << 20))
    core.add_request(EngineRequest("r", PROMPT, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
    out = []
    while core.has_work():
        out += [d.token_id for d in core.step() if d.token_id is not None]
    return out


def hf_greedy(path, n: int = 16) -> list[int]:
    model = load_thinker(path)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


def test_nested_and_full_configs_parse_to_the_thinker(thinker_checkpoints):
    vl = ModelConfig.from_dir(thinker_checkpoints["qwen2_5_vl"])
    assert (vl.family, vl.hidden_size, vl.head_dim, vl.mrope_section, vl.attention_bias) == ("qwen2_5_vl", 120, 24, (2, 5, 5), True)
    assert vl.multimodal.kinds == ("image", "video") and vl.multimodal.position_id_per_seconds == 2
    thinker = ModelConfig.from_dir(thinker_checkpoints["qwen2_5_omni_thinker"])
    full = ModelConfig.from_dir(thinker_checkpoints["qwen2_5_omni"])
    for cfg in (thinker, full):
        assert (cfg.family, cfg.num_hidden_layers, cfg.mrope_section, cfg.rope_theta) == ("qwen2_5_omni", 3, (2, 3, 3), 1e6)
        assert cfg.multimodal.audio_token_id == OMNI_TOKEN_IDS["audio_token_id"]
        assert cfg.multimodal.position_id_per_seconds == 25 and cfg.multimodal.seconds_per_chunk == 2
        assert cfg.multimodal.audio.d_model == THINKER_AUDIO["d_model"] and cfg.multimodal.vision.split_qkv
    assert dataclasses.replace(full, architecture=thinker.architecture) == thinker
    # the talker's and token2wav's tensors are known but not the thinker's
    names = read_tensor_index(thinker_checkpoints["qwen2_5_omni"])
    assert "lm_head.weight" in names and names["lm_head.weight"].key == "thinker.lm_head.weight"
    assert "talker.model.embed_tokens.weight" in names


def test_the_hub_layouts_load_and_run_as_the_transformers_layout(thinker_checkpoints, tmp_path):
    """The hub's Qwen2.5-VL config has its text keys flat at the top level and an mrope rope_scaling; some saves
    nest the tensors under model.language_model. / model.visual.; the hub's Omni config names the architecture
    Qwen2_5OmniModel."""
    from safetensors.torch import load_file, save_file

    src = thinker_checkpoints["qwen2_5_vl"]
    hub = tmp_path / "vl-hub"
    shutil.copytree(src, hub)
    raw = json.loads((src / "config.json").read_text())
    text = raw.pop("text_config")
    params = text.pop("rope_parameters")
    text["rope_scaling"] = {"type": "mrope", "mrope_section": params["mrope_section"]}
    text["rope_theta"] = params["rope_theta"]
    (hub / "config.json").write_text(json.dumps({**raw, **text, "architectures": raw["architectures"]}))
    weights = load_file(src / "model.safetensors")
    nested = {("model.language_model." + k[6:] if k.startswith("model.") else
               "model." + k if k.startswith("visual.") else k): v for k, v in weights.items()}
    save_file(nested, hub / "model.safetensors", metadata={"format": "pt"})
    assert ModelConfig.from_dir(hub) == ModelConfig.from_dir(src)
    assert greedy(hub) == greedy(src) == hf_greedy(src)

    omni = tmp_path / "omni-hub"
    shutil.copytree(thinker_checkpoints["qwen2_5_omni"], omni)
    raw = json.loads((omni / "config.json").read_text())
    raw["architectures"] = ["Qwen2_5OmniModel"]
    raw["thinker_config"]["text_config"]["rope_scaling"] = {"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"}
    del raw["thinker_config"]["text_config"]["rope_parameters"]
    (omni / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.from_dir(omni).architecture == "Qwen2_5OmniModel"
    assert greedy(omni) == greedy(thinker_checkpoints["qwen2_5_omni_thinker"])


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen2_5_omni_thinker"])
def test_a_tied_thinker_reads_its_head_from_the_embedding(kind, tmp_path):
    path = write_thinker_checkpoint(tmp_path / kind, kind, tie_word_embeddings=True)
    assert "lm_head.weight" not in read_tensor_index(path)
    assert ModelConfig.from_dir(path).tie_word_embeddings
    assert greedy(path) == hf_greedy(path)


@pytest.mark.parametrize("family, top, text", [
    ("qwen2_5_omni", False, True), ("qwen2_5_omni", True, False), ("qwen2_5_vl", False, True),
    ("qwen2_5_vl", True, None), ("qwen2_5_vl", False, None),
])
def test_tied_heads_are_decided_as_transformers_decides(family, top, text):
    import transformers

    text_config = dict(THINKER_TEXT[family], **({} if text is None else {"tie_word_embeddings": text}))
    vision = dict(THINKER_VISION, out_hidden_size=text_config["hidden_size"])
    if family == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLConfig(text_config=text_config, vision_config=vision, tie_word_embeddings=top)
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    else:
        config = transformers.Qwen2_5OmniThinkerConfig(
            text_config=text_config, vision_config=vision, tie_word_embeddings=top,
            audio_config=dict(THINKER_AUDIO, output_dim=text_config["hidden_size"]))
        model = transformers.Qwen2_5OmniThinkerForConditionalGeneration(config)
    raw = dict(config.to_dict(), architectures=[type(model).__name__])
    raw["text_config"] = {k: v for k, v in raw["text_config"].items() if k != "tie_word_embeddings" or text is not None}
    tied = model.lm_head.weight is model.model.language_model.embed_tokens.weight
    assert ModelConfig.from_dict(raw).tie_word_embeddings == tied


def _vl_raw(**text_changes) -> dict:
    text = dict(THINKER_TEXT["qwen2_5_vl"], **text_changes)
    return {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "text_config": text,
            "vision_config": dict(THINKER_VISION, out_hidden_size=text["hidden_size"])}


@pytest.mark.parametrize("raw, message", [
    (_vl_raw(rope_parameters={"rope_type": "default", "mrope_section": [2, 5, 4]}), "sums to 11, but a head of 24 has 12"),
    (_vl_raw(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn' is not supported"),
    (_vl_raw(rope_parameters={"rope_type": "default", "mrope_section": [12]}), "must be three non-negative integers"),
    ({**_vl_raw(), "vision_config": None}, "needs a vision_config object"),
    ({"architectures": ["Qwen2_5OmniThinkerForConditionalGeneration"], "vision_config": {}, "audio_config": {}},
     "has no text_config"),
    ({**_vl_raw(), "image_token_id": -1}, "image_token_id=-1 must be a token id"),
    ({**_vl_raw(), "vision_config": dict(THINKER_VISION, out_hidden_size=64)},
     "vision_config.out_hidden_size=64 differs from the text model's hidden_size=120"),
    ({**_vl_raw(), "vision_config": THINKER_VISION}, "vision_config: required key 'out_hidden_size' is missing"),
])
def test_bad_thinker_configs_say_what_is_wrong(raw, message):
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(")):
        ModelConfig.from_dict(raw)


def test_two_names_for_one_tensor_are_refused(thinker_checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "both"
    shutil.copytree(thinker_checkpoints["qwen2_5_omni"], path)
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"] = weights["thinker.model.norm.weight"].clone()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="two names for one tensor"):
        read_tensor_index(path)


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen2_5_omni"])
def test_edge_infer_plan_sizes_the_thinker_with_its_towers(thinker_checkpoints, kind, capsys):
    path = thinker_checkpoints[kind]
    assert main(["plan", str(path), "--dtype", "float32", "--max-model-len", "256",
                 "--available-bytes", str(4 << 30), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    items = {i["name"]: i for i in plan["items"]}
    core = EngineCore(EngineConfig(model=str(path), dtype="float32", max_model_len=256, max_num_seqs=2,
                                   max_num_batched_tokens=16, kv_cache_memory_bytes=items["kv cache"]["bytes"]))
    assert core.ready_info.encoder_weight_bytes["vision"] > 0
    towers = core.ready_info.encoder_weight_bytes
    assert {f"{kind} encoder weights": items[f"{kind} encoder weights"]["bytes"] for kind in towers} == {
        f"{kind} encoder weights": loaded for kind, loaded in towers.items()}
    assert items["weights"]["bytes"] + sum(towers.values()) == core.ready_info.weight_bytes  # the decoder's + towers'
    assert items["kv cache"]["bytes"] == core.ready_info.kv_cache_bytes
    assert items["rope tables"]["bytes"] == core.ready_info.rope_bytes == 0
    assert plan["kernels"]["kernels"]["encoder linears"]["kernel"] == core.ready_info.linear_kernels["encoder linears"]


def test_text_checkpoints_read_as_before(hf_checkpoints):
    """Canonical names change nothing for text models: the index is keyed by the stored names."""
    for path in hf_checkpoints.values():
        index = read_tensor_index(path)
        assert all(name == info.key for name, info in index.items())
        assert ModelConfig.from_dir(path).multimodal is None and ModelConfig.from_dir(path).mrope_section is None


def test_the_synth_families_stay_the_text_families():
    from edge_infer.models.config import FAMILIES

    assert set(FAMILIES) == {"llama", "qwen2", "qwen3", "mistral"}
