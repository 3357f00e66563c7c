"""What one decode token's attention costs as the context grows (docs/performance.md, "Decode at long contexts").

    python benchmarks/attention_decode.py --out benchmarks/results/attention-decode-qwen2.5-0.5b.json \
        [--contexts 512 4096 16384] [--threads 2]

The 16-bit path's decode attention (models/layers/attention.py) for one
layer of the Qwen2.5-0.5B shape (2 KV heads of 64, 7 query heads a group):
PyTorch's scaled_dot_product_attention of one query against the cache's K
and V, read as the strided views the paged cache gives. Reported per context
and dtype: milliseconds per layer (median of 5 runs of 20), the same for 24
layers, and the bytes of K and V read per layer over that time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KV_HEADS, GROUP, HEAD_DIM, LAYERS = 2, 7, 64, 24


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 16384])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    import torch
    import torch.nn.functional as F

    from edge_infer.bench.harness.arm_output import stamp, write_json_atomic
    from edge_infer.bench.harness.provenance import now_utc

    started = now_utc()
    torch.set_num_threads(args.threads)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for ctx in args.contexts:
            # the cache's layout: [slots, kv_heads, head_dim]; attention reads it as [kv_heads, slots, head_dim]
            k = torch.randn(ctx, KV_HEADS, HEAD_DIM).to(dtype).transpose(0, 1).unsqueeze(0)
            v = torch.randn(ctx, KV_HEADS, HEAD_DIM).to(dtype).transpose(0, 1).unsqueeze(0)
            q = torch.randn(1, KV_HEADS, GROUP, HEAD_DIM).to(dtype)
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, scale=HEAD_DIM**-0.5)
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(20):
                    F.scaled_dot_product_attention(q, k, v, scale=HEAD_DIM**-0.5)
                runs.append((time.perf_counter() - t0) / 20)
            per_layer = statistics.median(runs)
            read = 2 * ctx * KV_HEADS * HEAD_DIM * dtype.itemsize
            rows.append({"dtype": str(dtype).removeprefix("torch."), "context": ctx,
                         "ms_per_layer": round(per_layer * 1e3, 3), "ms_per_token_24_layers": round(per_layer * LAYERS * 1e3, 1),
                         "kv_read_gb_per_s": round(read / per_layer / 1e9, 2),
                         "spread_pct": round((max(runs) - min(runs)) / per_layer * 100, 1)})
            print(json.dumps(rows[-1]), flush=True)
    result = {"kind": "edge-infer.attention-decode", "torch": torch.__version__, "threads": args.threads,
              "shape": {"kv_heads": KV_HEADS, "group": GROUP, "head_dim": HEAD_DIM, "layers": LAYERS},
              "rows": rows, "provenance": stamp(started)}
    write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
