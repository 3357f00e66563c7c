"""`edge-infer bench SUBCOMMAND`: the measurement harness's own command table.

Each entry names a module exposing ``configure(parser)`` and ``run(args) ->
int``, like the top-level table. Every listed module is imported to build
the parser, so a module's top level must stay light: import torch, engines
or matplotlib inside ``run``. To add a subcommand, add one line here.
"""
from __future__ import annotations

import argparse
import importlib

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "grid": ("edge_infer.bench.harness.grid", "run arms for rotated passes: median, spread, flags, checks"),
    "archive": ("edge_infer.bench.harness.archive", "create, verify or restore a result archive (SHA-256 manifest)"),
    "report": ("edge_infer.bench.harness.report", "Markdown tables and PNG plots from grid results"),
    "serve": ("edge_infer.bench.measures.serve", "serving TTFT/ITL/throughput at 1/2/4 clients vs the engine without HTTP"),
    "transport": ("edge_infer.bench.measures.transport", "per-chunk cost between stage processes: inline vs shared memory, by size"),
    "pipeline": ("edge_infer.bench.measures.pipeline", "a text model as an omni stage vs the engine alone; stage start-up cost"),
    "init-memory": ("edge_infer.bench.measures.init_memory", "ready time from process creation, sampled peak RssAnon, memory at a filled context vs the plan"),
    "pp-tg": ("edge_infer.bench.measures.pp_tg", "edge-infer prefill/decode rates with llama-bench semantics (one JSON line)"),
    "media": ("edge_infer.bench.measures.media", "a thinker's encode time, TTFT and decode rate after an image, audio, both (one JSON line)"),
    "llamacpp": ("edge_infer.bench.baselines.llamacpp", "the llama.cpp baseline: GGUF export, quantize, pp-tg arm, greedy check"),
    "transformers": ("edge_infer.bench.baselines.transformers_media", "the transformers baseline: the media arm on Qwen2_5OmniThinkerForConditionalGeneration"),
    "reliability": ("edge_infer.bench.measures.reliability", "fault behaviours (saturation, cancel, stale handle, oversized plan, worker kill), each a recorded outcome"),
    "tts": ("edge_infer.bench.measures.tts", "speech pipeline: TTFP and RTF p50/p95 at 1/2/4 clients per length band, per-stage times"),
    "kernels": ("edge_infer.bench.measures.kernels", "every weight kernel this CPU runs, per activation dtype, at 1 and 64 tokens"),
    "fidelity": ("edge_infer.bench.measures.fidelity", "top-1 agreement, KL and greedy divergence of a candidate vs a reference"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).configure(sp)


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: edge-infer bench SUBCOMMAND [options]", "", "subcommands:"]
    lines += [f"  {name.ljust(width)}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += ["", "edge-infer bench SUBCOMMAND --help shows a subcommand's options."]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "bench_command", None) is None:
        print(usage())
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.bench_command][0])
    return int(module.run(args) or 0)
