"""Tokenizer and chat template of a checkpoint, without ``transformers``.

``tokenizers`` reads ``tokenizer.json``; the chat template (from
``tokenizer_config.json`` or ``chat_template.jinja``) is rendered with a
sandboxed jinja2 environment configured the way Hugging Face renders it, then
tokenized without adding special tokens (the template writes them).

Text in chat messages and tools is the user's, so special-token strings in it
(``<|im_end|>`` typed by a user) are tokenized as the characters they are,
never as control tokens: otherwise a user could close their turn and open a
system or assistant turn. Only the template's own markers stay special
(``encode_chat``; ``specials_in_content=True`` restores the usual behaviour).
"""
from __future__ import annotations

import json
import re
import secrets
import threading
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from edge_infer.errors import CheckpointError, InvalidRequestError


# Texts this long are encoded through encode_batch, which releases the GIL (encode holds it throughout):
# a large prompt tokenized off the event loop then does not stall it.
_RELEASE_GIL_CHARS = 4096


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` (messages or tools: dicts, lists, strings) with ``fn`` applied to every string in it, keys included."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):  # keys too: a template may render them (a tool's property names)
        return {fn(k) if isinstance(k, str) else k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's spelling of the 256 bytes as characters, inverted: printable Latin-1 bytes stand for
    themselves, the other 68 (controls, space, soft hyphen...) for the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    others = [b for b in range(256) if b not in set(printable)]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


_BYTE_LEVEL_ALPHABET = _byte_level_alphabet()
_BYTE_FALLBACK_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _invalid_text(text: str) -> InvalidRequestError:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return InvalidRequestError(f"the text is not valid Unicode (a lone surrogate U+{ord(text[exc.start]):04X} "
                                   f"at character {exc.start}); send UTF-8 text")
    return InvalidRequestError("the text cannot be tokenized")


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def find_chat_template(model_dir: str | Path, config: dict[str, Any] | None = None) -> str | None:
    """The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's (its "default" if named)."""
    model_dir = Path(model_dir)
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = (config if config is not None else _tokenizer_config(model_dir)).get("chat_template")
    if isinstance(template, list):  # named templates: use "default"
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def compile_chat_template(text: str):
    """The template in a sandbox with the globals and filters transformers' templates use."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise InvalidRequestError(f"chat template: {message}")

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(text)
    except TemplateError as exc:
        raise CheckpointError(f"the checkpoint's chat template does not parse: {exc}") from exc


def template_media_kinds(model_dir: str | Path, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Of a multimodal model's media ``kinds``, those its chat template renders in a user message (the part
    types engine/media_prompt.py hands it: ``{"type": kind}``). A checkpoint without a template, or whose
    template does not parse or refuses even a text-only turn, keeps them all: what fails there is not about
    media, and its chat requests fail with that reason anyway."""
    text = find_chat_template(model_dir)
    if not text:
        return kinds
    try:
        template = compile_chat_template(text)
    except CheckpointError:
        return kinds

    def renders(*media: str) -> bool:
        messages = [{"role": "user", "content": [*({"type": kind} for kind in media), {"type": "text", "text": "?"}]}]
        try:
            template.render(messages=messages, tools=None, add_generation_prompt=True, bos_token="", eos_token="",
                            pad_token="", unk_token="")
        except Exception:  # noqa: BLE001 - raise_exception, a jinja error or one of the template's own making
            return False
        return True

    if not renders():
        return kinds
    return tuple(kind for kind in kinds if renders(kind))


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: edge-infer needs the fast tokenizer file tokenizer.json")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on parse errors
            raise CheckpointError(f"{path} could not be read ({exc})") from exc
        self.config = _tokenizer_config(model_dir)
        self.chat_template = find_chat_template(model_dir, self.config)
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.pad_token = _token_text(self.config.get("pad_token"))
        self.unk_token = _token_text(self.config.get("unk_token"))
        # encode_special_tokens is tokenizer state: set and used under one lock.
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token)

    def encode(self, text: str, add_special_tokens: bool = True, specials_as_text: bool = False) -> list[int]:
        """Token ids of ``text``; ``specials_as_text``: special-token strings in it are plain characters."""
        with self._lock:
            self._tok.encode_special_tokens = specials_as_text
            try:
                if len(text) >= _RELEASE_GIL_CHARS:
                    return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
                return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
            except TypeError:  # tokenizers refuses str it cannot convert (lone surrogates)
                raise _invalid_text(text) from None
            finally:
                self._tok.encode_special_tokens = False

    @cached_property
    def max_token_chars(self) -> int:
        """An upper bound on the characters one token covers: its longest vocabulary entry (byte-level BPE
        spells each byte as one character, so this counts bytes, at least as many as characters)."""
        return max(map(len, self._tok.get_vocab(with_added_tokens=True)), default=1)

    @cached_property
    def special_tokens(self) -> dict[str, int]:
        """Special-token strings and their ids (the control tokens a chat template writes)."""
        return {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    @cached_property
    def _stripping(self) -> tuple[set[str], set[str]]:
        """Special tokens that absorb the whitespace before them (lstrip) and after them (rstrip)."""
        added = [t for t in self._tok.get_added_tokens_decoder().values() if t.special]
        return {t.content for t in added if t.lstrip}, {t.content for t in added if t.rstrip}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @cached_property
    def _byte_spelling(self) -> tuple[str, list[tuple[str, str]]]:
        """How vocabulary entries spell bytes, from tokenizer.json's decoder: ``byte_level`` (GPT-2's
        alphabet), ``byte_fallback`` (``<0x0A>`` tokens beside text pieces, whose string replacements such
        as U+2581 for a space come along), or ``text`` (a token's bytes are its decoded text)."""
        decoder = self._tok.decoder
        spec = json.loads(decoder.__getstate__()) if decoder is not None else {}
        steps = spec.get("decoders", [spec])
        kinds = {step.get("type") for step in steps}
        replacements = [(step["pattern"]["String"], step["content"]) for step in steps
                        if step.get("type") == "Replace" and "String" in step.get("pattern", {})]
        replacements += [(step.get("replacement", "\u2581"), " ") for step in steps if step.get("type") == "Metaspace"]
        kind = "byte_level" if "ByteLevel" in kinds else "byte_fallback" if "ByteFallback" in kinds else "text"
        return kind, replacements

    @cached_property
    def _added_token_bytes(self) -> dict[int, bytes]:
        return {i: t.content.encode("utf-8") for i, t in self._tok.get_added_tokens_decoder().items()}

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, also when they end inside a character (its own decode then reads
        U+FFFD): a byte-level vocabulary's tokens' bytes joined are the text's UTF-8 (a SentencePiece one's
        keep the leading space its decoder strips). Unknown ids stand for none."""
        piece = self._tok.id_to_token(token_id)
        kind, replacements = self._byte_spelling
        byte = _BYTE_FALLBACK_TOKEN.fullmatch(piece or "") if kind == "byte_fallback" else None
        if byte:
            return bytes([int(byte.group(1), 16)])
        if token_id in self._added_token_bytes or piece is None:
            return self._added_token_bytes.get(token_id, b"")
        if kind == "byte_level" and all(c in _BYTE_LEVEL_ALPHABET for c in piece):
            return bytes(_BYTE_LEVEL_ALPHABET[c] for c in piece)
        if kind == "byte_fallback":
            for pattern, content in replacements:
                piece = piece.replace(pattern, content)
            return piece.encode("utf-8")
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def decode_stream(self, skip_special_tokens: bool = True) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special_tokens)

    @cached_property
    def _template(self):
        return compile_chat_template(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        if not self.chat_template:
            raise InvalidRequestError(
                "this checkpoint has no chat template (tokenizer_config.json 'chat_template'); "
                "send a plain prompt instead of chat messages"
            )
        from jinja2 import TemplateError

        shadowed = sorted(set(kwargs) & set(self._template.environment.globals))
        if shadowed:  # a variable would hide the template's own function (raise_exception, namespace, ...)
            raise InvalidRequestError(f"the chat template variable {shadowed[0]!r} names one of the template's own "
                                      "functions; leave it out")
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                pad_token=self.pad_token or "",
                unk_token=self.unk_token or "",
                **kwargs,
            )
        except TemplateError as exc:
            raise InvalidRequestError(f"chat template failed on these messages: {exc}") from exc

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        specials_in_content: bool = False, **kwargs: Any,
    ) -> tuple[str, list[int]]:
        """(rendered text, token ids) of a conversation.

        Special-token strings inside ``messages``, ``tools`` and the template variables are masked with
        markers no user can guess before rendering; the rendered text is split
        at the template's own special tokens (tokenizers splits there too, so
        each piece is tokenized as it would be in the whole), and each piece is
        encoded with the masked strings restored as plain text.
        """
        if specials_in_content or not self.special_tokens:
            text = self.apply_chat_template(messages, tools=tools, **kwargs)
            return text, self.encode(text, add_special_tokens=False)
        nonce = secrets.token_hex(8)
        masks = {s: f"\ue000{nonce}{i}\ue001" for i, s in enumerate(self.special_tokens)}
        pattern = re.compile("|".join(re.escape(s) for s in sorted(masks, key=len, reverse=True)))
        mask = lambda s: pattern.sub(lambda m: masks[m.group(0)], s)  # noqa: E731
        unmasked = {m: s for s, m in masks.items()}
        unmask = lambda s: re.sub(f"\ue000{nonce}\\d+\ue001", lambda m: unmasked[m.group(0)], s)  # noqa: E731
        rendered = self.apply_chat_template(_map_strings(messages, mask), tools=_map_strings(tools, mask),
                                            **_map_strings(kwargs, mask))
        text = unmask(rendered)
        if nonce in text:
            raise InvalidRequestError(
                "this chat template rewrites message text in a way that keeps special-token strings from being "
                "read as text; remove them from the messages (or serve with --parse-special-tokens-in-content)"
            )
        # re.split with a group alternates text and special tokens: [text, special, text, ..., text].
        pieces = re.split(f"({pattern.pattern})", rendered)
        lstrip, rstrip = self._stripping
        ids: list[int] = []
        for k in range(0, len(pieces), 2):
            piece = pieces[k]
            if k > 0 and pieces[k - 1] in rstrip:
                piece = piece.lstrip()
            if k + 1 < len(pieces) and pieces[k + 1] in lstrip:
                piece = piece.rstrip()
            if piece:
                ids += self.encode(unmask(piece), add_special_tokens=False, specials_as_text=True)
            if k + 1 < len(pieces):
                ids.append(self.special_tokens[pieces[k + 1]])
        return text, ids


class IncrementalDecoder:
    """Text of a growing token sequence, emitted as it becomes stable.

    Bytes of a multi-byte character split across tokens are held back until
    the character is complete (``tokenizers.decoders.DecodeStream``). Token
    ids unknown to the tokenizer (a model vocabulary larger than the
    tokenizer's) decode to nothing.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._tok = tokenizer._tok
        self._skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._emitted = 0  # characters returned so far

    @property
    def emitted(self) -> int:
        """Characters returned so far."""
        return self._emitted

    def step(self, token_id: int) -> str:
        try:
            piece = self._stream.step(self._tok, token_id) or ""
        except Exception:  # ids beyond the tokenizer's vocabulary
            piece = ""
        self._emitted += len(piece)
        return piece

    def flush(self, ids: list[int]) -> str:
        """What is still held back when the sequence ``ids`` (every id stepped so far) ends:
        an incomplete character decodes to U+FFFD, so the final text equals decoding every id at once."""
        full = self._tokenizer.decode(ids, self._skip_special_tokens)  # unknown ids decode to nothing here too
        rest = full[self._emitted:]
        self._emitted = len(full)
        return rest
