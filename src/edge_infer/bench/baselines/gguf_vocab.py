"""A checkpoint's byte-level BPE tokenizer as GGUF metadata (llama.cpp's `gpt2` tokenizer model).

GGUF stores the vocabulary as one list indexed by token id, with a type per
token (normal, control for special tokens, user-defined for other added
tokens, unused for padding), the merges in priority order, the special ids
and the chat template. llama.cpp sizes the embedding from the token list,
so the list is padded to the config's `vocab_size` (checkpoints often pad
their embedding beyond the tokenizer) with `[PAD<id>]` entries.

llama.cpp splits text with a pre-tokenizer regex of its own, named by
`tokenizer.ggml.pre`; it is chosen by family (what the real checkpoints of
that family use). Text tokenized by llama.cpp can therefore differ from
ours for tokenizers that split differently; the benchmarks and the
agreement check pass token ids, never text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_infer.errors import CheckpointError
from edge_infer.models.config import ModelConfig

# Values of gguf.TokenType (kept here so this module imports without gguf).
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

PRE_TOKENIZER = {"qwen2": "qwen2", "qwen3": "qwen2", "llama": "llama-bpe", "mistral": "tekken"}


@dataclass(frozen=True)
class GGUFVocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None


def _is_byte_level(component: dict[str, Any] | None) -> bool:
    if not component:
        return False
    if component.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(c) for c in component.get("pretokenizers", []) or component.get("decoders", []))


def _adds_bos(data: dict[str, Any], tokenizer_config: dict[str, Any]) -> bool:
    """Whether encoding plain text prepends a special token (Llama 3 does, Qwen does not)."""
    if "add_bos_token" in tokenizer_config:
        return bool(tokenizer_config["add_bos_token"])
    post = data.get("post_processor") or {}
    processors = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for p in processors:
        if p.get("type") == "TemplateProcessing" and p.get("single"):
            return "SpecialToken" in p["single"][0]
    return False


def _merge_text(merge: str | list[str]) -> str:
    # tokenizers writes merges as "a b" (older) or ["a", "b"] (newer); GGUF wants "a b".
    return merge if isinstance(merge, str) else " ".join(merge)


def read_vocab(model_dir: str | Path, cfg: ModelConfig) -> GGUFVocab:
    from edge_infer.models.generation_config import GenerationDefaults
    from edge_infer.models.tokenizer import Tokenizer

    n_vocab = cfg.vocab_size
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: a GGUF export needs the checkpoint's tokenizer.json")
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not _is_byte_level(data.get("pre_tokenizer")):
        raise CheckpointError(
            f"{path}: GGUF export supports byte-level BPE tokenizers (model BPE with a ByteLevel pre-tokenizer), "
            f"this one is {model.get('type')} with pre-tokenizer {(data.get('pre_tokenizer') or {}).get('type')}"
        )
    tokens: list[str | None] = [None] * n_vocab
    types = [UNUSED] * n_vocab
    entries = [(tok, tid, NORMAL) for tok, tid in model["vocab"].items()]
    entries += [(t["content"], t["id"], CONTROL if t.get("special") else USER_DEFINED) for t in data.get("added_tokens", [])]
    too_big = sorted(tid for _, tid, _ in entries if tid >= n_vocab)
    if too_big:
        raise CheckpointError(
            f"{path} has token ids up to {too_big[-1]} but config.json vocab_size is {n_vocab}: "
            "the embedding has no row for them; the tokenizer does not belong to this checkpoint"
        )
    for tok, tid, kind in entries:
        tokens[tid], types[tid] = tok, kind
    filled = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]

    tok = Tokenizer(model_dir)
    eos_ids = GenerationDefaults.from_dir(model_dir, tok.eos_token_id).eos_token_ids
    return GGUFVocab(
        tokens=filled,
        token_types=types,
        merges=[_merge_text(m) for m in model.get("merges", [])],
        pre=PRE_TOKENIZER[cfg.family],
        # Qwen tokenizers name no BOS; config.json does (unused while add_bos is false, as for the original).
        bos_id=tok.bos_token_id if tok.bos_token_id is not None else cfg.raw.get("bos_token_id"),
        eos_id=eos_ids[0] if eos_ids else tok.eos_token_id,
        pad_id=tok.token_to_id(tok.pad_token),
        add_bos=_adds_bos(data, tok.config),
        chat_template=tok.chat_template,
    )


def write_vocab(writer: Any, vocab: GGUFVocab) -> None:
    """Add the tokenizer keys to a `gguf.GGUFWriter`."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    for setter, value in ((writer.add_bos_token_id, vocab.bos_id), (writer.add_eos_token_id, vocab.eos_id),
                          (writer.add_pad_token_id, vocab.pad_id)):
        if value is not None:
            setter(value)
    writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
