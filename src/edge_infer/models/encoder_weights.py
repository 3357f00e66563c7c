"""The encoders' tensors as weight specs (torch-free).

Targets are attribute paths in ``VisionEncoder`` / ``AudioEncoder``; sources
are checkpoint names relative to the tower. Every layout a checkpoint ships
reads, by canonical name (``models.checkpoint``), with the towers under
``visual.`` and ``audio_tower.`` (``TOWER_PREFIXES``): a thinker's
``weight_specs`` hold them so prefixed (``tower_weight_specs``), a tower
loaded alone takes the prefix from ``load_weights(..., prefix=...)``.
Our modules fuse what the checkpoint splits:

    ours                          vision tower (relative)                       audio tower (relative)
    patch_embed                   patch_embed.proj.weight (Conv3d, 5-D)         -
    conv1, conv2 (+ .bias)        -                                             conv1, conv2 (Conv1d, 3-D)
    blocks.N / layers.N .qkv      attn.qkv (VL) or attn.q, attn.k, attn.v (Omni)  self_attn.q_proj, k_proj, v_proj
    ... .gate_up                  mlp.gate_proj, mlp.up_proj                    -

The audio tower's k_proj has no bias, so its q and v biases stay separate
tensors (``q_bias``, ``v_bias``) added after the fused product.
``audio_bos_eos_token`` is stored with the audio tower but used by the
talker side only; it is not loaded.
"""
from __future__ import annotations

from dataclasses import replace

from edge_infer.models.encoder_config import AudioConfig, VisionConfig
from edge_infer.models.weights import WeightSpec

# Where each tower's tensors sit (canonical names), which is also the thinker's attribute holding it.
TOWER_PREFIXES = {"vision": "visual.", "audio": "audio_tower."}


def _linear(target: str, rows: int, cols: int, sources: tuple[str, ...], bias: bool = True) -> list[WeightSpec]:
    specs = [WeightSpec(target, (rows, cols), tuple(s + ".weight" for s in sources), True)]
    if bias:
        specs.append(WeightSpec(target + ".bias", (rows,), tuple(s + ".bias" for s in sources), False))
    return specs


def vision_weight_specs(cfg: VisionConfig) -> list[WeightSpec]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    merged = h * cfg.merge_unit
    patch = (h, cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
    specs = [WeightSpec("patch_embed", patch, ("patch_embed.proj.weight",), False)]
    for n in range(cfg.depth):
        p = f"blocks.{n}."
        qkv = tuple(p + f"attn.{x}" for x in "qkv") if cfg.split_qkv else (p + "attn.qkv",)
        specs.append(WeightSpec(p + "norm1", (h,), (p + "norm1.weight",), False))
        specs += _linear(p + "qkv", 3 * h, h, qkv)
        specs += _linear(p + "proj", h, h, (p + "attn.proj",))
        specs.append(WeightSpec(p + "norm2", (h,), (p + "norm2.weight",), False))
        specs += _linear(p + "gate_up", 2 * i, h, (p + "mlp.gate_proj", p + "mlp.up_proj"))
        specs += _linear(p + "down", h, i, (p + "mlp.down_proj",))
    specs.append(WeightSpec("merger_norm", (h,), ("merger.ln_q.weight",), False))
    specs += _linear("merger_fc1", merged, merged, ("merger.mlp.0",))
    specs += _linear("merger_fc2", cfg.out_hidden_size, merged, ("merger.mlp.2",))
    return specs


def _layer_norm(target: str, dim: int, source: str) -> list[WeightSpec]:
    return [WeightSpec(target, (dim,), (source + ".weight",), False),
            WeightSpec(target + "_bias", (dim,), (source + ".bias",), False)]


def audio_weight_specs(cfg: AudioConfig) -> list[WeightSpec]:
    d, f = cfg.d_model, cfg.encoder_ffn_dim
    specs = [
        WeightSpec("conv1", (d, cfg.num_mel_bins, 3), ("conv1.weight",), False),
        WeightSpec("conv1_bias", (d,), ("conv1.bias",), False),
        WeightSpec("conv2", (d, d, 3), ("conv2.weight",), False),
        WeightSpec("conv2_bias", (d,), ("conv2.bias",), False),
    ]
    for n in range(cfg.encoder_layers):
        p = f"layers.{n}."
        attn = p + "self_attn."
        specs += _layer_norm(p + "attn_norm", d, p + "self_attn_layer_norm")
        specs += _linear(p + "qkv", 3 * d, d, tuple(attn + f"{x}_proj" for x in "qkv"), bias=False)
        specs += [WeightSpec(p + "q_bias", (d,), (attn + "q_proj.bias",), False),
                  WeightSpec(p + "v_bias", (d,), (attn + "v_proj.bias",), False)]
        specs += _linear(p + "out_proj", d, d, (attn + "out_proj",))
        specs += _layer_norm(p + "mlp_norm", d, p + "final_layer_norm")
        specs += _linear(p + "fc1", f, d, (p + "fc1",))
        specs += _linear(p + "fc2", d, f, (p + "fc2",))
    specs += _layer_norm("ln_post", d, "ln_post")
    specs += _linear("proj", cfg.output_dim, d, ("proj",))
    return specs


def tower_weight_specs(vision: VisionConfig, audio: AudioConfig | None) -> list[WeightSpec]:
    """A thinker's towers: targets and sources both under the tower's prefix (``visual.blocks.0.qkv``)."""
    towers = [("vision", vision_weight_specs(vision))] + ([("audio", audio_weight_specs(audio))] if audio else [])
    return [replace(spec, target=TOWER_PREFIXES[kind] + spec.target,
                    sources=tuple(TOWER_PREFIXES[kind] + name for name in spec.sources))
            for kind, specs in towers for spec in specs]


def is_tower_target(target: str) -> bool:
    """Whether a target of a thinker's specs is in a tower (the rest are the text decoder's)."""
    return target.startswith(tuple(TOWER_PREFIXES.values()))


def is_tower_spec(spec: WeightSpec) -> bool:
    return is_tower_target(spec.target)
