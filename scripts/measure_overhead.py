"""Measure the per-process runtime overhead the memory planner adds to every plan.

Writes src/edge_infer/memory/overhead.json: RssAnon of
  - a library frontend (edge_infer's LLM/LocalTextEngine imports, a tokenizer loaded),
  - a server frontend (the same plus FastAPI, uvicorn, prometheus),
  - an engine worker (interpreter + torch + engine modules, thread pool started, no weights),
the tokenizer's resident bytes per byte of tokenizer.json, and the
activation calibration: the RssAnon a prefill step adds, measured at two
chunk sizes on the demo model and fitted as (factor x the shape-derived
bytes per token) x tokens + fixed bytes, after the mask and logits. Each
figure is the median of several fresh processes. Run on the machine class
the plan is for; the file records where it was measured.

    python scripts/measure_overhead.py
"""
from __future__ import annotations

import json
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
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


ACTIVATION_PROBE = """
import sys
from edge_infer.engine.config import EngineConfig
from edge_infer.engine.core import EngineCore
from edge_infer.engine.protocol import EngineRequest
from edge_infer.engine.sampling_params import SamplingParams
from edge_infer.memory.measure import PeakSampler, malloc_trim, rss_anon_bytes
model, tokens, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
core = EngineCore(EngineConfig(model=model, dtype="bfloat16", max_model_len=ctx, max_num_seqs=1,
                               max_num_batched_tokens=tokens, kv_cache_memory_bytes=64 << 20))
malloc_trim()
base = rss_anon_bytes()
sampler = PeakSampler(interval_s=0.002).start()
core.add_request(EngineRequest("probe", [5] * (ctx - 2), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)))
while core.has_work():
    core.step()
sampler.stop()
print(sampler.peak_bytes - base)
"""
ACTIVATION_POINTS = (128, 512)
ACTIVATION_CONTEXT = 1024


def _step_transients(model_dir: str) -> tuple[float, float, int]:
    """(bytes per token, fixed bytes, shape bytes per token) of one model's prefill steps."""
    from edge_infer.memory import plan
    from edge_infer.models.config import ModelConfig

    cfg = ModelConfig.from_dir(model_dir)
    measured = {}
    for tokens in ACTIVATION_POINTS:
        runs = []
        for _ in range(REPEATS):
            out = subprocess.run([sys.executable, "-c", ACTIVATION_PROBE, model_dir, str(tokens), str(ACTIVATION_CONTEXT)],
                                 capture_output=True, text=True, check=True)
            runs.append(int(out.stdout.split()[-1]))
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        known = tokens * ACTIVATION_CONTEXT * group + 4 * cfg.vocab_size * 5  # mask and logits
        measured[tokens] = statistics.median(runs) - known
    lo, hi = ACTIVATION_POINTS
    per_token = (measured[hi] - measured[lo]) / (hi - lo)
    return per_token, measured[lo] - per_token * lo, plan.activation_tensor_bytes(cfg, 2)


def activation_calibration(model_dirs: list[str]) -> dict[str, float]:
    """The largest measured/shape ratio over the probe models: a plan errs on the side of refusing."""
    fits = [_step_transients(d) for d in model_dirs]
    return {
        "activation_per_token_factor": round(max(per_token / shape for per_token, _, shape in fits), 3),
        "activation_fixed_bytes": int(max(0, max(fixed for _, fixed, _ in fits))),
    }


def probe(kind: str, tokenizer_dir: str = "-") -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, kind, tokenizer_dir], capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def median(kind: str, tokenizer_dir: str = "-") -> list[int]:
    runs = [probe(kind, tokenizer_dir) for _ in range(REPEATS)]
    return [int(statistics.median(col)) for col in zip(*runs)]


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from edge_infer.engine.frontend import demo_model_dir

    from edge_infer.models.synth import write_checkpoint

    tok_dir = str(demo_model_dir())
    real_shape = str(write_checkpoint(Path(tempfile.mkdtemp()) / "qwen2.5-0.5b", "qwen2", "qwen2.5-0.5b"))
    json_bytes = (demo_model_dir() / "tokenizer.json").stat().st_size
    worker = median("worker")[0]
    lib_base, lib_tok = median("library", tok_dir)
    server_base, server_tok = median("server", tok_dir)
    result = {
        "frontend_bytes": lib_base,
        "server_frontend_bytes": server_base,
        "worker_bytes": worker,
        "tokenizer_bytes_per_json_byte": round(max(0, lib_tok - lib_base) / json_bytes, 3),
        **activation_calibration([str(demo_model_dir()), real_shape]),
        "provenance": {
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "method": f"median RssAnon of {REPEATS} fresh processes per kind (scripts/measure_overhead.py)",
            "tokenizer_probe": f"demo model tokenizer.json, {json_bytes} bytes",
            "activation_probe": (
                f"demo model and a synthetic qwen2.5-0.5b shape, bf16, prefill chunks of {ACTIVATION_POINTS} tokens "
                f"at a {ACTIVATION_CONTEXT}-token context; the larger per-token factor and fixed part"
            ),
        },
    }
    shutil.rmtree(Path(real_shape).parent)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
