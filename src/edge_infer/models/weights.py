"""The tensors a checkpoint must provide, derived from its config alone.

A text decoder's; a multimodal thinker's add its vision and audio towers'
(``models.encoder_weights``), under their canonical prefixes. Torch-free on
purpose: the memory planner sizes weights from this list without importing
torch or reading any weight.
"""
from __future__ import annotations

from dataclasses import dataclass

from edge_infer.models.config import ModelConfig


@dataclass(frozen=True)
class WeightSpec:
    """One tensor of ours, filled from checkpoint tensors concatenated along dim 0."""

    target: str  # attribute path in DecoderLM, e.g. "layers.3.qkv"
    shape: tuple[int, ...]
    sources: tuple[str, ...]
    is_linear: bool  # a Linear's weight (gets a kernel) rather than a plain tensor

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def weight_specs(cfg: ModelConfig) -> list[WeightSpec]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    qkv_rows = cfg.q_size + 2 * cfg.kv_size
    specs = [WeightSpec("embed", (cfg.vocab_size, h), ("model.embed_tokens.weight",), False)]
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        attn = p + "self_attn."
        specs += [
            WeightSpec(f"layers.{n}.input_norm", (h,), (p + "input_layernorm.weight",), False),
            WeightSpec(f"layers.{n}.qkv", (qkv_rows, h), tuple(attn + f"{x}_proj.weight" for x in "qkv"), True),
            WeightSpec(f"layers.{n}.o_proj", (h, cfg.q_size), (attn + "o_proj.weight",), True),
            WeightSpec(f"layers.{n}.post_attention_norm", (h,), (p + "post_attention_layernorm.weight",), False),
            WeightSpec(f"layers.{n}.gate_up", (2 * i, h), (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), True),
            WeightSpec(f"layers.{n}.down", (h, i), (p + "mlp.down_proj.weight",), True),
        ]
        if cfg.attention_bias:
            specs.append(WeightSpec(f"layers.{n}.qkv.bias", (qkv_rows,), tuple(attn + f"{x}_proj.bias" for x in "qkv"), False))
        if cfg.qk_norm:
            specs += [
                WeightSpec(f"layers.{n}.q_norm", (cfg.head_dim,), (attn + "q_norm.weight",), False),
                WeightSpec(f"layers.{n}.k_norm", (cfg.head_dim,), (attn + "k_norm.weight",), False),
            ]
    specs.append(WeightSpec("final_norm", (h,), ("model.norm.weight",), False))
    if not cfg.tie_word_embeddings:
        specs.append(WeightSpec("lm_head", (cfg.vocab_size, h), ("lm_head.weight",), True))
    if cfg.multimodal is not None:
        # imported here: encoder_weights builds its specs from WeightSpec above
        from edge_infer.models.encoder_weights import tower_weight_specs

        specs += tower_weight_specs(cfg.multimodal.vision, cfg.multimodal.audio)
    return specs


def source_shapes(spec: WeightSpec, cfg: ModelConfig) -> list[tuple[int, ...]]:
    """Shapes of the checkpoint tensors that make up one of our (possibly fused) tensors.

    The decoder's q/k/v split by head counts; any other fused tensor
    (gate/up, the towers' q/k/v, stacked tables) into equal parts.
    """
    if len(spec.sources) == 1:
        return [spec.shape]
    if spec.target.startswith("layers.") and spec.target.endswith(("qkv", "qkv.bias")):  # the decoder's (GQA)
        rows = [cfg.q_size, cfg.kv_size, cfg.kv_size]
    else:
        rows = [spec.shape[0] // len(spec.sources)] * len(spec.sources)
    return [(r, *spec.shape[1:]) for r in rows]
