"""Versioned payload contracts between stages.

A contract is named ``kind/version`` (``pcm_audio/1``). Each one fixes the
payload's data kind (tensor or text), its dtypes, its shape rule and its
required metadata. ``validate`` returns a verdict with machine-readable
violation codes, so that the portable fixtures in ``contracts/conformance``
state the expected verdict without depending on this implementation's wording.

The wire form (``to_wire`` / ``from_wire``) is JSON: tensors travel as dtype,
shape and base64 little-endian C-order bytes. See docs/contracts.md.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# Violation codes: the portable part of a verdict.
UNKNOWN_CONTRACT = "contract.unknown"
DATA_KIND = "data.kind"
DTYPE = "dtype"
SHAPE = "shape"
METADATA_MISSING = "metadata.missing"
METADATA_TYPE = "metadata.type"
METADATA_VALUE = "metadata.value"
VALUE_RANGE = "value.range"
ENCODING = "encoding"


@dataclass
class Payload:
    """One chunk of data crossing a stage boundary."""

    contract: str
    data: np.ndarray | str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        if isinstance(self.data, str):
            return len(self.data.encode("utf-8"))
        return int(self.data.nbytes)

    @property
    def items(self) -> int:
        """Leading-dimension length: tokens, frames, samples, rows; characters for text."""
        if isinstance(self.data, str):
            return len(self.data)
        return int(self.data.shape[0]) if self.data.ndim else 1


@dataclass(frozen=True)
class Violation:
    code: str
    message: str


@dataclass(frozen=True)
class Verdict:
    contract: str
    violations: tuple[Violation, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def codes(self) -> list[str]:
        return sorted({v.code for v in self.violations})

    @property
    def reasons(self) -> list[str]:
        return [v.message for v in self.violations]

    def __bool__(self) -> bool:
        return self.valid


@dataclass(frozen=True)
class MetaRule:
    """A metadata key: its type and an optional value check returning a problem."""

    key: str
    kind: str  # "int", "number" or "str"
    required: bool = True
    check: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class ContractSpec:
    name: str
    version: int
    summary: str
    dtypes: tuple[str, ...] = ()  # empty: a text contract
    ndim: int = 0
    dims: tuple[str, ...] = ()  # names of the axes, for messages and docs
    metadata: tuple[MetaRule, ...] = ()
    # Rules linking data and metadata (shape vs metadata, value ranges; a text contract's form).
    check: Callable[[Any, dict[str, Any]], list[Violation]] | None = None

    @property
    def id(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def is_text(self) -> bool:
        return not self.dtypes


def _positive(v: Any) -> str | None:
    return None if v > 0 else f"must be > 0, got {v}"


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


def _check_token_ids(data: np.ndarray, meta: dict[str, Any]) -> list[Violation]:
    out = []
    if data.size and int(data.min()) < 0:
        out.append(Violation(VALUE_RANGE, f"token ids must be >= 0, found {int(data.min())}"))
    vocab = meta.get("vocab_size")
    if _is_int(vocab) and data.size and int(data.max()) >= vocab:
        out.append(Violation(VALUE_RANGE, f"token id {int(data.max())} is >= vocab_size {vocab}"))
    return out


def _check_hidden(data: np.ndarray, meta: dict[str, Any]) -> list[Violation]:
    out = []
    hidden = meta.get("hidden_size")
    if _is_int(hidden) and data.shape[1] != hidden:
        out.append(Violation(SHAPE, f"shape[1] is {data.shape[1]} but metadata hidden_size is {hidden}"))
    if not np.isfinite(data).all():
        out.append(Violation(VALUE_RANGE, "hidden states contain NaN or infinity"))
    return out


def _check_mrope(data: np.ndarray, meta: dict[str, Any]) -> list[Violation]:
    if data.shape[0] != 3:
        return [Violation(SHAPE, f"M-RoPE positions have 3 axes (time, height, width), shape[0] is {data.shape[0]}")]
    if data.size and int(data.min()) < 0:
        return [Violation(VALUE_RANGE, f"positions must be >= 0, found {int(data.min())}")]
    return []


def _check_codec(data: np.ndarray, meta: dict[str, Any]) -> list[Violation]:
    out = []
    books = meta.get("num_codebooks")
    if _is_int(books) and data.shape[1] != books:
        out.append(Violation(SHAPE, f"shape[1] is {data.shape[1]} codebooks but metadata num_codebooks is {books}"))
    if data.size and int(data.min()) < 0:
        out.append(Violation(VALUE_RANGE, f"codes must be >= 0, found {int(data.min())}"))
    size = meta.get("codebook_size")
    if _is_int(size) and data.size and int(data.max()) >= size:
        out.append(Violation(VALUE_RANGE, f"code {int(data.max())} is >= codebook_size {size}"))
    return out


def _check_pcm(data: np.ndarray, meta: dict[str, Any]) -> list[Violation]:
    if not np.isfinite(data).all():
        return [Violation(VALUE_RANGE, "PCM samples contain NaN or infinity")]
    peak = float(np.abs(data).max()) if data.size else 0.0
    if peak > 1.0:
        return [Violation(VALUE_RANGE, f"PCM samples must lie in [-1, 1] (full scale), peak is {peak:g}")]
    return []


_IMAGE_MODES = {"L": 1, "RGB": 3, "RGBA": 4}


def _check_image(data: np.ndarray, meta: dict[str, Any]) -> list[Violation]:
    out = []
    if data.shape[0] < 1 or data.shape[1] < 1:
        out.append(Violation(SHAPE, f"an image needs height and width >= 1, got {list(data.shape[:2])}"))
    mode = meta.get("mode")
    if mode in _IMAGE_MODES and data.shape[2] != _IMAGE_MODES[mode]:
        out.append(Violation(SHAPE, f"mode {mode} needs {_IMAGE_MODES[mode]} channels, shape[2] is {data.shape[2]}"))
    return out


def _check_chat(data: str, meta: dict[str, Any]) -> list[Violation]:
    try:
        messages = json.loads(data)
    except json.JSONDecodeError as exc:
        return [Violation(ENCODING, f"chat/1 carries messages as JSON; this is not JSON ({exc})")]
    if not (isinstance(messages, list) and messages
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
        return [Violation(SHAPE, "chat/1 is a non-empty JSON list of message objects, each with a string 'role'")]
    return []


CONTRACTS: dict[str, ContractSpec] = {
    spec.id: spec
    for spec in (
        ContractSpec(
            "token_ids", 1, "token ids, one chunk of a sequence",
            dtypes=("int32", "int64"), ndim=1, dims=("tokens",),
            metadata=(MetaRule("vocab_size", "int", required=False, check=_positive),),
            check=_check_token_ids,
        ),
        ContractSpec("text", 1, "UTF-8 text"),
        ContractSpec("chat", 1, "chat messages as JSON text: [{role, content}], content a string or OpenAI content "
                                "parts (text, image_url, input_audio, audio_url, video_url)", check=_check_chat),
        ContractSpec(
            "hidden_states", 1, "per-token hidden states",
            dtypes=("float32", "float16"), ndim=2, dims=("tokens", "hidden"),
            metadata=(MetaRule("hidden_size", "int", check=_positive),),
            check=_check_hidden,
        ),
        ContractSpec(
            "mrope_positions", 1, "a prompt's multimodal RoPE positions: time, height, width per token",
            dtypes=("int32", "int64"), ndim=2, dims=("axes", "tokens"),
            metadata=(MetaRule("delta", "int"),),  # a generated token i sits at i + delta on every axis
            check=_check_mrope,
        ),
        ContractSpec(
            "codec_codes", 1, "audio codec codes, one chunk of frames",
            dtypes=("int16", "int32", "int64"), ndim=2, dims=("frames", "codebooks"),
            metadata=(
                MetaRule("num_codebooks", "int", check=_positive),
                MetaRule("frame_rate_hz", "number", check=_positive),
                MetaRule("codebook_size", "int", required=False, check=_positive),
            ),
            check=_check_codec,
        ),
        ContractSpec(
            "pcm_audio", 1, "float32 mono PCM, full scale +-1",
            dtypes=("float32",), ndim=1, dims=("samples",),
            metadata=(
                MetaRule("sample_rate", "int", check=_positive),
                MetaRule("channels", "int", check=lambda v: None if v == 1 else f"pcm_audio/1 is mono: channels must be 1, got {v}"),
            ),
            check=_check_pcm,
        ),
        ContractSpec(
            "image", 1, "8-bit image, height x width x channels",
            dtypes=("uint8",), ndim=3, dims=("height", "width", "channels"),
            metadata=(MetaRule("mode", "str", check=lambda v: None if v in _IMAGE_MODES else f"must be one of {', '.join(_IMAGE_MODES)}, got {v!r}"),),
            check=_check_image,
        ),
    )
}


def known_contracts() -> list[str]:
    return sorted(CONTRACTS)


def _check_metadata(spec: ContractSpec, meta: dict[str, Any]) -> list[Violation]:
    out = []
    for rule in spec.metadata:
        if rule.key not in meta:
            if rule.required:
                out.append(Violation(METADATA_MISSING, f"{spec.id} requires metadata {rule.key!r}"))
            continue
        value = meta[rule.key]
        typed = {"int": _is_int, "number": _is_number, "str": lambda v: isinstance(v, str)}[rule.kind](value)
        if not typed:
            out.append(Violation(METADATA_TYPE, f"metadata {rule.key!r} must be {rule.kind}, got {value!r}"))
            continue
        problem = rule.check(value) if rule.check else None
        if problem:
            out.append(Violation(METADATA_VALUE, f"metadata {rule.key!r} {problem}"))
    return out


def validate(payload: Payload) -> Verdict:
    """Check a payload against the contract it names."""
    spec = CONTRACTS.get(payload.contract)
    if spec is None:
        return Verdict(payload.contract, (Violation(UNKNOWN_CONTRACT, f"unknown contract {payload.contract!r}; known: {', '.join(known_contracts())}"),))
    if not isinstance(payload.metadata, dict):
        return Verdict(spec.id, (Violation(METADATA_TYPE, "metadata must be a mapping"),))
    if spec.is_text:
        if not isinstance(payload.data, str):
            return Verdict(spec.id, (Violation(DATA_KIND, f"{spec.id} carries text, got {type(payload.data).__name__}"),))
        out = _check_metadata(spec, payload.metadata)
        if spec.check is not None:
            out.extend(spec.check(payload.data, payload.metadata))
        return Verdict(spec.id, tuple(out))
    data = payload.data
    if not isinstance(data, np.ndarray):
        return Verdict(spec.id, (Violation(DATA_KIND, f"{spec.id} carries a tensor, got {type(data).__name__}"),))
    out = _check_metadata(spec, payload.metadata)
    if data.dtype.name not in spec.dtypes:
        out.append(Violation(DTYPE, f"{spec.id} dtype must be one of {', '.join(spec.dtypes)}, got {data.dtype.name}"))
    if data.ndim != spec.ndim:
        out.append(Violation(SHAPE, f"{spec.id} shape must be [{', '.join(spec.dims)}] ({spec.ndim}-D), got {list(data.shape)}"))
    # Data/metadata rules assume the dtype family and rank are right.
    if not out and spec.check is not None:
        out.extend(spec.check(data, payload.metadata))
    return Verdict(spec.id, tuple(out))


# --- wire form ----------------------------------------------------------


class WireError(ValueError):
    """A wire document that cannot be decoded into a payload."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


_WIRE_DTYPES = ("int16", "int32", "int64", "uint8", "float16", "float32")


def to_wire(payload: Payload) -> dict[str, Any]:
    doc: dict[str, Any] = {"contract": payload.contract, "metadata": dict(payload.metadata)}
    if isinstance(payload.data, str):
        doc["text"] = payload.data
        return doc
    arr = np.ascontiguousarray(payload.data)
    little = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    doc["tensor"] = {
        "dtype": arr.dtype.name,
        "shape": list(arr.shape),
        "data": base64.b64encode(little.tobytes()).decode("ascii"),
    }
    return doc


def from_wire(doc: dict[str, Any]) -> Payload:
    """Decode a wire document; raises WireError with a violation code."""
    if not isinstance(doc, dict) or not isinstance(doc.get("contract"), str):
        raise WireError(ENCODING, "a wire payload is an object with a string 'contract'")
    meta = doc.get("metadata", {})
    if "text" in doc and "tensor" in doc:
        raise WireError(ENCODING, "a wire payload has either 'text' or 'tensor', not both")
    if "text" in doc:
        if not isinstance(doc["text"], str):
            raise WireError(DATA_KIND, "'text' must be a string")
        return Payload(doc["contract"], doc["text"], meta)
    tensor = doc.get("tensor")
    if not isinstance(tensor, dict):
        raise WireError(DATA_KIND, "a wire payload has either 'text' or a 'tensor' object")
    dtype, shape, data = tensor.get("dtype"), tensor.get("shape"), tensor.get("data")
    if dtype not in _WIRE_DTYPES:
        raise WireError(DTYPE, f"tensor dtype must be one of {', '.join(_WIRE_DTYPES)}, got {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise WireError(ENCODING, f"tensor shape must be a list of non-negative integers, got {shape!r}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise WireError(ENCODING, "tensor data is not valid base64") from None
    le = np.dtype(dtype).newbyteorder("<")
    expected = math.prod(shape) * le.itemsize
    if len(raw) != expected:
        raise WireError(ENCODING, f"tensor data holds {len(raw)} bytes, shape {shape} of {dtype} needs {expected}")
    arr = np.frombuffer(raw, dtype=le).reshape(shape).astype(np.dtype(dtype), copy=True)
    return Payload(doc["contract"], arr, meta)


def validate_wire(doc: dict[str, Any]) -> Verdict:
    """Decode and validate a wire document: what an external backend checks itself against."""
    try:
        payload = from_wire(doc)
    except WireError as exc:
        contract = doc.get("contract", "?") if isinstance(doc, dict) else "?"
        return Verdict(str(contract), (Violation(exc.code, str(exc)),))
    return validate(payload)
