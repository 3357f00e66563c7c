"""`edge-infer bench init-memory MODEL --out F`: start-up time and memory (benchmarks/README.md says how).

- Times: `ready_s` runs from this process's creation (interpreter start-up
  and imports included; on the kernel's boot clock, see `harness/clock.py`), `import_s` is the engine's import here, `init_s`
  the engine construction up to ready (plan, tokenizer, worker start-up,
  weight loading, KV allocation).
- Memory: RssAnon summed over the process tree (the engine core lives in a
  worker process), polled by a thread every `--sample-interval` seconds
  with marks at each phase. A sampled peak is a lower bound.
- A filled context: a prompt plus generation that reaches `--context-len`
  tokens, so the KV cache holds what it was sized for.
- Each measured figure sits beside the plan's prediction, and the KV bytes,
  dtype and kernels the engine reports as loaded are checked against the
  plan (the settings reached the code path) — a mismatch fails the run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.harness.arm_output import mib, run_arm
from edge_infer.bench.harness.llama_bench import prompt_ids
from edge_infer.bench.harness.provenance import now_utc
from edge_infer.engine.cli_args import add_engine_args, engine_settings
from edge_infer.bench.harness.clock import process_age_s
from edge_infer.memory.measure import PeakSampler, malloc_trim, tree_rss_file_bytes

SHORT_PROMPT_TOKENS = 16


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    g = parser.add_argument_group("measurement")
    g.add_argument("--context-len", type=int, default=None, metavar="N",
                   help="tokens (prompt + generated) of the filled-context phase (default: max_model_len)")
    g.add_argument("--generate", type=int, default=8, metavar="N", help="tokens of the short generation (default 8)")
    g.add_argument("--sample-interval", type=float, default=0.02, metavar="S", help="RssAnon polling interval (default 0.02)")
    g.add_argument("--tag", default=None, help="label stored with the result")
    parser.add_argument("--out", type=Path, metavar="FILE", required=True, help="write the result JSON here")


def _generate(llm: Any, ids: list[int], n: int) -> None:
    from edge_infer.engine.sampling_params import SamplingParams

    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0]
    got = len(out.outputs[0].token_ids)
    if out.error or got != n:
        raise RuntimeError(f"generation of {n} tokens after a {len(ids)}-token prompt produced {got} ({out.error or out.outputs[0].finish_reason})")


# The weight kernel (``WeightKernel.name``) each quantization method loads.
QUANTIZED_KERNELS = {"cpu_int4": "cpu-int4", "cpu_w4a16": "cpu-w4a16", "cpu_w4a8": "cpu-w4a8", "cpu_w8a8": "cpu-w8a8"}


def verify_loaded(plan: Any, ready: Any) -> list[str]:
    """Where what the engine loaded differs from what the plan promised (empty: the settings took effect)."""
    problems = []
    if ready.kv_cache_bytes != plan.item("kv cache"):
        problems.append(f"KV cache: plan {plan.item('kv cache'):,} bytes, engine allocated {ready.kv_cache_bytes:,}")
    if ready.dtype != plan.settings["dtype"]:
        problems.append(f"dtype: plan {plan.settings['dtype']}, engine loaded {ready.dtype}")
    planned = plan.settings["quantization"]  # e.g. "cpu_w4a8 g128 sym"
    quantized_kernels = {name: n for name, n in ready.weight_kernels.items() if name in QUANTIZED_KERNELS.values()}
    if planned is not None and QUANTIZED_KERNELS[planned.split()[0]] not in quantized_kernels:
        problems.append(f"quantization {planned} planned but its kernel did not load ({ready.weight_kernels})")
    if planned is None and quantized_kernels:
        problems.append(f"no quantization planned but quantized kernels loaded ({ready.weight_kernels})")
    return problems


def plan_vs_measured(plan: Any, ready: Any, figures: dict[str, float]) -> list[dict[str, Any]]:
    # The plan's load figure covers loading the weights (the KV cache is allocated after them); the
    # start-up to ready, KV included, is covered by its peak.
    rows = [
        ("steady state at a filled context", plan.steady_bytes, "rss_anon_at_context_mb"),
        ("load-time peak (weights loading)", plan.load_peak_bytes, "peak_rss_anon_loading_weights_mb"),
        ("start-up to ready", plan.peak_bytes, "peak_rss_anon_during_load_mb"),
        ("peak", plan.peak_bytes, "peak_rss_anon_mb"),
    ]
    out = []
    for what, predicted, measured_key in rows:
        measured = figures[measured_key]
        out.append({
            "figure": what, "plan_mb": mib(predicted), "measured": measured_key, "measured_mb": measured,
            "measured_over_plan": round(measured / mib(predicted), 4) if predicted else None,
        })
    for what, predicted, loaded in (("kv cache", plan.item("kv cache"), ready.kv_cache_bytes),
                                     ("weights", plan.weight_bytes, ready.weight_bytes),
                                     ("rope tables", plan.item("rope tables"), ready.rope_bytes)):
        out.append({"figure": what, "plan_mb": mib(predicted), "measured": "engine report", "measured_mb": mib(loaded),
                    "measured_over_plan": round(loaded / predicted, 4) if predicted else None})
    return out


def measure(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    sampler = PeakSampler(interval_s=args.sample_interval).start()
    try:
        sampler.mark("before_import")
        t0 = time.perf_counter()
        from edge_infer.engine.frontend import resolve_model
        from edge_infer.engine.llm import LLM

        import_s = time.perf_counter() - t0
        sampler.mark("after_import")

        model_dir = resolve_model(args.model)
        has_tokenizer = (Path(model_dir) / "tokenizer.json").is_file()
        weights_peak: list[int] = []

        def weights_loaded(done: int, total: int) -> None:
            if done == total and not weights_peak:  # the window the plan's load figure describes ends here
                sampler.mark("weights_loaded")
                weights_peak.append(sampler.peak_bytes)

        t1 = time.perf_counter()
        llm = LLM(model_dir, worker=args.worker, skip_tokenizer_init=not has_tokenizer, load_progress=weights_loaded,
                  **settings)
        init_s, ready_s = time.perf_counter() - t1, process_age_s()
        sampler.mark("after_load")
        load_peak = sampler.peak_bytes
        trimmed_here = malloc_trim()
        sampler.mark("after_trim")
        try:
            from edge_infer.models.config import ModelConfig

            vocab = ModelConfig.from_dir(model_dir).vocab_size
            max_len = llm.plan.settings["max_model_len"]
            context_len = args.context_len or max_len
            if not args.generate < context_len <= max_len:
                raise ValueError(
                    f"--context-len {context_len} must exceed --generate ({args.generate}) and fit max_model_len ({max_len})"
                )
            _generate(llm, prompt_ids(SHORT_PROMPT_TOKENS, vocab, 0, 0, "short"), args.generate)
            sampler.mark("after_generate")
            _generate(llm, prompt_ids(context_len - args.generate, vocab, 0, 0, "context"), args.generate)
            sampler.mark("at_context")
            file_at_context = tree_rss_file_bytes()
            ready, plan = llm.ready, llm.plan
        finally:
            llm.close()
    finally:
        sampler.stop()

    marks = {m.phase: m for m in sampler.marks}
    figures = {
        "ready_s": round(ready_s, 3),
        "import_s": round(import_s, 3),
        "init_s": round(init_s, 3),
        "worker_load_s": round(ready.load_s, 3),
        "rss_anon_tree_mb": mib(marks["after_trim"].rss_anon_bytes),
        "rss_anon_after_generate_mb": mib(marks["after_generate"].rss_anon_bytes),
        "rss_anon_at_context_mb": mib(marks["at_context"].rss_anon_bytes),
        "peak_rss_anon_loading_weights_mb": mib(weights_peak[0]),
        "peak_rss_anon_during_load_mb": mib(load_peak),
        "peak_rss_anon_mb": mib(sampler.peak_bytes),
        "rss_file_at_context_mb": mib(file_at_context),
        "plan_steady_mb": mib(plan.steady_bytes),
        "plan_load_peak_mb": mib(plan.load_peak_bytes),
        "plan_peak_mb": mib(plan.peak_bytes),
    }
    return {
        **figures,
        "model": model_dir,
        "filled_context": {"tokens": context_len, "prompt_tokens": context_len - args.generate, "generated_tokens": args.generate},
        "plan_vs_measured": plan_vs_measured(plan, ready, figures),
        "phase_marks": [
            {"phase": m.phase, "t_s": m.t_s, "rss_anon_mb": mib(m.rss_anon_bytes), "peak_so_far_mb": mib(m.peak_so_far_bytes)}
            for m in sampler.marks
        ],
        "process_tree": {"n_procs_max": sampler.max_procs, "worker": args.worker, "worker_pid": ready.pid},
        "loaded": {
            "dtype": ready.dtype,
            "quantization": plan.settings["quantization"],
            "kv_cache_bytes": ready.kv_cache_bytes,
            "kv_blocks": ready.kv_blocks,
            "weight_bytes": ready.weight_bytes,
            "weight_kernels": ready.weight_kernels,
            "linear_kernels": ready.linear_kernels,
            "rope_bytes": ready.rope_bytes,
            "num_threads": ready.num_threads,
            "tokenizer_loaded": has_tokenizer,
            "trimmed_bytes_worker": ready.trimmed_bytes,
            "trimmed_bytes_frontend": trimmed_here,
        },
        "settings_mismatches": verify_loaded(plan, ready),
        "plan": plan.to_dict(),
        "notes": [
            f"peaks are sampled every {args.sample_interval:g} s and are lower bounds; memory is RssAnon summed over the process tree",
            "*_mb figures are MiB; rss_file_at_context_mb (page cache of mapped files and libraries) is not part of the budget figures",
        ],
    }


def run(args: argparse.Namespace) -> int:
    started_at = now_utc()
    if args.generate < 1 or args.sample_interval <= 0:
        print("edge-infer bench init-memory: --generate must be at least 1 and --sample-interval positive", file=sys.stderr)
        return 2
    return run_arm("init-memory", lambda: measure(args, engine_settings(args)), args.tag, started_at, args.out)
