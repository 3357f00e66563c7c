"""The Talker's tensors as the text engine's weight specs, from its config alone (torch-free).

The Talker's decoder and its code predictor are Qwen3-architecture stacks,
so they load as ``DecoderLM``s; only the checkpoint names differ:

    DecoderLM         Talker                          code predictor
    embed             talker.model.codec_embedding    talker.code_predictor.model.codec_embedding.{0..G-2} (stacked)
    layers.N          talker.model.layers.N           talker.code_predictor.model.layers.N
    final_norm        talker.model.norm               talker.code_predictor.model.norm
    lm_head           talker.codec_head               heads.{i} <- talker.code_predictor.lm_head.{i}

The text side (``talker.model.text_embedding``, ``talker.text_projection``)
is a plain module. The memory plan sizes the weights from these lists
without importing torch; ``synth`` writes random checkpoints from them.
"""
from __future__ import annotations

import math

from edge_infer.models.config import ModelConfig
from edge_infer.models.qwen3_tts.config import Qwen3TTSConfig, TransformerShape
from edge_infer.models.weights import WeightSpec, source_shapes, weight_specs

TALKER = "talker."
PREDICTOR = "talker.code_predictor."


def decoder_config(shape: TransformerShape, vocab_size: int, max_positions: int, dtype: str) -> ModelConfig:
    """A text-engine config for one of the Talker's Qwen3-style stacks."""
    return ModelConfig(
        family="qwen3", architecture="Qwen3TTSTalker", vocab_size=vocab_size, hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim,
        rms_norm_eps=shape.rms_norm_eps, rope_theta=shape.rope_theta, max_position_embeddings=max_positions,
        tie_word_embeddings=False, attention_bias=False, qk_norm=True, sliding_window=None, rope_scaling=None,
        torch_dtype=dtype,
    )


def talker_decoder_config(config: Qwen3TTSConfig, max_model_len: int, dtype: str) -> ModelConfig:
    talker = config.talker
    return decoder_config(talker.shape, talker.vocab_size, max_model_len, dtype)


def predictor_decoder_config(config: Qwen3TTSConfig, dtype: str) -> ModelConfig:
    predictor = config.talker.code_predictor
    return decoder_config(predictor.shape, predictor.codebook_size, config.talker.num_code_groups, dtype)


def _renamed(spec: WeightSpec, prefix: str) -> WeightSpec:
    return WeightSpec(spec.target, spec.shape, tuple(prefix + s for s in spec.sources), spec.is_linear)


def talker_specs(cfg: ModelConfig) -> list[WeightSpec]:
    out = []
    for spec in weight_specs(cfg):
        if spec.target == "embed":
            spec = WeightSpec("embed", spec.shape, (TALKER + "model.codec_embedding.weight",), False)
        elif spec.target == "lm_head":
            spec = WeightSpec("lm_head", spec.shape, (TALKER + "codec_head.weight",), True)
        else:
            spec = _renamed(spec, TALKER)
        out.append(spec)
    return out


def predictor_specs(cfg: ModelConfig, talker_hidden: int, num_code_groups: int) -> list[WeightSpec]:
    residual, codebook, pm = num_code_groups - 1, cfg.vocab_size, PREDICTOR + "model."
    out = [WeightSpec("embed", (residual * codebook, talker_hidden),
                      tuple(f"{pm}codec_embedding.{i}.weight" for i in range(residual)), False)]
    out += [_renamed(s, PREDICTOR) for s in weight_specs(cfg) if s.target not in ("embed", "lm_head")]
    out += [WeightSpec(f"heads.{i}", (codebook, cfg.hidden_size), (f"{PREDICTOR}lm_head.{i}.weight",), True)
            for i in range(residual)]
    if talker_hidden != cfg.hidden_size:  # e.g. the 1.7B Talker
        name = PREDICTOR + "small_to_mtp_projection."
        out += [WeightSpec("projection", (cfg.hidden_size, talker_hidden), (name + "weight",), True),
                WeightSpec("projection.bias", (cfg.hidden_size,), (name + "bias",), False)]
    return out


def text_side_shapes(config: Qwen3TTSConfig) -> dict[str, tuple[int, ...]]:
    """The text embedding and the projection MLP (fc1 and fc2 with biases), by checkpoint name."""
    talker = config.talker
    text, hidden, mlp = talker.text_hidden_size, talker.shape.hidden_size, TALKER + "text_projection."
    return {
        TALKER + "model.text_embedding.weight": (talker.text_vocab_size, text),
        mlp + "linear_fc1.weight": (text, text), mlp + "linear_fc1.bias": (text,),
        mlp + "linear_fc2.weight": (hidden, text), mlp + "linear_fc2.bias": (hidden,),
    }


def text_side_numel(config: Qwen3TTSConfig) -> int:
    return sum(math.prod(shape) for shape in text_side_shapes(config).values())


def checkpoint_shapes(config: Qwen3TTSConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of model.safetensors the Talker reads, by name (CustomVoice: there is nothing else)."""
    talker = config.talker
    # max_model_len only sizes RoPE tables, not tensors of the checkpoint.
    decoder = talker_decoder_config(config, 1, "float32")
    predictor = predictor_decoder_config(config, "float32")
    shapes = text_side_shapes(config)
    for cfg, specs in ((decoder, talker_specs(decoder)),
                       (predictor, predictor_specs(predictor, talker.shape.hidden_size, talker.num_code_groups))):
        for spec in specs:
            shapes.update(zip(spec.sources, source_shapes(spec, cfg)))
    return shapes
