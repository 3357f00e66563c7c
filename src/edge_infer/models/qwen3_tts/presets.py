"""Config dictionaries of Qwen3-TTS checkpoints, as they appear on disk.

Pure data, no torch: the fixture script (which runs in the reference
environment) and ``synth`` both read them, so the tiny test checkpoint and
a synthesized one share one definition.

``tiny`` mirrors the real layout at toy sizes. Its codec ids keep the real
arrangement: the codebook entries come first and every control token
(pad/bos/eos/think/language/speaker) sits in the top 1024 ids of the codec
vocabulary, where the first-codebook sampler suppresses them. Each tiny id
is the real id shifted by ``2048 - TINY_CODEBOOK`` so the gaps between them
are the real ones.

``qwen3-tts-0.6b`` has the shapes of Qwen3-TTS-12Hz-0.6B-CustomVoice (for
speed and memory benchmarks with random weights).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

PRESETS = ("tiny", "qwen3-tts-0.6b")

# Real codec-side ids (Qwen3-TTS-12Hz CustomVoice).
_REAL_CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
_REAL_LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
    "beijing_dialect": 2074, "sichuan_dialect": 2062,
}
_REAL_SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
    "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
}
_SPEAKER_DIALECTS: dict[str, str | bool] = {
    "serena": False, "vivian": False, "uncle_fu": False, "ryan": False, "aiden": False,
    "ono_anna": False, "sohee": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect",
}

# Text-side special tokens: name in the tokenizer -> config key holding its id.
TEXT_SPECIALS = (
    ("<|endoftext|>", None),
    ("<|im_start|>", "im_start_token_id"),
    ("<|im_end|>", "im_end_token_id"),
    ("<tts_pad>", "tts_pad_token_id"),
    ("<tts_text_bos>", "tts_bos_token_id"),
    ("<tts_text_eod>", "tts_eos_token_id"),
)
_REAL_TEXT_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<tts_text_eod>": 151673,
}

TINY_CODEBOOK = 64
# The reference treats the top 1024 codec ids as control tokens.
CONTROL_TOKEN_SPAN = 1024

# A fixed merge list for the small byte-level BPE that stands in for the
# Qwen2 vocabulary (which cannot be shipped): enough to make multi-byte
# tokens appear, deterministic without a trainer.
TINY_MERGES = (
    "Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "Ġ a", "o n", "r e", "Ġ s", "e n", "Ġ w",
    "a t", "o u", "i s", "Ġ h", "l l", "n d", "Ġ o", "Ġ b", "e s", "in g", "Ġ c", "o r",
    "e d", "Ġ i", "Ġ f", "Ġ m", "Ġ p", "l e", "a r", "i t", "a l", "Ġ d", "Ġ l", "o m",
    "Ġ n", "a s", "i c", "Ġ y", "Ġ g", "Ġ e", "Ġw or", "l d", "Ġh e", "ll o", "Ġ ,",
    # "assistant" and "user" are single tokens in the real vocabulary, and the
    # prompt layout relies on it (role = the first three tokens).
    "as s", "ass is", "t an", "assis tan", "assistan t", "u s", "us er",
)


@dataclass(frozen=True)
class CheckpointSpec:
    """Everything of a checkpoint except its weights."""

    config: dict[str, Any]               # config.json
    generation_config: dict[str, Any]    # generation_config.json
    speech_tokenizer_config: dict[str, Any]  # speech_tokenizer/config.json
    text_special_ids: dict[str, int]     # special token name -> id


def checkpoint_spec(preset: str) -> CheckpointSpec:
    if preset == "tiny":
        return _tiny()
    if preset == "qwen3-tts-0.6b":
        return _real_0_6b()
    raise ValueError(f"unknown Qwen3-TTS preset {preset!r}; choose one of {', '.join(PRESETS)}")


def _shift(ids: dict[str, int], offset: int) -> dict[str, int]:
    return {k: v - offset for k, v in ids.items()}


def _generation_config() -> dict[str, Any]:
    # The sampling defaults the released checkpoints ship.
    return {
        "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
        "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9, "max_new_tokens": 8192,
    }


def _top_config(talker: dict[str, Any], text_ids: dict[str, int], size: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": "custom_voice",
        "tts_model_size": size,
        "talker_config": talker,
    }
    for name, key in TEXT_SPECIALS:
        if key is not None:
            config[key] = text_ids[name]
    return config


def _talker(*, shift: int, **shape: Any) -> dict[str, Any]:
    talker = {
        "model_type": "qwen3_tts_talker",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        **_shift(_REAL_CODEC_IDS, shift),
        "codec_language_id": _shift(_REAL_LANGUAGES, shift),
        "spk_id": _shift(_REAL_SPEAKERS, shift),
        "spk_is_dialect": dict(_SPEAKER_DIALECTS),
    }
    talker.update(shape)
    return talker


def _tiny() -> CheckpointSpec:
    shift = 2048 - TINY_CODEBOOK
    first_special = 256 + len(TINY_MERGES)
    text_ids = {name: first_special + i for i, (name, _) in enumerate(TEXT_SPECIALS)}
    talker = _talker(
        shift=shift,
        vocab_size=TINY_CODEBOOK + CONTROL_TOKEN_SPAN,
        hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=512, rope_theta=1000000,
        rope_scaling={"interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default", "type": "default"},
        num_code_groups=16, text_hidden_size=48, text_vocab_size=320,
        code_predictor_config={
            "model_type": "qwen3_tts_talker_code_predictor",
            "vocab_size": TINY_CODEBOOK, "hidden_size": 24, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 12,
            "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "attention_bias": False, "num_code_groups": 16,
        },
    )
    decoder = {
        "codebook_size": TINY_CODEBOOK, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
        "semantic_codebook_size": TINY_CODEBOOK, "num_quantizers": 16, "num_semantic_quantizers": 1,
        "latent_dim": 24, "hidden_size": 16, "intermediate_size": 32, "head_dim": 8,
        "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "sliding_window": 4, "max_position_embeddings": 512, "rope_theta": 10000,
        "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 32,
    }
    encoder = {
        "audio_channels": 1, "num_filters": 4, "kernel_size": 7, "residual_kernel_size": 3,
        "last_kernel_size": 3, "num_residual_layers": 1, "compress": 2, "upsampling_ratios": [8, 6, 5, 4],
        "hidden_size": 16, "upsample_groups": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 8, "intermediate_size": 32, "hidden_act": "gelu", "norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01, "rope_theta": 10000, "max_position_embeddings": 512,
        "sliding_window": 16, "num_quantizers": 16, "num_semantic_quantizers": 1,
        "codebook_size": TINY_CODEBOOK, "codebook_dim": 8, "vector_quantization_hidden_dimension": 8,
        "pad_mode": "constant", "use_causal_conv": True, "frame_rate": 12.5, "sampling_rate": 24000,
    }
    return CheckpointSpec(
        config=_top_config(talker, text_ids, "0b6"),
        generation_config=_generation_config(),
        speech_tokenizer_config=_speech_tokenizer_config(decoder, encoder),
        text_special_ids=text_ids,
    )


def _real_0_6b() -> CheckpointSpec:
    talker = _talker(
        shift=0,
        vocab_size=3072, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=32768, rope_theta=1000000,
        rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default", "type": "default"},
        num_code_groups=16, text_hidden_size=2048, text_vocab_size=151936,
        code_predictor_config={
            "model_type": "qwen3_tts_talker_code_predictor",
            "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072,
            "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "attention_bias": False, "num_code_groups": 16,
        },
    )
    decoder = {
        "codebook_size": 2048, "codebook_dim": 512, "vector_quantization_hidden_dimension": 512,
        "semantic_codebook_size": 4096, "num_quantizers": 16, "num_semantic_quantizers": 1,
        "latent_dim": 1024, "hidden_size": 512, "intermediate_size": 1024, "head_dim": 64,
        "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 8,
        "sliding_window": 72, "max_position_embeddings": 8000, "rope_theta": 10000,
        "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
    }
    encoder = {
        "audio_channels": 1, "num_filters": 64, "kernel_size": 7, "residual_kernel_size": 3,
        "last_kernel_size": 3, "num_residual_layers": 1, "compress": 2, "upsampling_ratios": [8, 6, 5, 4],
        "hidden_size": 512, "upsample_groups": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 64, "intermediate_size": 2048, "hidden_act": "gelu", "norm_eps": 1e-5,
        "layer_scale_initial_scale": 0.01, "rope_theta": 10000, "max_position_embeddings": 8000,
        "sliding_window": 250, "num_quantizers": 32, "num_semantic_quantizers": 1,
        "codebook_size": 2048, "codebook_dim": 256, "vector_quantization_hidden_dimension": 256,
        "pad_mode": "constant", "use_causal_conv": True, "frame_rate": 12.5, "sampling_rate": 24000,
    }
    return CheckpointSpec(
        config=_top_config(talker, dict(_REAL_TEXT_IDS), "0b6"),
        generation_config=_generation_config(),
        speech_tokenizer_config=_speech_tokenizer_config(decoder, encoder),
        text_special_ids=dict(_REAL_TEXT_IDS),
    )


def _speech_tokenizer_config(decoder: dict[str, Any], encoder: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "encoder_config": copy.deepcopy(encoder),
        "decoder_config": copy.deepcopy(decoder),
    }
