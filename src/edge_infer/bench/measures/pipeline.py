"""`edge-infer bench pipeline MODEL`: what the omni runtime costs around a text model.

Three measurements, all greedy with ``ignore_eos`` and the same prompt:

- **engine**: the text engine alone (``LocalTextEngine``, worker process);
- **stage**: the same model as the only stage of a deploy config
  (``executor: text``), through the orchestrator;
- **two stages**: the text stage feeding a vocoder stage that costs almost
  nothing (``tone_vocoder.py``), the text tokens still streamed to the caller.

For each: time to first token and decode tokens/s (tokens after the first,
over the time after the first). Start-up: seconds from construction to ready
for the engine, a one-stage and a two-stage pipeline. One JSON line, so it
works as a grid arm.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

TWO_STAGES = """
base_config: text
stages:
  - {{stage_id: 0, model: "{model}", engine: {{max_model_len: {max_len}, max_num_seqs: 1}}}}
  - {{stage_id: 1, kind: generation, executor: tone_vocoder, executor_options: {{vocab_size: {vocab}}}}}
routes:
  - {{from: 0, to: 1, contract: token_ids/1}}
final_outputs: [0, 1]
"""
ONE_STAGE = """
base_config: text
stages:
  - {{stage_id: 0, model: "{model}", engine: {{max_model_len: {max_len}, max_num_seqs: 1}}}}
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None, help="checkpoint directory (default: the demo model)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3, help="requests per arm (median reported)")
    parser.add_argument("--out", default=None, help="also write the result with provenance to this file")


def _rates(stamps: list[float], t0: float) -> tuple[float, float]:
    ttft = stamps[0] - t0
    tps = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return ttft, tps


async def _engine(model: str, prompt: list[int], args) -> tuple[float, list[tuple[float, float]]]:
    from edge_infer.engine.local import LocalTextEngine
    from edge_infer.memory.plan import plan_text_session

    t0 = time.perf_counter()
    engine = LocalTextEngine(plan_text_session(model, max_model_len=len(prompt) + args.max_tokens, max_num_seqs=1))
    await engine.start()
    startup = time.perf_counter() - t0
    out = []
    try:
        session = engine.open_session()
        for _ in range(args.reps):
            t0 = time.perf_counter()
            _, stream = await engine.submit(session, prompt, max_tokens=args.max_tokens, ignore_eos=True)
            stamps = [time.perf_counter() async for e in stream if e.kind == "token" and e.token_ids]
            out.append(_rates(stamps, t0))
    finally:
        await engine.close()
    return startup, out


async def _pipeline(config: Path, prompt: list[int], args, stages: int) -> tuple[float, list[tuple[float, float]]]:
    from edge_infer.runtime.omni import AsyncOmni

    t0 = time.perf_counter()
    omni = AsyncOmni(config)
    await omni.start()
    startup = time.perf_counter() - t0
    params = [{"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}] + [{}] * (stages - 1)
    out = []
    try:
        for _ in range(args.reps):
            t0 = time.perf_counter()
            stamps = []
            async for event in omni.generate(prompt, sampling_params_list=params):
                if event.stage_id == 0 and event.payload is not None and event.payload.contract == "token_ids/1":
                    stamps.append(time.perf_counter())
            out.append(_rates(stamps, t0))
    finally:
        await omni.shutdown()
    return startup, out


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def run(args: argparse.Namespace) -> int:
    from edge_infer.bench.measures.tone_vocoder import ToneVocoder
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.errors import EdgeInferError
    from edge_infer.models.config import ModelConfig
    from edge_infer.runtime.executors import register_executor

    if args.prompt_tokens < 1 or args.max_tokens < 2 or args.reps < 1:
        print("error: --prompt-tokens >= 1, --max-tokens >= 2 and --reps >= 1 are required", file=sys.stderr)
        return 2
    try:
        model = resolve_model(args.model)
        vocab = ModelConfig.from_dir(model).vocab_size
    except EdgeInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    register_executor("tone_vocoder", ToneVocoder)
    prompt = [(17 * i + 3) % vocab for i in range(args.prompt_tokens)]
    fmt = dict(model=model, max_len=args.prompt_tokens + args.max_tokens, vocab=vocab)
    metrics: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        one, two = Path(tmp) / "one.yaml", Path(tmp) / "two.yaml"
        one.write_text(ONE_STAGE.format(**fmt))
        two.write_text(TWO_STAGES.format(**fmt))
        arms = {
            "engine": _engine(model, prompt, args),
            "stage": _pipeline(one, prompt, args, 1),
            "two_stages": _pipeline(two, prompt, args, 2),
        }
        for name, coro in arms.items():
            startup, reps = asyncio.run(coro)
            metrics[f"{name}_startup_s"] = round(startup, 3)
            metrics[f"{name}_ttft_s"] = round(_median([r[0] for r in reps]), 4)
            metrics[f"{name}_decode_tps"] = round(_median([r[1] for r in reps]), 2)
    for name in ("stage", "two_stages"):
        metrics[f"{name}_overhead_ms_per_token"] = round(1e3 / metrics[f"{name}_decode_tps"] - 1e3 / metrics["engine_decode_tps"], 3)
    metrics["second_stage_startup_s"] = round(metrics["two_stages_startup_s"] - metrics["stage_startup_s"], 3)
    if args.out:
        from edge_infer.bench.harness.provenance import collect

        doc = {"benchmark": "pipeline", "model": model, "settings": vars(args) | {"func": None}, "metrics": metrics,
               "provenance": collect([]).model_dump()}
        Path(args.out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(json.dumps(metrics))
    return 0
