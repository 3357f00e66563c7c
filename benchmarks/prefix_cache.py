"""What the prefix cache saves when requests share a long prefix (docs/serving.md, "Prefix caching").

    python benchmarks/prefix_cache.py MODEL --out benchmarks/results/prefix-cache-qwen2.5-0.5b.json \
        [--prefix 1536] [--tail 32] [--repeats 5] [--dtype bfloat16]

A request is a shared prefix of ``--prefix`` random token ids (a system
prompt, or the conversation so far) and a ``--tail`` of its own; it
generates one token, so its wall time is its time to first token. Two
engines are loaded once each, the prefix cache on and off. Each repeat
draws a new prefix and sends, to each engine in turn (the order alternates
between repeats), a first request (cold: nothing cached yet) and a second
with the same prefix and another tail (warm). Reported: the medians of each
(with their spread), the warm speed-up, and the tokens the cache held;
greedy first tokens must agree between the engines. Provenance as the bench
harness stamps it.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def median_and_spread(values: list[float]) -> dict[str, float]:
    med = statistics.median(values)
    return {"median": round(med, 4), "spread_pct": round((max(values) - min(values)) / med * 100, 1), "values": values}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prefix", type=int, default=1536)
    p.add_argument("--tail", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from edge_infer import LLM, SamplingParams
    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc

    started = now_utc()
    settings = dict(dtype=args.dtype, max_model_len=args.prefix + args.tail + 8, max_num_seqs=1,
                    max_num_batched_tokens=512, skip_tokenizer_init=True)
    engines = {"cache-on": LLM(args.model, prefix_caching=True, **settings),
               "cache-off": LLM(args.model, prefix_caching=False, **settings)}
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    vocab = engines["cache-on"].plan.model_config.vocab_size
    times: dict[str, dict[str, list[float]]] = {arm: {"cold": [], "warm": []} for arm in engines}
    cached: list[int] = []
    try:
        for rep in range(args.repeats + 1):  # repeat 0 warms both engines up and is not counted
            rng = random.Random(rep)
            prefix = [rng.randrange(vocab) for _ in range(args.prefix)]
            tails = [[rng.randrange(vocab) for _ in range(args.tail)] for _ in range(2)]
            order = list(engines) if rep % 2 == 0 else list(reversed(engines))
            firsts = {}
            for arm in order:
                for kind, tail in zip(("cold", "warm"), tails):
                    start = time.perf_counter()
                    out = engines[arm].generate({"prompt_token_ids": prefix + tail}, params)[0]
                    elapsed = time.perf_counter() - start
                    firsts[(arm, kind)] = out.outputs[0].token_ids
                    if rep:
                        times[arm][kind].append(round(elapsed, 4))
                        if arm == "cache-on" and kind == "warm":
                            cached.append(out.num_cached_tokens)
            if firsts[("cache-on", "warm")] != firsts[("cache-off", "warm")]:
                print(f"warning: repeat {rep}: the engines' greedy tokens differ", file=sys.stderr)
    finally:
        for llm in engines.values():
            llm.close()
    summary = {arm: {kind: median_and_spread(v) for kind, v in kinds.items()} for arm, kinds in times.items()}
    result = {
        "kind": "edge-infer.prefix-cache",
        "model": args.model,
        "settings": {**{k: v for k, v in settings.items() if k != "skip_tokenizer_init"},
                     "prefix_tokens": args.prefix, "tail_tokens": args.tail, "repeats": args.repeats},
        "summary": summary,
        "warm_speedup": round(summary["cache-off"]["warm"]["median"] / summary["cache-on"]["warm"]["median"], 2),
        "cached_tokens": cached,
    }
    result["provenance"] = stamp(started)
    write_json_atomic(args.out, result)
    print(json.dumps({k: result[k] for k in ("summary", "warm_speedup")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
