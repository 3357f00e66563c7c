"""Measure the per-process runtime overhead the memory planner adds to every plan.

Writes src/edge_infer/memory/overhead.json: RssAnon of
  - a library frontend (edge_infer's LLM/LocalTextEngine imports, a tokenizer loaded),
  - a server frontend (the same plus FastAPI, uvicorn, prometheus),
  - an engine worker (interpreter + torch + engine modules, thread pool started, no weights),
and the tokenizer's resident bytes per byte of tokenizer.json. Each figure is
the median of several fresh processes. Run on the machine class the plan is
for; the file records where it was measured.

    python scripts/measure_overhead.py
"""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "edge_infer" / "memory" / "overhead.json"
REPEATS = 5

PROBE = """
import sys
from edge_infer.memory.measure import rss_anon_bytes
kind, tok = sys.argv[1], sys.argv[2]
if kind == "worker":
    import torch
    from edge_infer.engine import core, worker  # noqa: F401
    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    torch.ones(64, 64) @ torch.ones(64, 64)  # start the intra-op thread pool
    print(rss_anon_bytes())
    raise SystemExit
from edge_infer.engine import llm, local, async_engine  # noqa: F401
import tokenizers, jinja2  # noqa: F401  (imported by every frontend; not part of the tokenizer's own bytes)
if kind == "server":
    import fastapi, uvicorn, prometheus_client  # noqa: F401
base = rss_anon_bytes()
if tok != "-":
    from edge_infer.models.tokenizer import Tokenizer
    t = Tokenizer(tok)
    t.encode("warm up the tokenizer " * 20)
print(base, rss_anon_bytes())
"""


def probe(kind: str, tokenizer_dir: str = "-") -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, kind, tokenizer_dir], capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def median(kind: str, tokenizer_dir: str = "-") -> list[int]:
    runs = [probe(kind, tokenizer_dir) for _ in range(REPEATS)]
    return [int(statistics.median(col)) for col in zip(*runs)]


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from edge_infer.engine.frontend import demo_model_dir

    tok_dir = str(demo_model_dir())
    json_bytes = (demo_model_dir() / "tokenizer.json").stat().st_size
    worker = median("worker")[0]
    lib_base, lib_tok = median("library", tok_dir)
    server_base, server_tok = median("server", tok_dir)
    result = {
        "frontend_bytes": lib_base,
        "server_frontend_bytes": server_base,
        "worker_bytes": worker,
        "tokenizer_bytes_per_json_byte": round(max(0, lib_tok - lib_base) / json_bytes, 3),
        "provenance": {
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "method": f"median RssAnon of {REPEATS} fresh processes per kind (scripts/measure_overhead.py)",
            "tokenizer_probe": f"demo model tokenizer.json, {json_bytes} bytes",
        },
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
