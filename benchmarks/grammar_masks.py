"""What a token mask costs on the CPU: llguidance against xgrammar (docs/serving.md, "Structured output").

    python benchmarks/grammar_masks.py --out benchmarks/results/grammar-masks.json [--tokenizer DIR] [--repeats 5]

edge-infer ships llguidance; this is the measurement that chose it. xgrammar
is not a dependency: run this from a virtualenv that has both
(``pip install torch==2.13.0 llguidance xgrammar transformers``) with
``PYTHONPATH=src``.

The tokenizer is a Qwen2.5-sized one (151,643 byte-level BPE pieces plus
Qwen's special tokens), since the mask cost grows with the vocabulary: with
``--tokenizer`` a real checkpoint's, else one trained here on the Python
standard library's sources (no model hub), cached under benchmarks/models/.

For each workload (a nested JSON schema, any JSON object, a regex, one of
many choices) a document valid under it is tokenized, then each library
compiles the grammar and walks the document token by token, filling the
next-token bitmask before each token. Reported per library and workload:
the compile time (median of ``--repeats`` fresh compiles) and the fill time
per token (median, p90, max over all tokens of all repeats). One thread
each: the engine fills its masks while the model waits.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
VOCAB = 151_643

ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40}, "email": {"type": "string"},
            "tier": {"enum": ["free", "plus", "pro"]}}, "required": ["name", "email", "tier"],
            "additionalProperties": False},
        "items": {"type": "array", "maxItems": 20, "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
            "price": {"type": "number"}}, "required": ["sku", "quantity", "price"], "additionalProperties": False}},
        "gift": {"type": "boolean"},
        "note": {"type": "string"},
    },
    "required": ["order_id", "customer", "items", "gift"],
    "additionalProperties": False,
}
ORDER_DOC = {
    "order_id": "ABC-123456",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.org", "tier": "pro"},
    "items": [{"sku": f"SKU-{i:04d}", "quantity": i % 7 + 1, "price": round(3.5 * i + 0.99, 2)} for i in range(6)],
    "gift": False,
    "note": "Leave the parcel at the door, please; the bell does not work.",
}
REGEX = r"(?:[A-Z][a-z]+, ){2,6}[A-Z][a-z]+ \(\d{4}-\d{2}-\d{2}\)"
REGEX_DOC = "Paris, Berlin, Madrid, Lisbon, Vienna (2026-12-01)"
CHOICES = [f"the {c} {n} option" for c in ("red", "green", "blue", "black", "white") for n in range(40)]


def workloads() -> list[dict]:
    pretty = json.dumps(ORDER_DOC, indent=2)
    return [
        {"name": "json-schema", "kind": "json", "schema": ORDER, "doc": pretty},
        {"name": "json-object", "kind": "json", "schema": {"type": "object"}, "doc": pretty},
        {"name": "regex", "kind": "regex", "regex": REGEX, "doc": REGEX_DOC},
        {"name": "choice-200", "kind": "choice", "choices": CHOICES, "doc": CHOICES[137]},
    ]


def build_tokenizer(out: Path) -> Path:
    """A byte-level BPE with Qwen2.5's piece count, trained on local text, saved as a checkpoint-style dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if (out / "tokenizer.json").is_file():
        return out
    def texts():
        for path in sorted(glob.glob(f"{os.path.dirname(os.__file__)}/**/*.py", recursive=True)):
            try:
                yield Path(path).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):  # a few test files are deliberately in other encodings
                continue

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts(), trainer)
    tok.add_special_tokens(QWEN_SPECIALS)
    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>").save_pretrained(out)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(compile_s: list[float], fill_s: list[float], tokens: int) -> dict:
    us = [t * 1e6 for t in fill_s]
    return {"compile_ms": round(statistics.median(compile_s) * 1e3, 3), "tokens": tokens,
            "fill_us": {"median": round(statistics.median(us), 1), "p90": round(percentile(us, 0.9), 1),
                        "max": round(max(us), 1), "mean": round(statistics.fmean(us), 1)}}


def run_llguidance(tokenizer_json: str, vocab: int, eos: int, load: dict, ids: list[int], repeats: int) -> dict:
    import llguidance
    import torch

    sys.path.insert(0, str(REPO / "src"))
    from edge_infer.engine.grammar import grammar_text
    from edge_infer.engine.sampling_params import StructuredOutputsParams

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
    setup_s = time.perf_counter() - t0
    field = {"json": "schema", "regex": "regex", "choice": "choices"}[load["kind"]]
    spec = StructuredOutputsParams(**{load["kind"]: load[field]})
    grammar = grammar_text(spec)  # what edge-infer compiles (its JSON whitespace rule included)
    words = (vocab + 31) // 32
    mask = torch.zeros(words, dtype=torch.int32)
    compiles, fills = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
        matcher.unsafe_compute_mask_ptr(mask.data_ptr(), words * 4)  # the first mask is part of getting ready
        compiles.append(time.perf_counter() - t0)
        assert matcher.consume_token(ids[0]), matcher.get_error()
        for tid in ids[1:]:
            t0 = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(mask.data_ptr(), words * 4)
            fills.append(time.perf_counter() - t0)
            assert (int(mask[tid // 32]) >> (tid % 32)) & 1, f"llguidance disallowed token {tid}"
            assert matcher.consume_token(tid), matcher.get_error()
    return {"tokenizer_setup_s": round(setup_s, 3), **summary(compiles, fills, len(ids))}


def run_xgrammar(model_dir: Path, vocab: int, load: dict, ids: list[int], repeats: int) -> dict:
    import xgrammar
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(model_dir), vocab_size=vocab)
    setup_s = time.perf_counter() - t0
    mask = xgrammar.allocate_token_bitmask(1, vocab)
    compiles, fills = [], []
    for _ in range(repeats):
        compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        t0 = time.perf_counter()
        if load["kind"] == "json":
            compiled = compiler.compile_json_schema(json.dumps(load["schema"]), any_whitespace=True, max_whitespace_cnt=21)
        elif load["kind"] == "regex":
            compiled = compiler.compile_regex(load["regex"])
        else:
            compiled = compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in load["choices"]))
        matcher = xgrammar.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(mask, 0)
        compiles.append(time.perf_counter() - t0)
        assert matcher.accept_token(ids[0])
        for tid in ids[1:]:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(mask, 0)
            fills.append(time.perf_counter() - t0)
            assert (int(mask[0, tid // 32]) >> (tid % 32)) & 1, f"xgrammar disallowed token {tid}"
            assert matcher.accept_token(tid)
    return {"tokenizer_setup_s": round(setup_s, 3), **summary(compiles, fills, len(ids))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, help="a checkpoint directory with tokenizer.json (default: trained here)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc
    from transformers import AutoTokenizer

    started = now_utc()
    model_dir = args.tokenizer or build_tokenizer(REPO / "benchmarks" / "models" / "bpe-qwen-size")
    hf = AutoTokenizer.from_pretrained(model_dir)
    vocab = (len(hf) + 127) // 128 * 128  # model rows, padded as checkpoints pad them
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    tokenizer_json = (model_dir / "tokenizer.json").read_text()
    results = {}
    for load in workloads():
        ids = hf.encode(load["doc"], add_special_tokens=False)
        results[load["name"]] = {
            "llguidance": run_llguidance(tokenizer_json, vocab, eos, load, ids, args.repeats),
            "xgrammar": run_xgrammar(model_dir, vocab, load, ids, args.repeats),
        }
        print(load["name"], json.dumps(results[load["name"]]), flush=True)
    from importlib import metadata

    out = {
        "kind": "edge-infer.grammar-masks",
        "tokenizer": {"source": str(args.tokenizer) if args.tokenizer else "trained: Python stdlib sources",
                      "pieces": len(hf), "model_rows": vocab},
        "libraries": {name: metadata.version(name) for name in ("llguidance", "xgrammar")},
        "threads": 1,
        "repeats": args.repeats,
        "workloads": results,
        "provenance": stamp(started),
    }
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
