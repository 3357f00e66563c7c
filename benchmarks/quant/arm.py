"""One benchmark arm: load a model with given settings, measure memory and speed, print JSON.

    python benchmarks/quant/arm.py MODEL [--quantization cpu_int4 --group-size 128] [lever flags]

The engine core runs in this process (no worker), so this process's RssAnon
is the whole tree's. Reported (the last stdout line, for `edge-infer bench grid`):

- ``ready_s``: process creation to a loaded engine (imports included);
- ``load_peak_rss_anon_mb``: sampled RssAnon peak up to the end of loading
  (a lower bound: sampled every 20 ms); ``peak_rss_anon_mb`` over the run;
- ``rss_anon_mb``: steady RssAnon after loading (weights, KV cache, RoPE, ...);
- ``rss_anon_at_context_mb``: after prefill + decode of the prompt;
- ``pp_tps``: prompt tokens per second for one ``--prompt-tokens`` prompt in
  one step; ``tg_tps``: generated tokens per second for ``--gen-tokens``
  tokens after a 1-token prompt (llama-bench's pp/tg; prefix caching does not exist here);
- what actually ran: dtype, quantization, kernel counts, resident weight,
  KV and RoPE bytes, bytes malloc_trim released, and the plan's figures.

Lever flags select the measuring-only alternatives (docs/quantization.md):
``--rope-model-positions``, ``--no-trim``, ``--keep-dense-copy``,
``--repack whole``; the KV budget lever is ``--kv-cache-memory-bytes``.
"""
from __future__ import annotations

import argparse
import json
import time

MiB = 1 << 20


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantization", default=None, choices=["cpu_int4"])
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--asym", action="store_true")
    p.add_argument("--quantize-head", action="store_true")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=1)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="default: the plan's default KV budget")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--skip-speed", action="store_true", help="memory only")
    p.add_argument("--rope-model-positions", action="store_true", help="lever off: RoPE tables for the model's max positions")
    p.add_argument("--no-trim", action="store_true", help="lever off: no malloc_trim after loading")
    p.add_argument("--keep-dense-copy", action="store_true", help="lever off: keep a row-major copy beside the packed int4 weight")
    p.add_argument("--repack", default="blocked", choices=["blocked", "whole"], help="whole: lever off, repack each linear whole")
    return p.parse_args()


def main() -> None:
    from edge_infer.memory.measure import PeakSampler, process_start_time, rss_anon_bytes

    sampler = PeakSampler(interval_s=0.02).start()
    args = parse()
    import dataclasses
    import random

    import torch  # noqa: F401  (imported before the baseline mark, like any engine process)

    from edge_infer.engine.config import QuantConfig
    from edge_infer.engine.core import EngineCore
    from edge_infer.engine.protocol import EngineRequest
    from edge_infer.engine.sampling_params import SamplingParams
    from edge_infer.memory.plan import plan_text_session

    quant = None
    if args.quantization:
        quant = QuantConfig(group_size=args.group_size, symmetric=not args.asym, quantize_head=args.quantize_head,
                            repack=args.repack, keep_dense_copy=args.keep_dense_copy)
    plan = plan_text_session(
        args.model, dtype=args.dtype, quantization=quant, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(args.prompt_tokens, 64), kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        num_threads=args.num_threads,
    )
    if not plan.admitted:
        raise SystemExit("plan refused:\n" + plan.table())
    config = dataclasses.replace(plan.engine_config, rope_model_positions=args.rope_model_positions, trim_after_load=not args.no_trim)
    imported = sampler.mark("imported")
    core = EngineCore(config)
    loaded = sampler.mark("loaded")
    ready_s = time.time() - process_start_time()
    info = core.ready_info
    vocab = core.model.cfg.vocab_size
    rng = random.Random(0)

    def run(prompt_len: int, max_tokens: int) -> list[float]:
        """Wall time of each engine step of one greedy request."""
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        core.add_request(EngineRequest(f"r{rng.random()}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)))
        times = []
        while core.has_work():
            t = time.perf_counter()
            core.step()
            times.append(time.perf_counter() - t)
        return times

    metrics: dict[str, object] = {}
    if not args.skip_speed:
        run(16, 4)  # warm-up: first-call kernel set-up is not steady-state speed
        pp = run(args.prompt_tokens, 1)
        tg = run(1, args.gen_tokens + 1)[1:]  # the first step prefills the 1-token prompt
        metrics.update(pp_tps=args.prompt_tokens / pp[0], tg_tps=len(tg) / sum(tg))
    at_context = sampler.mark("ran")
    sampler.stop()
    metrics.update(
        ready_s=ready_s,
        load_s=info.load_s,
        load_peak_rss_anon_mb=loaded.peak_so_far_bytes / MiB,
        peak_rss_anon_mb=sampler.peak_bytes / MiB,
        baseline_rss_anon_mb=imported.rss_anon_bytes / MiB,
        rss_anon_mb=loaded.rss_anon_bytes / MiB,
        rss_anon_at_context_mb=at_context.rss_anon_bytes / MiB,
        rss_anon_now_mb=rss_anon_bytes() / MiB,
        weights_mb=info.weight_bytes / MiB,
        kv_cache_mb=info.kv_cache_bytes / MiB,
        rope_mb=info.rope_bytes / MiB,
        trimmed_mb=info.trimmed_bytes / MiB,
        plan_weights_mb=plan.item("weights") / MiB,
        plan_steady_mb=plan.steady_bytes / MiB,
        plan_load_peak_mb=plan.load_peak_bytes / MiB,
        dtype=info.dtype,
        quantization=plan.settings["quantization"] or "none",
        kernels=json.dumps(info.weight_kernels, sort_keys=True),
        threads=str(info.num_threads),
        levers=json.dumps({"rope_model_positions": args.rope_model_positions, "trim": not args.no_trim,
                           "keep_dense_copy": args.keep_dense_copy, "repack": args.repack,
                           "kv_cache_memory_bytes": info.kv_cache_bytes}),
    )
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
