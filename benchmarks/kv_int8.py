"""The int8 KV cache against the 16-bit one at long contexts: resident bytes and decode speed
(docs/memory.md, "KV cache dtype").

    python benchmarks/kv_int8.py MODEL --out benchmarks/results/kv-int8-qwen2.5-0.5b.json \
        [--contexts 4096 16384] [--tokens 64] [--dtype bfloat16]

For each context length C and each KV dtype (auto: the compute dtype; int8)
an engine is planned for exactly one sequence of C + ``--tokens`` tokens (its
KV budget: that sequence's blocks), a prompt of C random token ids is
prefilled and ``--tokens`` tokens are decoded greedily. Reported: the KV
cache's bytes (planned and allocated), the engine's RssAnon (frontend and
worker) against the plan's steady state, prefill and decode tokens/s.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from edge_infer import LLM, SamplingParams
    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc
    from edge_infer.memory.measure import tree_rss_anon_bytes
    from edge_infer.models.config import ModelConfig
    from edge_infer.models.layers.kv_cache import KVLayout

    started = now_utc()
    cfg = ModelConfig.from_dir(args.model)
    rows = []
    for context in args.contexts:
        ids = [random.Random(context).randrange(1000) for _ in range(context)]
        for kv in ("auto", "int8"):
            length = context + args.tokens
            layout = KVLayout.for_model(cfg, 2, 16, int8=kv == "int8")
            budget = -(-length // 16) * layout.bytes_per_block
            with LLM(str(args.model), dtype=args.dtype, kv_cache_dtype=kv, max_model_len=length, max_num_seqs=1,
                     max_num_batched_tokens=512, kv_cache_memory_bytes=budget, prefix_caching=False) as llm:
                out = llm.generate({"prompt_token_ids": ids},
                                   SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True))[0]
                resident = tree_rss_anon_bytes()
                m, n = out.metrics, len(out.outputs[0].token_ids)
                rows.append({
                    "context": context, "kv_cache_dtype": kv,
                    "kv_cache_bytes_planned": next(i.bytes for i in llm.plan.items if i.name == "kv cache"),
                    "kv_cache_bytes_allocated": llm.ready.kv_cache_bytes,
                    "rss_anon_bytes": resident, "plan_steady_bytes": llm.plan.steady_bytes,
                    "prefill_tps": round(context / (m.first_token_time - m.arrival_time), 2),
                    "decode_tps": round((n - 1) / (m.finished_time - m.first_token_time), 2),
                })
            print(json.dumps(rows[-1]), flush=True)
    result = {"kind": "edge-infer.kv-int8", "model": str(args.model),
              "settings": {"dtype": args.dtype, "tokens": args.tokens, "contexts": args.contexts}, "rows": rows,
              "provenance": stamp(started)}
    write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
