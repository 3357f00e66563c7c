"""`edge-infer bench reliability MODEL --out DIR`: the engine's fault behaviours, each a recorded outcome.

Writes DIR/report.json (atomically, after every outcome): per behaviour its
status (passed, failed, error, skipped), timings and evidence, and the
processes the harness had to kill after `close()` — a finding, not a pass.
Only processes the engine itself started are ever signalled: the worker is
checked to be this process's child, created after the engine started.

Exit status: 0 every outcome passed and nothing needed cleaning up; 1
otherwise (also when the plan was refused: status `rejected`); 2 bad input.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from edge_infer.bench.harness.arm_output import stamp
from edge_infer.bench.harness.provenance import now_utc
from edge_infer.bench.measures.reliability_checks import CheckSettings, Scenario
from edge_infer.bench.measures.reliability_report import ReliabilityReport


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, help="checkpoint directory (default: the embedded demo model)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="new (or empty) directory for report.json")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16 or float32")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length (default: min(4096, the model's))")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens of the baseline request (default 128)")
    parser.add_argument("--max-chunks", type=int, default=4, help="stream buffer bound of the saturation check (default 4)")
    parser.add_argument("--kill-timeout", type=float, default=5.0, metavar="S",
                        help="seconds within which a killed worker must surface as an error event (default 5)")


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        print(f"edge-infer bench reliability: {args.out} exists and is not an empty directory; pass a new --out", file=sys.stderr)
        return 2
    from edge_infer import plan_text_session
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.models.config import ModelConfig

    started_at = now_utc()
    try:
        model_dir = resolve_model(args.model)
        vocab = ModelConfig.from_dir(model_dir).vocab_size
        plan_kwargs = dict(
            model=model_dir, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        )
        plan = plan_text_session(**plan_kwargs)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"edge-infer bench reliability: {exc}", file=sys.stderr)
        return 2
    checks = CheckSettings(max_tokens=args.max_tokens, max_chunks=args.max_chunks, kill_error_timeout_s=args.kill_timeout)
    max_len = plan.settings["max_model_len"]
    if checks.prompt_tokens + checks.max_tokens > max_len:
        print(f"edge-infer bench reliability: a {checks.prompt_tokens}-token prompt + --max-tokens {checks.max_tokens} "
              f"exceeds max_model_len {max_len}; lower --max-tokens", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    report = ReliabilityReport(
        path=args.out / "report.json", model=model_dir, started_at=started_at,
        settings={**{k: v for k, v in plan_kwargs.items() if k != "model"}, **vars(checks), "plan": plan.to_dict()},
    )
    report.save()
    if not plan.admitted:
        report.status = "rejected"
        report.notes.append("the memory plan was refused: " + "; ".join(plan.reasons))
    else:
        from edge_infer.bench.harness.llama_bench import prompt_ids

        has_tokenizer = (Path(model_dir) / "tokenizer.json").is_file()
        scenario = Scenario(report, plan_kwargs, plan, has_tokenizer, checks)
        scenario.prompt = prompt_ids(checks.prompt_tokens, vocab, 0, 0, "reliability")
        try:
            asyncio.run(scenario.run())
            report.status = "completed"
        except Exception as exc:  # a harness failure, not an engine outcome: keep what was recorded
            report.status = "failed"
            report.notes.append(f"the run stopped: {type(exc).__name__}: {exc}")
    report.finished_at = now_utc()
    report.provenance = stamp(started_at)
    report.save()
    summary = report.to_dict()
    print(json.dumps({k: summary[k] for k in ("status", "passed", "counts")}
                     | {"failed": [o.name for o in report.outcomes if o.status != "passed"],
                        "owned_processes_requiring_harness_cleanup": len(report.owned_processes_requiring_harness_cleanup),
                        "report": str(report.path)}))
    return 0 if report.passed else 1
