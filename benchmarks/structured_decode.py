"""Decode speed with structured output against without it (docs/serving.md, "Structured output").

    python benchmarks/structured_decode.py MODEL --out benchmarks/results/structured-decode-qwen2.5-0.5b.json \
        [--tokenizer DIR] [--tokens 128] [--repeats 3] [--dtype bfloat16]

The mask's cost grows with the vocabulary, so ``--tokenizer`` swaps in a
Qwen2.5-sized tokenizer (benchmarks/grammar_masks.py trains one) on a copy
of MODEL whose weights are links to the original. Each arm decodes
``--tokens`` tokens from the same short prompt, one request at a time:
unconstrained (ignore_eos), a JSON schema, free JSON (an object of any shape) and a regex, each
grammar too long to complete within the tokens (so every arm decodes the
same count). Reported: decode tokens/s (first token to last) per arm, the
median of ``--repeats`` with its spread, and the cost per token against the
unconstrained arm. Arms alternate within each repeat.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LONG_LIST = {"type": "object", "properties": {"notes": {"type": "array", "minItems": 500, "items": {
    "type": "object", "properties": {"id": {"type": "integer"}, "text": {"type": "string", "maxLength": 30}},
    "required": ["id", "text"], "additionalProperties": False}}}, "required": ["notes"]}


FREE_THEN_LONG = {"type": "object", "properties": {"data": {"type": "object"}, "end": {"type": "string", "minLength": 4000}},
                  "required": ["data", "end"]}


def with_tokenizer(model: Path, tokenizer: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        target = out / f.name
        if not target.exists() and not f.name.startswith("tokenizer"):
            target.symlink_to(f.resolve())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out / name)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from edge_infer import LLM, SamplingParams, StructuredOutputsParams
    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc

    started = now_utc()
    model = args.model
    if args.tokenizer:
        model = with_tokenizer(args.model, args.tokenizer, REPO / "benchmarks" / "models" / f"{args.model.name}-{args.tokenizer.name}")
    arms = {
        "unconstrained": None,
        "json-schema": StructuredOutputsParams(json=LONG_LIST),
        # any object can close at once ("{}"): free JSON, then a string long enough to last
        "json-free-object": StructuredOutputsParams(json=FREE_THEN_LONG),
        "regex": StructuredOutputsParams(regex=r"(?:[a-z]{2,8} ){400,}"),
    }
    settings = dict(dtype=args.dtype, max_model_len=1024, max_num_seqs=1, prefix_caching=False)
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    with LLM(str(model), **settings) as llm:
        prompt = "Write the notes as JSON:"
        for arm, spec in arms.items():  # warm-up: kernels, the grammar tokenizer
            llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, structured_outputs=spec))
        for rep in range(args.repeats):
            order = list(arms) if rep % 2 == 0 else list(reversed(arms))
            for arm in order:
                params = SamplingParams(temperature=1.0, seed=rep, max_tokens=args.tokens, ignore_eos=True,
                                        structured_outputs=arms[arm])
                out = llm.generate(prompt, params)[0]
                n = len(out.outputs[0].token_ids)
                assert n == args.tokens, f"{arm}: {n} tokens ({out.outputs[0].finish_reason})"
                m = out.metrics
                rates[arm].append((n - 1) / (m.finished_time - m.first_token_time))
    summary = {}
    base = statistics.median(rates["unconstrained"])
    for arm, values in rates.items():
        med = statistics.median(values)
        summary[arm] = {"decode_tps": round(med, 2), "spread_pct": round((max(values) - min(values)) / med * 100, 1),
                        "values": [round(v, 2) for v in values],
                        "cost_per_token_ms": round((1 / med - 1 / base) * 1e3, 3), "ratio": round(med / base, 3)}
    result = {"kind": "edge-infer.structured-decode", "model": str(args.model),
              "tokenizer": str(args.tokenizer) if args.tokenizer else None,
              "settings": {**settings, "tokens": args.tokens, "repeats": args.repeats}, "summary": summary,
              "provenance": stamp(started)}
    write_json_atomic(args.out, result)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
