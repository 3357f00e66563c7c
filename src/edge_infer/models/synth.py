"""``edge-infer synth``: random checkpoints of the supported families.

Real-shape presets (Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.2-1B; the multimodal
thinkers Qwen2.5-VL-3B and Qwen2.5-Omni-3B: ``models/synth_thinker.py``) are
for speed and memory benchmarks: speed and memory do not depend on the
weights' values. ``tiny`` is for tests. Each checkpoint is a complete Hugging
Face directory: config, safetensors (sharded with an index above
``--shard-bytes``), a working tokenizer (the demo model's byte-level BPE plus
the family's special tokens) and the family's chat template.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_infer.models.config import ModelConfig

from edge_infer.models.config import FAMILIES, MEDIA_KINDS

# The multimodal thinkers synth writes (models/synth_thinker.py), besides the text FAMILIES.
THINKER_FAMILIES = tuple(sorted(MEDIA_KINDS))

# vocab_size None: the tokenizer's size rounded up to a multiple of 128.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=None, max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=True,
    ),
    "qwen3-0.6b": dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    ),
}


@dataclass(frozen=True)
class FamilyStyle:
    architecture: str
    model_type: str
    bos: str | None
    eos: str  # ends an assistant turn
    specials: tuple[str, ...]
    chat_template: str


_LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
_MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{{- m['content'] + '\\n\\n' }}"
    "{%- elif m['role'] == 'user' %}{{- '[INST] ' + m['content'] + ' [/INST]' }}"
    "{%- elif m['role'] == 'assistant' %}{{- m['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('roles must be system, user or assistant') }}{%- endif %}"
    "{%- endfor %}"
)


def _styles(chatml_template: str) -> dict[str, FamilyStyle]:
    chatml = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    return {
        "qwen2": FamilyStyle("Qwen2ForCausalLM", "qwen2", None, "<|im_end|>", chatml, chatml_template),
        "qwen3": FamilyStyle("Qwen3ForCausalLM", "qwen3", None, "<|im_end|>", chatml, chatml_template),
        "llama": FamilyStyle(
            "LlamaForCausalLM", "llama", "<|begin_of_text|>", "<|eot_id|>",
            ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
            _LLAMA3_TEMPLATE,
        ),
        "mistral": FamilyStyle("MistralForCausalLM", "mistral", "<s>", "</s>", ("<s>", "</s>", "[INST]", "[/INST]"), _MISTRAL_TEMPLATE),
    }


def _base_tokenizer_dir() -> Path:
    from edge_infer.models.checkpoint import demo_model_dir

    return demo_model_dir()


def write_tokenizer(out: Path, style: FamilyStyle, model_max_length: int, base: Path | None = None) -> dict[str, int]:
    """The BPE of ``base`` (default: the demo model's) with this family's special tokens; returns special token ids."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str((base or _base_tokenizer_dir()) / "tokenizer.json"))
    tok.add_special_tokens(list(style.specials))
    ids = {t: tok.token_to_id(t) for t in style.specials}
    if style.bos is not None:  # Llama/Mistral prepend BOS when encoding plain text
        tok.post_processor = processors.TemplateProcessing(
            single=f"{style.bos} $A", pair=f"{style.bos} $A {style.bos} $B", special_tokens=[(style.bos, ids[style.bos])]
        )
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "bos_token": style.bos,
        "eos_token": style.eos,
        "pad_token": style.eos,
        "chat_template": style.chat_template,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return ids


def model_config(family: str, preset: str, dtype: str) -> dict[str, Any]:
    style = _styles("")[family]
    shape = dict(PRESETS[preset])
    cfg: dict[str, Any] = {
        "architectures": [style.architecture],
        "model_type": style.model_type,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6 if family.startswith("qwen") else 1e-5,
        "torch_dtype": dtype,
        "initializer_range": 0.02,
        **shape,
    }
    cfg.setdefault("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    if family == "qwen3":
        cfg["attention_bias"] = False
    elif family in ("llama", "mistral"):
        cfg["attention_bias"] = False
        cfg["mlp_bias"] = False
    if family == "mistral":
        cfg["sliding_window"] = None
    if family != "llama":
        cfg.pop("rope_scaling", None)
    return cfg


def write_checkpoint(
    out: str | Path,
    family: str,
    preset: str = "tiny",
    seed: int = 0,
    dtype: str = "bfloat16",
    shard_bytes: int = 2 << 30,
) -> Path:
    """Write a random checkpoint of ``family`` with ``preset``'s shape into ``out``."""
    from edge_infer.models.config import ModelConfig

    if family in THINKER_FAMILIES:
        from edge_infer.models.synth_thinker import write_thinker

        return write_thinker(out, family, preset, seed, dtype, shard_bytes)
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES + THINKER_FAMILIES)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    style = _styles(chatml_template())[family]
    cfg_dict = model_config(family, preset, dtype)
    special_ids = write_tokenizer(out, style, cfg_dict["max_position_embeddings"])
    if cfg_dict["vocab_size"] is None:  # tiny: every id the model can emit decodes to text
        cfg_dict["vocab_size"] = tokenizer_vocab(out)
    eos = special_ids[style.eos]
    cfg_dict.update(eos_token_id=eos, bos_token_id=special_ids.get(style.bos) if style.bos else eos)
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    write_generation_config(out, eos, cfg_dict["bos_token_id"])
    write_weights(out, ModelConfig.from_dict(cfg_dict), dtype, seed, shard_bytes)
    return out


def chatml_template() -> str:
    """The demo model's ChatML template (the Qwen families')."""
    return json.loads((_base_tokenizer_dir() / "tokenizer_config.json").read_text())["chat_template"]


def tokenizer_vocab(out: Path) -> int:
    """A vocabulary for the tokenizer written to ``out``: its size rounded up to a multiple of 128."""
    from tokenizers import Tokenizer

    return -(-Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() // 128) * 128


def write_generation_config(out: Path, eos: int, bos: int) -> None:
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [eos], "bos_token_id": bos, "do_sample": True, "temperature": 0.7, "top_p": 0.9},
                   indent=2)
    )


def write_weights(out: Path, cfg: "ModelConfig", dtype: str, seed: int, shard_bytes: int,
                  extra: dict[str, tuple[int, ...]] | None = None) -> None:
    """Random tensors for every weight ``cfg`` implies (and the ``extra`` ones, by name and shape), as safetensors,
    sharded with an index above ``shard_bytes``."""
    import torch
    from safetensors.torch import save_file

    from edge_infer.models.weights import source_shapes, weight_specs

    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    gen = torch.Generator().manual_seed(seed)

    def random(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if len(shape) == 1 and ("norm" in name or "ln_" in name) and name.endswith(".weight"):
            return torch.ones(shape, dtype=torch_dtype)
        t = torch.randn(shape, generator=gen)
        if name.endswith(".bias"):
            return (t * 0.5).to(torch_dtype) * 0.1
        if len(shape) >= 2 and "embed_tokens" not in name:
            # Twice the variance-preserving scale: with a tied head, a narrower init makes a
            # random model echo its input token, and tests need greedy text that varies.
            return (t * 2 / (t[0].numel() ** 0.5)).to(torch_dtype)
        return (t * 0.5).to(torch_dtype)

    tensors = [(name, shape) for spec in weight_specs(cfg) for name, shape in zip(spec.sources, source_shapes(spec, cfg))]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, shape in tensors + list((extra or {}).items()):
        t = random(name, shape)
        nbytes = t.numel() * t.element_size()
        if size + nbytes > shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
