"""`edge-infer bench media MODEL`: a multimodal thinker's time to first token and decode rate after an image, a clip, both.

The engine runs as users run it: `LLM` with its core in a worker process, the prefix cache off (every request is
computed whole), one sequence at a time. Each request goes through `LLM.chat` with OpenAI content parts (a data: URL
PNG, a base64 WAV): the frontend decodes and featurizes the media, the core encodes them in its towers (on
`--encoder-threads`, timed per request and reported on the request's deltas) and runs the prompt. The workload,
warm-up and arithmetic are `harness/media_bench.py`'s, shared with `bench transformers media`, so the two print
the same keys. Memory is RssAnon summed over the process tree (this process and the engine worker), sampled; the
plan's figures sit beside it. What ran (dtype, each linear kind's kernel, encoder threads) is read from the
engine's ReadyInfo and checked against the plan; a mismatch fails the arm.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.harness import media_bench
from edge_infer.bench.harness.arm_output import mib, run_arm
from edge_infer.bench.harness.clock import process_age_s
from edge_infer.bench.harness.provenance import now_utc
from edge_infer.engine.cli_args import add_engine_args, engine_settings
from edge_infer.memory.measure import PeakSampler, tree_rss_file_bytes


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    media_bench.add_media_args(parser)
    parser.add_argument("--tag", default=None, help="label stored with the result")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the result JSON here")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    settings = engine_settings(args)
    if settings["max_num_seqs"] not in (None, 1):
        raise ValueError("bench media measures one request at a time; drop --max-num-seqs")
    settings["max_num_seqs"] = 1
    settings["prefix_caching"] = False
    return settings


def verify_loaded(plan: Any, ready: Any) -> list[str]:
    """Where what the engine loaded differs from its plan: the dtype, and each linear kind's kernel (ISA variant
    included), the towers' among them. Empty: the settings reached the code path."""
    problems = []
    if ready.dtype != plan.settings["dtype"]:
        problems.append(f"dtype: plan {plan.settings['dtype']}, engine loaded {ready.dtype}")
    if "encoder linears" not in ready.linear_kernels:
        problems.append("the engine loaded no media encoders (is this a multimodal thinker?)")
    for choice in plan.kernels.choices if plan.kernels is not None else []:
        loaded = ready.linear_kernels.get(choice.kind)
        if loaded != choice.label:
            problems.append(f"{choice.kind}: plan {choice.label}, engine loaded {loaded}")
    return problems


def measure(args: argparse.Namespace, settings: dict[str, Any], s: media_bench.MediaBenchSettings) -> dict[str, Any]:
    sampler = PeakSampler(interval_s=s.sample_interval).start()
    try:
        from edge_infer.engine.frontend import resolve_model
        from edge_infer.engine.llm import LLM
        from edge_infer.engine.sampling_params import SamplingParams
        from edge_infer.hardware.cpu import detect

        model_dir = resolve_model(args.model)
        t0 = time.perf_counter()
        llm = LLM(model_dir, worker=args.worker, **settings)
        init_s, ready_s = time.perf_counter() - t0, process_age_s()
        sampler.mark("after_load")
        try:
            def chat(req: media_bench.MediaRequest) -> media_bench.Sample:
                params = SamplingParams(max_tokens=req.tg, temperature=0.0, ignore_eos=True)
                submitted = time.time()  # RequestMetrics are wall-clock stamps
                out = llm.chat(req.messages(), params)[0]
                if out.error:
                    raise RuntimeError(f"the {req.kind} request failed: {out.error}")
                m = out.metrics
                return media_bench.Sample(
                    prepare_s=m.arrival_time - submitted, encode_s=m.encode_time, ttft_s=m.first_token_time - submitted,
                    last_token_s=m.finished_time - submitted, tokens=len(out.outputs[0].token_ids),
                    prompt_token_ids=list(out.prompt_token_ids))

            metrics, requests = media_bench.measure(chat, s)
            file_backed = tree_rss_file_bytes()
            ready, plan, engine = llm.ready, llm.plan, llm.frontend.engine_config
        finally:
            llm.close()
    finally:
        sampler.stop()
    figures = {
        **media_bench.run_figures(metrics, requests, sampler, init_s, ready_s, file_backed),
        "plan_steady_mb": mib(plan.steady_bytes),
        "plan_peak_mb": mib(plan.peak_bytes),
    }
    return {
        **figures,
        "engine": "edge-infer",
        "model": model_dir,
        "requests": requests,
        "plan_vs_measured": plan_vs_measured(plan, figures, s.kinds),
        "loaded": {
            "dtype": ready.dtype,
            "native_bf16": detect().native_bf16,
            "quantization": plan.settings["quantization"],
            "encoder_quantization": plan.settings.get("encoder_quantization"),
            "linear_kernels": ready.linear_kernels,
            "weight_kernels": ready.weight_kernels,
            "weight_bytes": ready.weight_bytes,
            "encoder_weight_bytes": ready.encoder_weight_bytes,
            "kv_cache_bytes": ready.kv_cache_bytes,
            "num_threads": ready.num_threads,
            "encoder_threads": engine.encoder_threads or ready.num_threads,
            "worker_pid": ready.pid,
        },
        "settings_mismatches": verify_loaded(plan, ready),
        "settings": {**plan.settings, "worker": args.worker, "media": media_bench.describe(s)},
        "plan": plan.to_dict(),
        "notes": [
            f"peaks are sampled every {s.sample_interval:g} s and are lower bounds; memory is RssAnon summed over the "
            "process tree (this process and the engine worker); *_mb figures are MiB",
            "ttft_ms runs from the LLM.chat call: media decoded and featurized (prepare_ms), encoded (encode_ms, the "
            "engine's own timing), the prompt computed, the first token sampled",
        ],
    }


def plan_vs_measured(plan: Any, figures: dict[str, float], kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """The sampled peaks beside the plan's: the whole run (loading included) against its peak, each request
    against its steady state (what serving holds: weights, KV, activations and what else the plan books)."""
    rows = [("whole run, loading included", plan.peak_bytes, "peak_rss_anon_mb")]
    rows += [(f"{kind} request", plan.steady_bytes, f"{kind}_peak_rss_anon_mb") for kind in kinds]
    return [{"figure": what, "plan_mb": mib(planned), "measured": key, "measured_mb": figures[key],
             "measured_over_plan": round(figures[key] / mib(planned), 4) if planned else None}
            for what, planned, key in rows]


def run(args: argparse.Namespace) -> int:
    started_at = now_utc()
    try:
        s = media_bench.settings_from(args)
        settings = engine_kwargs(args)
    except ValueError as exc:
        print(f"edge-infer bench media: {exc}", file=sys.stderr)
        return 2
    return run_arm("media", lambda: measure(args, settings, s), args.tag, started_at, args.out)
