"""Random Qwen2.5-VL and Qwen2.5-Omni thinker checkpoints: ``edge-infer synth --family qwen2_5_vl | qwen2_5_omni``.

Each is what transformers 5.24 saves for ``Qwen2_5_VLForConditionalGeneration`` /
``Qwen2_5OmniThinkerForConditionalGeneration`` (config.json's layout and keys, tensor names: ``model.*``,
``lm_head``, ``visual.*``, ``audio_tower.*``), with the shapes of the released Qwen2.5-VL-3B-Instruct and
Qwen2.5-Omni-3B (its thinker: the talker and token2wav speak, edge-infer's text engine does not run them) or tiny
ones for tests, plus what a released checkpoint ships beside them:

- ``preprocessor_config.json`` as the released checkpoints have it (the Qwen2VLImageProcessor keys; Omni's also
  the WhisperFeatureExtractor keys, 300-second chunks);
- ``tokenizer.json``: the demo model's BPE with the family's media tokens, named as in the released tokenizers
  (VL: ``<|vision_start|>`` ``<|image_pad|>`` ``<|video_pad|>`` ``<|vision_end|>``; Omni: ``<|vision_bos|>``
  ``<|IMAGE|>`` ``<|VIDEO|>`` ``<|vision_eos|>`` ``<|audio_bos|>`` ``<|AUDIO|>`` ``<|audio_eos|>``), and a ChatML
  template that renders OpenAI-style content lists: a text part is its text, an image, video or audio part its
  start marker, one placeholder and its end marker (the frontend repeats the placeholder once per embedding row);
- ``generation_config.json``.

Token ids are the tokenizer's (the demo vocabulary is small), not the released 151k ids.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_infer.models.synth import FamilyStyle, tokenizer_vocab, write_generation_config, write_tokenizer, write_weights

CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# kind -> (start marker, placeholder, end marker), as each family's released tokenizer names them.
MARKERS = {
    "qwen2_5_vl": {"image": ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
                   "video": ("<|vision_start|>", "<|video_pad|>", "<|vision_end|>")},
    "qwen2_5_omni": {"image": ("<|vision_bos|>", "<|IMAGE|>", "<|vision_eos|>"),
                     "video": ("<|vision_bos|>", "<|VIDEO|>", "<|vision_eos|>"),
                     "audio": ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")},
}
# The content part types (OpenAI's, and the Qwen processors' own) each kind is written as.
PART_TYPES = {"image": ("image", "image_url"), "video": ("video", "video_url"),
              "audio": ("audio", "input_audio", "audio_url")}
ARCHITECTURES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                 "qwen2_5_omni": "Qwen2_5OmniThinkerForConditionalGeneration"}

_TEXT_3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                num_key_value_heads=2, mrope_section=[16, 24, 24], max_window_layers=70)
_VIT_3B = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, fullatt_block_indexes=[7, 15, 23, 31])
_TEXT_TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, mrope_section=[4, 6, 6], max_window_layers=70, max_position_embeddings=2048)
_VIT_TINY = dict(depth=2, hidden_size=64, intermediate_size=96, num_heads=2, fullatt_block_indexes=[1])
# vocab_size None: the tokenizer's size rounded up to a multiple of 128.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "qwen2_5_vl": {
        "tiny": dict(text=_TEXT_TINY, vision=_VIT_TINY, vocab_size=None, tie_word_embeddings=True),
        "qwen2.5-vl-3b": dict(text=dict(_TEXT_3B, max_position_embeddings=128000), vision=_VIT_3B, vocab_size=151936,
                              tie_word_embeddings=True),
    },
    "qwen2_5_omni": {
        "tiny": dict(text=_TEXT_TINY, vision=_VIT_TINY, vocab_size=None, tie_word_embeddings=False,
                     audio=dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128)),
        "qwen2.5-omni-3b": dict(text=dict(_TEXT_3B, max_position_embeddings=32768), vision=_VIT_3B, vocab_size=151936,
                                tie_word_embeddings=False,
                                audio=dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20,
                                           encoder_ffn_dim=5120)),
    },
}

_CLIP = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}
_IMAGE_PROCESSOR = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
                    "merge_size": 2, **_CLIP, "image_processor_type": "Qwen2VLImageProcessor"}
PREPROCESSORS = {
    "qwen2_5_vl": {**_IMAGE_PROCESSOR, "processor_class": "Qwen2_5_VLProcessor"},
    "qwen2_5_omni": {**_IMAGE_PROCESSOR, "processor_class": "Qwen2_5OmniProcessor",
                     "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
                     "hop_length": 160, "n_fft": 400, "chunk_length": 300, "n_samples": 4800000,
                     "nb_max_frames": 30000, "padding_side": "right", "padding_value": 0.0, "dither": 0.0,
                     "return_attention_mask": True},
}
TRANSFORMERS_LAYOUT = "5.24.0"


def write_thinker(out: str | Path, family: str, preset: str, seed: int, dtype: str, shard_bytes: int) -> Path:
    """Write a random ``family`` thinker of ``preset``'s shape into ``out``."""
    from edge_infer.models.config import ModelConfig

    if preset not in PRESETS[family]:
        raise ValueError(f"unknown preset {preset!r} for {family}; choose one of {', '.join(PRESETS[family])}")
    shape = PRESETS[family][preset]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    markers = MARKERS[family]
    media = tuple(dict.fromkeys(token for marks in markers.values() for token in marks))
    style = FamilyStyle(ARCHITECTURES[family], family, None, "<|im_end|>", CHATML + media, chat_template(markers))
    ids = write_tokenizer(out, style, shape["text"]["max_position_embeddings"])
    config = thinker_config(family, shape, shape["vocab_size"] or tokenizer_vocab(out), ids, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSORS[family], indent=2))
    write_generation_config(out, ids["<|im_end|>"], ids["<|endoftext|>"])
    # transformers' audio tower also holds the talker's two audio boundary embeddings; the thinker never reads them
    extra = {"audio_tower.audio_bos_eos_token.weight": (2, shape["text"]["hidden_size"])} if "audio" in shape else {}
    write_weights(out, ModelConfig.from_dict(config), dtype, seed, shard_bytes, extra)
    return out


def chat_template(markers: dict[str, tuple[str, str, str]]) -> str:
    """ChatML whose message contents may be lists of parts; media parts become their markers and one placeholder."""
    return render_macro(markers) + _TEMPLATE


def render_macro(markers: dict[str, tuple[str, str, str]]) -> str:
    """The jinja macro ``render(content)`` that writes a message content, a string or a list of parts (a template
    that calls it on each content takes OpenAI-style content lists)."""
    media = "".join(
        f'{{%- elif part.type in {list(PART_TYPES[kind])!r} %}}{{{{- "{"".join(marks)}" }}}}\n'
        for kind, marks in markers.items()
    )
    return _RENDER_MACRO.replace("{#- MEDIA -#}\n", media)


_RENDER_MACRO = '''{#- OpenAI-style content lists (edge-infer synth): a text part is its text; an image, video or audio part is
    its start marker, one placeholder and its end marker, and the frontend repeats the placeholder once per embedding
    row of that item. -#}
{%- macro render(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is not none %}
        {%- for part in content %}
            {%- if part.type == "text" %}
                {{- part.text }}
{#- MEDIA -#}
            {%- else %}
                {{- raise_exception("this model takes no '" + part.type + "' content") }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
'''
_TEMPLATE = '''{%- if messages and messages[0].role == "system" %}
    {%- set system = messages[0].content %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = "You are a helpful assistant." %}
    {%- set turns = messages %}
{%- endif %}
{{- "<|im_start|>system\\n" + render(system) + "<|im_end|>\\n" }}
{%- for message in turns %}
    {{- "<|im_start|>" + message.role + "\\n" + render(message.content) + "<|im_end|>\\n" }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|im_start|>assistant\\n" }}
{%- endif %}
'''


def thinker_config(family: str, shape: dict[str, Any], vocab: int, ids: dict[str, int], dtype: str) -> dict[str, Any]:
    """config.json as transformers 5.24 saves the family's architecture (keys it writes, its defaults)."""
    text, hidden = shape["text"], shape["text"]["hidden_size"]
    omni = family == "qwen2_5_omni"
    markers = MARKERS[family]
    vision_start, image, vision_end = (ids[t] for t in markers["image"])
    text_config = {
        "attention_dropout": 0.0, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
        "intermediate_size": text["intermediate_size"], "layer_types": ["full_attention"] * text["num_hidden_layers"],
        "max_position_embeddings": text["max_position_embeddings"], "max_window_layers": text["max_window_layers"],
        "model_type": f"{family}_text", "num_attention_heads": text["num_attention_heads"],
        "num_hidden_layers": text["num_hidden_layers"], "num_key_value_heads": text["num_key_value_heads"],
        "pad_token_id": None, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_section": text["mrope_section"], "rope_theta": text.get("rope_theta", 1000000.0),
                            "rope_type": "default"},
        "sliding_window": None, "use_cache": True, "use_sliding_window": False, "vocab_size": vocab,
    }
    vision_config = {
        **shape["vision"], "hidden_act": "silu", "in_channels": 3, "initializer_range": 0.02,
        "model_type": "qwen2_5_omni_vision_encoder" if omni else "qwen2_5_vl_vision", "out_hidden_size": hidden,
        "patch_size": 14, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}, "spatial_merge_size": 2,
        "temporal_patch_size": 2, "tokens_per_second": 2, "window_size": 112,
    }
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]], "dtype": dtype, "model_type": family if not omni else "qwen2_5_omni_thinker",
        "text_config": text_config, "tie_word_embeddings": shape["tie_word_embeddings"],
        "transformers_version": TRANSFORMERS_LAYOUT, "vision_config": vision_config,
        "vision_start_token_id": vision_start, "vision_end_token_id": vision_end,
    }
    if not omni:
        return {**config, "image_token_id": image, "video_token_id": ids[markers["video"][1]]}
    audio_start, audio, audio_end = (ids[t] for t in markers["audio"])
    text_config["tie_word_embeddings"] = True  # transformers writes its text config's default; the thinker's key decides
    return {
        **config, "image_token_index": image, "video_token_index": ids[markers["video"][1]],
        "audio_token_index": audio, "audio_start_token_id": audio_start, "audio_end_token_id": audio_end,
        "initializer_range": 0.02, "position_id_per_seconds": 25, "seconds_per_chunk": 2,
        "user_token_id": 872,  # transformers' default; the talker's, not read by the thinker
        "audio_config": {
            **shape["audio"], "activation_dropout": 0.0, "activation_function": "gelu", "attention_dropout": 0.0,
            "dropout": 0.0, "initializer_range": 0.02, "max_source_positions": 1500,
            "model_type": "qwen2_5_omni_audio_encoder", "n_window": 100, "num_mel_bins": 128, "output_dim": hidden,
            "scale_embedding": False,
        },
    }
