"""`edge-infer bench pp-tg MODEL`: prefill and decode rates of edge-infer, llama-bench style.

One sequence at a time (`max_num_seqs=1`), the whole prompt in one step
(`max_num_batched_tokens` = `--pp` unless given), greedy, end-of-sequence
ignored, prompts given as token ids so no detokenization runs (as in
`llama-bench`). The prefix cache is off, so nothing is reused between
repetitions (their prompts differ anyway). Prints one JSON line with
`pp_tps` and `tg_tps` (`edge-infer bench llamacpp pp-tg` prints the same
keys), what was actually loaded, and provenance.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.harness import bandwidth, llama_bench
from edge_infer.bench.harness.arm_output import mib, run_arm
from edge_infer.bench.harness.provenance import now_utc
from edge_infer.engine.cli_args import add_engine_args, engine_settings


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    llama_bench.add_pp_tg_args(parser)
    parser.add_argument("--tag", default=None, help="label stored with the result")
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the result JSON here")


def engine_kwargs(args: argparse.Namespace, s: llama_bench.PpTgSettings) -> dict[str, Any]:
    settings = engine_settings(args)
    if settings["max_num_seqs"] not in (None, 1):
        raise ValueError("pp-tg measures one sequence at a time (llama-bench semantics); drop --max-num-seqs")
    settings["max_num_seqs"] = 1
    settings["max_num_batched_tokens"] = settings["max_num_batched_tokens"] or s.pp
    settings["max_model_len"] = settings["max_model_len"] or s.context_tokens
    settings["prefix_caching"] = False
    return settings


def measure(model: str | None, settings: dict[str, Any], s: llama_bench.PpTgSettings, worker: str) -> dict[str, Any]:
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.engine.llm import LLM
    from edge_infer.engine.sampling_params import SamplingParams
    from edge_infer.memory.measure import tree_rss_anon_bytes, tree_rss_file_bytes
    from edge_infer.models.config import ModelConfig

    model_dir = resolve_model(model)
    vocab = ModelConfig.from_dir(model_dir).vocab_size
    t0 = time.perf_counter()
    llm = LLM(model_dir, worker=worker, skip_tokenizer_init=True, **settings)
    init_s = time.perf_counter() - t0
    try:
        def generate(ids: list[int], n: int) -> llama_bench.Timed:
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            start = time.perf_counter()
            out = llm.generate({"prompt_token_ids": ids}, params)[0]
            elapsed = time.perf_counter() - start
            got = len(out.outputs[0].token_ids)
            if out.error or got != n:
                raise RuntimeError(f"a generation asked for {n} tokens produced {got} ({out.error or out.outputs[0].finish_reason})")
            return llama_bench.Timed(elapsed, out.metrics.finished_time - out.metrics.first_token_time)

        reps = llama_bench.measure(generate, vocab, s)
        anon, file_backed = tree_rss_anon_bytes(), tree_rss_file_bytes()
        ready, plan = llm.ready, llm.plan
    finally:
        llm.close()
    rates = llama_bench.rates(reps, s)
    return {
        **rates,
        **bandwidth.read_rates(rates["tg_tps"], ready.decode_read_bytes, ready.num_threads),
        "init_s": round(init_s, 3),
        "rss_anon_mb": mib(anon),
        "rss_file_mb": mib(file_backed),
        "engine": "edge-infer",
        "model": model_dir,
        "loaded": {
            "dtype": ready.dtype,
            "quantization": plan.settings["quantization"],
            "weight_bytes": ready.weight_bytes,
            "decode_read_bytes": ready.decode_read_bytes,
            "weight_kernels": ready.weight_kernels,
            "linear_kernels": ready.linear_kernels,
            "kv_cache_bytes": ready.kv_cache_bytes,
            "num_threads": ready.num_threads,
            "worker_pid": ready.pid,
        },
        "settings": {
            **plan.settings,
            "pp": s.pp, "tg": s.tg, "depth": s.depth, "reps": s.reps, "seed": s.seed,
            "worker": worker, "detokenize": False,
        },
    }


def run(args: argparse.Namespace) -> int:
    started_at = now_utc()
    try:
        s = llama_bench.settings_from(args)
        settings = engine_kwargs(args, s)
    except ValueError as exc:
        print(f"edge-infer bench pp-tg: {exc}", file=sys.stderr)
        return 2
    return run_arm("pp-tg", lambda: measure(args.model, settings, s, args.worker), args.tag, started_at, args.out)
