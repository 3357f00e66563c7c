"""The on-disk layout of a Qwen3-TTS checkpoint (everything but tensors).

::

    config.json                   Qwen3TTSConfig: talker (+ code predictor) and text special ids
    generation_config.json        default sampling parameters
    model.safetensors             talker.* weights (or sharded, with model.safetensors.index.json)
    vocab.json, merges.txt        byte-level BPE of the text tokenizer (Qwen2 style)
    tokenizer_config.json         special tokens (added_tokens_decoder) and tokenizer class
    speech_tokenizer/config.json  the 12 Hz codec: encoder_config (Mimi) + decoder_config (Code2Wav)
    speech_tokenizer/preprocessor_config.json
    speech_tokenizer/model.safetensors   encoder.* and decoder.* weights

No torch here: the fixture script writes the same files from the reference
environment.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_infer.models.qwen3_tts.presets import TINY_MERGES, CheckpointSpec

SPEECH_TOKENIZER_DIR = "speech_tokenizer"


def bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character table of byte-level BPE (GPT-2 / Qwen2).

    Printable Latin-1 bytes map to themselves; the others are moved to
    code points from 256 upwards, in byte order.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def tiny_bpe() -> tuple[dict[str, int], list[str]]:
    """Vocabulary and merges of the stand-in text tokenizer."""
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    for merge in TINY_MERGES:
        left, right = merge.split(" ")
        if left not in vocab or right not in vocab or left + right in vocab:
            raise ValueError(f"tiny BPE merge {merge!r} is not a new merge of known tokens")
        vocab[left + right] = len(vocab)
    return vocab, list(TINY_MERGES)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_text_tokenizer(out_dir: Path, special_ids: dict[str, int]) -> None:
    """vocab.json + merges.txt + tokenizer_config.json, as the Qwen checkpoints ship them."""
    vocab, merges = tiny_bpe()
    clash = [name for name, i in special_ids.items() if i < len(vocab)]
    if clash:
        raise ValueError(f"special tokens {clash} collide with the BPE vocabulary (ids < {len(vocab)})")
    write_json(out_dir / "vocab.json", vocab)
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = {
        str(i): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for name, i in sorted(special_ids.items(), key=lambda kv: kv[1])
    }
    write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 131072,
    })


def write_configs(out_dir: Path, spec: CheckpointSpec) -> None:
    """All JSON and tokenizer files of a checkpoint (weights are written separately)."""
    write_json(out_dir / "config.json", spec.config)
    write_json(out_dir / "generation_config.json", spec.generation_config)
    write_text_tokenizer(out_dir, spec.text_special_ids)
    codec_dir = out_dir / SPEECH_TOKENIZER_DIR
    write_json(codec_dir / "config.json", spec.speech_tokenizer_config)
    write_json(codec_dir / "preprocessor_config.json", {
        "feature_extractor_type": "EncodecFeatureExtractor",
        "feature_size": 1,
        "sampling_rate": spec.speech_tokenizer_config["input_sample_rate"],
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "chunk_length_s": None,
        "overlap": None,
    })
