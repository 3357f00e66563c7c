"""The Talker's text tokenizer (Qwen2 byte-level BPE) through ``tokenizers``.

Qwen3-TTS checkpoints ship ``vocab.json`` + ``merges.txt`` +
``tokenizer_config.json`` (a ``tokenizer.json``, when present, is used
as is). From the former we build what ``transformers`` builds for a Qwen2
tokenizer: NFC normalisation, the Qwen2 split regex, byte-level BPE, and
the special tokens of ``added_tokens_decoder`` at their listed ids.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# The pre-tokenisation split Qwen2 tokenizers use (contractions, letters, single digits, ...).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _from_bpe_files(model_dir: Path) -> Tokenizer:
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
    merges = []
    for line in (model_dir / "merges.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#version"):
            left, right = line.split(" ")
            merges.append((left, right))
    added = config.get("added_tokens_decoder", {})
    # Put the special tokens into the model vocabulary at their own ids, so
    # that adding them below reuses those ids whatever the vocabulary size.
    for token_id, entry in added.items():
        vocab.setdefault(entry["content"], int(token_id))
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)), use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokens = [
        AddedToken(e["content"], single_word=e.get("single_word", False), lstrip=e.get("lstrip", False),
                   rstrip=e.get("rstrip", False), normalized=e.get("normalized", False), special=e.get("special", True))
        for _, e in sorted(added.items(), key=lambda kv: int(kv[0]))
    ]
    tokenizer.add_special_tokens(tokens)
    for token_id, entry in added.items():
        if tokenizer.token_to_id(entry["content"]) != int(token_id):
            raise ValueError(f"{config_path}: special token {entry['content']!r} did not get its id {token_id}")
    return tokenizer


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "TextTokenizer":
        model_dir = Path(model_dir)
        if (model_dir / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(model_dir / "tokenizer.json")))
        if (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file():
            return cls(_from_bpe_files(model_dir))
        raise FileNotFoundError(
            f"{model_dir} has no text tokenizer: expected tokenizer.json, or vocab.json + merges.txt"
        )

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; special tokens written in the text (e.g. <|im_start|>) are recognised."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def assistant_ids(self, text: str) -> list[int]:
        """The text to speak, in the assistant-turn layout the Talker's prompt is sliced from."""
        return self.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def instruct_ids(self, instruct: str) -> list[int]:
        """A style instruction, as a user turn prepended to the prompt."""
        return self.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n")
