"""A token's bytes (chat logprobs' ``bytes``): joined, a text's tokens give its UTF-8 back, also where one
character's bytes are split between tokens and each token's own decode reads U+FFFD."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, normalizers

from edge_infer.models.checkpoint import demo_model_dir
from edge_infer.models.synth import write_checkpoint
from edge_infer.models.tokenizer import Tokenizer

TEXT = "Grüße, 🦜 naïve 東京<|im_end|>\n\t"


@pytest.fixture(scope="module", params=["demo", "qwen2", "llama", "mistral"])
def byte_level(request, tmp_path_factory) -> Tokenizer:
    if request.param == "demo":
        return Tokenizer(demo_model_dir())
    return Tokenizer(write_checkpoint(tmp_path_factory.mktemp(request.param) / "m", request.param, "tiny", dtype="float32"))


def test_byte_level_tokens_joined_are_the_texts_utf8(byte_level):
    ids = byte_level.encode(TEXT, add_special_tokens=False)
    assert sum(byte_level.decode([i]) == "\ufffd" for i in ids) >= 2  # characters split between byte tokens
    assert b"".join(map(byte_level.token_bytes, ids)) == TEXT.encode("utf-8")
    assert byte_level.token_bytes(byte_level.vocab_size + 5) == b""  # an id past the vocabulary stands for nothing


@pytest.mark.parametrize("space", ["replace", "metaspace"])
def test_sentencepiece_byte_fallback_tokens_give_their_byte(tmp_path, space):
    """A SentencePiece vocabulary (Llama 2, Mistral 7B v0.1): characters it lacks are <0xNN> tokens, a space is U+2581
    (turned back by a Replace step of the decoder, or by its Metaspace step)."""
    pieces = [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "\u2581w"]
    tok = HFTokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [("\u2581", "h"), ("\u2581", "w")], byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    if space == "replace":
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(), decoders.Fuse()])
    tok.add_special_tokens(["</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    tokenizer = Tokenizer(tmp_path)
    text = "hello wörld 🦜</s>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.token_bytes(ids[-1]) == b"</s>" and tokenizer.token_bytes(pieces.index("<0xF0>")) == b"\xf0"
    # The decoder strips the space the normalizer put before the first word; the tokens keep it.
    assert b"".join(map(tokenizer.token_bytes, ids)) == b" " + text.encode("utf-8")
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
