"""Structured output: what a request's output must match, compiled by llguidance and applied as a token mask.

Two sides, one library (llguidance; docs/serving.md has the comparison with
xgrammar that chose it):

- the frontend compiles a request's ``StructuredOutputsParams`` to
  llguidance's grammar text and checks it (``compile_grammar``), so a bad
  schema, regex or grammar is refused before
  the request leaves, with llguidance's words for what is wrong;
- the core keeps one matcher per request (``GrammarMatchers``): each step it
  fills the masks of every constrained row at once (llguidance's threads, the
  GIL released), the sampler sends the disallowed tokens to -inf, and the
  sampled token advances the matcher.

The core builds the tokenizer view llguidance needs from ``tokenizer.json``
on the first constrained request; the memory plan counts it all the same.
"""
from __future__ import annotations

import functools
import hashlib
import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.engine.sampling_params import StructuredOutputsParams
from edge_infer.errors import GrammarLimitError, InvalidRequestError

if TYPE_CHECKING:
    import llguidance
    import torch

# JSON is written compactly or pretty-printed as the model likes, but whitespace between two tokens is one
# space or a line break and an indent of at most 20 (as llama.cpp's JSON grammars bound it): a weak model must
# not be able to fill max_tokens with blanks between two keys.
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})?"}


# JSON nested deeper is refused (a request's body, a schema): no real schema comes near, and the walks over a schema
# (closed_objects, the chat template's) recurse once or twice a level.
MAX_JSON_DEPTH = 100


def nesting_depth(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        members = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if members is not None:
            deepest = max(deepest, depth)
            stack.extend((member, depth + 1) for member in members)
    return deepest


def closed_objects(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` but says nothing of other keys closed to them
    (``additionalProperties: false``), as OpenAI's strict mode and xgrammar's default read a schema. Output
    that matches the closed schema matches the original; an open one lets a weak model add keys until
    max_tokens. An object without ``properties`` (any JSON object) stays open. A schema nested deeper than
    MAX_JSON_DEPTH is refused."""
    if (depth := nesting_depth(schema)) > MAX_JSON_DEPTH:
        raise InvalidRequestError(f"the JSON schema nests {depth} levels deep, more than the {MAX_JSON_DEPTH} "
                                  "edge-infer takes; flatten it (with $defs and $ref)")
    return _closed(schema)


_VALUES = ("const", "enum", "default", "examples")  # JSON values, not schemas: left as they are
_SCHEMAS_BY_NAME = ("properties", "$defs", "definitions", "patternProperties")  # name -> schema


def _closed(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():  # each member walked once: twice a level is 2**depth walks
        if key in _VALUES:
            out[key] = value
        elif key in _SCHEMAS_BY_NAME and isinstance(value, dict):
            out[key] = {name: _closed(sub) for name, sub in value.items()}
        else:
            out[key] = _closed(value)
    if "properties" in schema and "additionalProperties" not in schema and "patternProperties" not in schema:
        out["additionalProperties"] = False
    return out


def load_ll_tokenizer(tokenizer_file: Path, vocab_size: int, eos_token_ids: tuple[int, ...]) -> "llguidance.LLTokenizer":
    """llguidance's view of the tokenizer (as large as the tokenizer itself: memory/sizing plans it)."""
    import llguidance

    # n_vocab: the model's rows (often padded past the tokenizer's ids); the extra rows are never allowed.
    try:
        return llguidance.LLTokenizer(tokenizer_file.read_text(), n_vocab=vocab_size,
                                      eos_token=list(eos_token_ids) or None)
    except ValueError as exc:  # a tokenizer whose pieces llguidance cannot map to bytes (e.g. its decoder type)
        raise InvalidRequestError(f"structured output is not available for this model: llguidance cannot "
                                  f"read its tokenizer ({exc})") from exc


def grammar_text(spec: StructuredOutputsParams) -> str:
    """llguidance's grammar for ``spec`` (not yet checked: ``compile_grammar`` does that)."""
    from llguidance import LLMatcher

    if spec.json is not None:
        schema = spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError(f"a JSON schema is an object (or true/false), not a {type(schema).__name__}")
        return LLMatcher.grammar_from_json_schema(closed_objects(schema), defaults=JSON_OPTIONS)
    if spec.json_object:
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if spec.regex is not None:
        return LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        # Lark string literals take JSON's escapes, so any text (quotes, newlines, non-ASCII) is spelled exactly. One
        # terminal (a lexeme), not one rule per choice: the parser would follow every choice at once, and more than
        # llguidance's 2,000 (PARSER_LIMIT_HINT) ended the request after its first token.
        return LLMatcher.grammar_from_lark("start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c) for c in spec.choice))
    grammar = spec.grammar or ""
    if "::=" in grammar:  # GBNF, as llama.cpp's grammars are written
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            grammar = gbnf_to_lark(grammar)
        except Exception as exc:  # the converter raises plain exceptions on syntax errors
            raise InvalidRequestError(f"the GBNF grammar could not be read: {exc}") from exc
    return LLMatcher.grammar_from_lark(grammar)


class CheckedGrammar(StructuredOutputsParams):
    """A spec ``compile_grammar`` has checked, as its grammar text: taken as it is when compiled again (a large
    schema takes seconds to check; the server checks a request's once, off the event loop, for all its samples)."""


def checked_grammar(spec: StructuredOutputsParams) -> CheckedGrammar:
    return CheckedGrammar(grammar=compile_grammar(spec))


def schema_problem(schema: dict[str, Any]) -> str:
    """llguidance's words if output cannot be held to the JSON Schema ``schema`` ("Invalid type: bogus"), else ""."""
    from llguidance import LLMatcher

    try:
        grammar = grammar_text(StructuredOutputsParams(json=schema))
    except ValueError as exc:
        return str(exc)
    return (LLMatcher.validate_grammar(grammar) or "").strip()


def compile_grammar(spec: StructuredOutputsParams) -> str:
    """The frontend's side: a request's structured-output spec to a checked grammar. Checked without the
    tokenizer: llguidance's view of a 150k vocabulary is about as large as the tokenizer itself (memory/sizing
    plans the worker's copy), and only a grammar naming special tokens needs it (the worker then reports)."""
    from llguidance import LLMatcher

    if isinstance(spec, CheckedGrammar):
        return spec.grammar
    try:
        grammar = grammar_text(spec)
    except ValueError as exc:  # llguidance: the schema argument is not JSON
        raise InvalidRequestError(f"the structured-output spec could not be read: {exc}") from exc
    problem = LLMatcher.validate_grammar(grammar)
    if problem:
        raise InvalidRequestError(f"the {spec.kind.replace('_', ' ')} for structured output is not usable: "
                                  f"{problem.strip()}")
    if problem := parser_limit_problem(grammar):
        raise GrammarLimitError(f"the {spec.kind.replace('_', ' ')} for structured output is beyond llguidance's "
                                f"parser limits ({problem}); {PARSER_LIMIT_HINT}")
    return grammar


# What a grammar beyond llguidance's parser limits (ParserLimits: max_items_in_row 2,000, step_max_items 50,000)
# usually is, and what to do. The limits stay llguidance's: they bound each step's work, and a right-recursive
# grammar under max_items_in_row 4,000 took 12 times the time of 2,000 (122 ms steps).
PARSER_LIMIT_HINT = ("the parser follows at most 2,000 items at one point of the output: give anyOf, oneOf or enum "
                     "fewer alternatives that are objects or arrays (nested ones multiply; keep well under 2,000), or "
                     "use a string enum, which has no such limit")
PROBE_BYTES = 64  # how far the check walks into the output
_STRUCTURAL = b'"{[:,]}0123456789-tfn'  # tried first, and walked: the walk closes strings and opens values


class _ByteTokens:
    """A tokenizer of the 256 bytes (and an end): what llguidance needs to walk a grammar without the model's."""

    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([b]) for b in range(256)] + [b""]
    special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


@functools.cache
def _byte_tokenizer() -> "llguidance.LLTokenizer":
    from llguidance import LLTokenizer, TokenizerWrapper

    return LLTokenizer(TokenizerWrapper(_ByteTokens()))


# Grammar digest -> what its walk found: a tool set's grammar, sent with every request, is walked once.
_WALKED: dict[bytes, str] = {}
_WALKED_MAX = 256
_WALKED_LOCK = threading.Lock()


def parser_limit_problem(grammar: str) -> str:
    """llguidance's words if ``grammar`` meets a parser limit on a short walk into its output (_walk), else "";
    remembered for the last _WALKED_MAX grammars (by digest: a large schema's text is not kept)."""
    key = hashlib.blake2b(grammar.encode(), digest_size=16).digest()
    with _WALKED_LOCK:
        found = _WALKED.get(key)
    if found is None:
        found = _walk(grammar)
        with _WALKED_LOCK:
            if len(_WALKED) >= _WALKED_MAX:
                del _WALKED[next(iter(_WALKED))]
            _WALKED[key] = found
    return found


def _walk(grammar: str) -> str:
    """llguidance's words if ``grammar`` meets a parser limit on a short walk into its output, else "". A limit
    is met only when the parser gets somewhere (validate_grammar, building a matcher and its first mask all pass):
    3,000 object alternatives fail on the "{" that opens one, which ended the request after one token. So the
    check walks PROBE_BYTES bytes, a byte at a time, and tries each byte allowed on the way (all of them where few
    are, the structural ones in free text). A limit met off that walk ends the request with finish reason
    GRAMMAR_LIMIT, its text kept."""
    from llguidance import LLMatcher

    matcher = LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    if matcher.is_error():  # a grammar naming the model's special tokens: the worker's matcher checks it
        return ""
    for _ in range(PROBE_BYTES):
        mask = matcher.compute_bitmask()
        allowed = [b for b in range(256) if mask[b >> 3] >> (b & 7) & 1]
        if matcher.is_error() or not allowed or matcher.is_stopped():
            return met_limit(matcher)
        tried = allowed if len(allowed) <= 32 else [b for b in allowed if b in _STRUCTURAL] + [allowed[0], allowed[-1]]
        for byte in tried:
            if not (branch := matcher.deep_copy()).consume_token(byte):
                return met_limit(branch)
        matcher.consume_token(next((b for b in _STRUCTURAL if b in allowed), allowed[0]))
    return ""


def met_limit(matcher: "llguidance.LLMatcher") -> str:
    """The first line of ``matcher``'s error when it met a parser limit (it says which, and the limit: "... max is
    2000"), else "" (a dead end, whose first line is its reason: nothing can continue the output; or no error)."""
    first = (matcher.get_error().strip().splitlines() or [""])[0] if matcher.is_error() else ""
    return first if "max is" in first or "limit" in first.lower() else ""


class GrammarMatchers:
    """The core's side: matchers built off the loop thread, masks filled for a step's rows at once."""

    def __init__(self, tokenizer_file: Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        self.vocab_size = vocab_size
        self._tokenizer_args = (tokenizer_file, vocab_size, eos_token_ids)
        self._tokenizer: Any = None  # built by the builder thread, on the first constrained request
        self._executor: Any = None
        # One builder thread: a large schema takes llguidance up to a second to build, which must not stall the
        # step loop; the request's prefill runs meanwhile and the matcher is waited for at its first sample.
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")

    def start(self, grammar: str) -> "Future[llguidance.LLMatcher]":
        def build() -> "llguidance.LLMatcher":
            from llguidance import LLMatcher

            if self._tokenizer is None:  # only the one builder thread gets here: no lock needed
                self._tokenizer = load_ll_tokenizer(*self._tokenizer_args)
            matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
            if matcher.is_error():
                raise InvalidRequestError(f"the structured-output grammar could not be built: {matcher.get_error()}")
            return matcher

        return self._builder.submit(build)

    def allowed(self, matchers: list["llguidance.LLMatcher"]) -> "torch.Tensor":
        """``[len(matchers), vocab]`` bool: the tokens each matcher allows next."""
        import torch
        from llguidance import LLExecutor

        if self._executor is None:
            self._executor = LLExecutor()
        words = (self.vocab_size + 31) // 32
        bits = torch.zeros((len(matchers), words), dtype=torch.int32)
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bits.data_ptr(),
                                               words * 4, len(matchers))
        # token t is bit t % 32 of word t // 32: in little-endian bytes, bit t % 8 of byte t // 8
        shifts = torch.arange(8, dtype=torch.uint8)
        flags = (bits.view(torch.uint8).unsqueeze(-1) >> shifts) & 1
        return flags.view(len(matchers), -1)[:, : self.vocab_size].bool()
