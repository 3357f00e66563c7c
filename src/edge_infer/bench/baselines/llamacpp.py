"""`edge-infer bench llamacpp ACTION`: the llama.cpp baseline on the same checkpoint.

    export MODEL DST.gguf [--outtype bf16]     the checkpoint as GGUF (our exporter, the `gguf` library)
    quantize SRC.gguf DST.gguf --type Q4_K_M   llama.cpp's own quantizer
    prepare MODEL DIR                          export bf16, then Q8_0, Q4_K_M and Q4_0 next to it
    pp-tg FILE.gguf [--pp 512] [--tg 128]      a grid arm: the same JSON keys as `bench pp-tg`
    check MODEL FILE.gguf                      greedy tokens of llama.cpp vs edge-infer on the same prompts
    media TEXT.gguf --mmproj F --tokenizer M   a grid arm: `bench media`'s keys on llama.cpp's multimodal path

`pp-tg` follows `edge-infer bench pp-tg` exactly (same prompts, same
warm-up, same arithmetic in `harness/llama_bench.py`): threads = the cores this
process may use unless `--threads` is given, batch = `--pp`, every call
from an empty context. Needs the `baseline` extra (llama-cpp-python, gguf).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from edge_infer.bench.baselines import llamacpp_media
from edge_infer.bench.harness import bandwidth, llama_bench, media_bench
from edge_infer.bench.harness.arm_output import emit, mib, model_fingerprint, run_arm, stamp
from edge_infer.bench.harness.provenance import now_utc

QUANT_CHOICES = ("Q8_0", "Q4_K_M", "Q4_0")


def _threads(args: argparse.Namespace) -> int:
    return args.threads or len(os.sched_getaffinity(0))


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="llamacpp_action", metavar="ACTION", required=True)

    p = sub.add_parser("export", help="write a GGUF of a checkpoint (gguf library)")
    p.add_argument("model", type=Path, help="checkpoint directory")
    p.add_argument("dst", type=Path, help="GGUF file to write")
    p.add_argument("--outtype", default="bf16", choices=("bf16", "f16", "f32"), help="type of the matrices (default bf16)")

    p = sub.add_parser("quantize", help="quantize a GGUF with llama.cpp's quantizer")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--type", required=True, choices=QUANT_CHOICES)
    p.add_argument("--threads", type=int, default=None, help="default: the cores this process may use")

    p = sub.add_parser("prepare", help="export bf16 and quantize to Q8_0, Q4_K_M and Q4_0 into a directory")
    p.add_argument("model", type=Path, help="checkpoint directory")
    p.add_argument("dir", type=Path, help="directory for <name>-bf16.gguf, <name>-Q8_0.gguf, <name>-Q4_K_M.gguf, <name>-Q4_0.gguf")
    p.add_argument("--types", default=",".join(QUANT_CHOICES), help="quantized types to make (default Q8_0,Q4_K_M,Q4_0)")
    p.add_argument("--threads", type=int, default=None)

    p = sub.add_parser("pp-tg", help="prefill/decode rates of a GGUF in llama.cpp (one JSON line, a grid arm)")
    p.add_argument("gguf", type=Path, help="GGUF file")
    llama_bench.add_pp_tg_args(p)
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: the cores this process may use, as edge-infer)")
    p.add_argument("--flash-attn", action="store_true", help="use llama.cpp's flash attention (default off)")
    p.add_argument("--no-mmap", action="store_true", help="read weights into allocated memory instead of mapping the file")
    p.add_argument("--tag", default=None, help="label stored with the result")
    p.add_argument("--out", type=Path, metavar="FILE", help="also write the result JSON here")

    p = sub.add_parser("media", help="encode time, TTFT and decode rate after an image, audio, both on libmtmd (a grid arm)")
    llamacpp_media.add_args(p)

    p = sub.add_parser("check", help="greedy agreement of llama.cpp and edge-infer on a few prompts")
    p.add_argument("model", type=Path, help="the checkpoint the GGUF was exported from")
    p.add_argument("gguf", type=Path)
    p.add_argument("--tokens", type=int, default=8, help="greedy tokens per prompt (default 8)")
    p.add_argument("--dtype", default="float32", help="edge-infer's dtype (default float32)")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable; default: a few built-in questions)")
    p.add_argument("--out", type=Path, metavar="FILE")


def _export(args: argparse.Namespace) -> dict[str, Any]:
    from edge_infer.bench.baselines.gguf_export import export_gguf

    r = export_gguf(args.model, args.dst, args.outtype)
    return {"gguf": str(r.path), "arch": r.arch, "outtype": r.outtype, "tensors": r.n_tensors, "tensor_bytes": r.bytes_written}


def _quantize(args: argparse.Namespace) -> dict[str, Any]:
    from edge_infer.bench.baselines.llamacpp_engine import quantize

    t0 = time.perf_counter()
    quantize(args.src, args.dst, args.type, _threads(args))
    return {"gguf": str(args.dst), "type": args.type, "seconds": round(time.perf_counter() - t0, 2)}


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    from edge_infer.bench.baselines.gguf_export import export_gguf
    from edge_infer.bench.baselines.llamacpp_engine import quantize

    types = [t.strip() for t in args.types.split(",") if t.strip()]
    bad = [t for t in types if t not in QUANT_CHOICES]
    if bad:
        raise ValueError(f"--types {', '.join(bad)}: choose among {', '.join(QUANT_CHOICES)}")
    stem = args.model.resolve().name
    bf16 = export_gguf(args.model, args.dir / f"{stem}-bf16.gguf", "bf16").path
    files = {"bf16": str(bf16)}
    for t in types:
        files[t] = str(quantize(bf16, args.dir / f"{stem}-{t}.gguf", t, _threads(args)))
    return {"model": str(args.model), "files": files}


def _pp_tg(args: argparse.Namespace) -> dict[str, Any]:
    from edge_infer.bench.baselines.llamacpp_engine import LlamaCppModel, LlamaCppSettings, decode_read_bytes
    from edge_infer.memory.measure import tree_rss_anon_bytes, tree_rss_file_bytes

    s = llama_bench.settings_from(args)
    settings = LlamaCppSettings(
        n_ctx=s.context_tokens, n_batch=s.pp, n_threads=_threads(args), flash_attn=args.flash_attn, use_mmap=not args.no_mmap,
    )
    t0 = time.perf_counter()
    model = LlamaCppModel(args.gguf, settings)
    init_s = time.perf_counter() - t0
    try:
        reps = llama_bench.measure(model.timed_generate, model.n_vocab, s)
        anon, file_backed = tree_rss_anon_bytes(), tree_rss_file_bytes()
        loaded = model.loaded()
    finally:
        model.close()
    rates = llama_bench.rates(reps, s)
    read_bytes = decode_read_bytes(args.gguf)
    loaded["decode_read_bytes"] = read_bytes
    return {
        **rates,
        **bandwidth.read_rates(rates["tg_tps"], read_bytes, settings.n_threads),
        "init_s": round(init_s, 3),
        "rss_anon_mb": mib(anon),
        "rss_file_mb": mib(file_backed),
        "engine": "llama.cpp",
        "model": str(args.gguf),
        "loaded": loaded,
        "settings": {"pp": s.pp, "tg": s.tg, "depth": s.depth, "reps": s.reps, "seed": s.seed, "prefix_cache": False, "detokenize": False},
        "notes": ["weights are memory-mapped (use_mmap): they occupy RssFile, not RssAnon"] if settings.use_mmap else [],
    }


def run(args: argparse.Namespace) -> int:
    started_at = now_utc()
    action = args.llamacpp_action
    try:
        if action == "check":
            from edge_infer.bench.baselines.llamacpp_check import run_check

            result = run_check(args.model, args.gguf, args.prompt, args.tokens, args.dtype)
        elif action == "media":
            s = media_bench.settings_from(args)
            return run_arm("llamacpp media", lambda: llamacpp_media.measure(args, s), args.tag, started_at, args.out)
        else:
            result = {"export": _export, "quantize": _quantize, "prepare": _prepare, "pp-tg": _pp_tg}[action](args)
    except (ValueError, RuntimeError, ImportError, OSError) as exc:
        print(f"edge-infer bench llamacpp {action}: error: {exc}", file=sys.stderr)
        return 1
    if action == "pp-tg":
        result["tag"] = args.tag
        result["model_fingerprint"] = model_fingerprint(args.gguf)
    if action in ("pp-tg", "check"):
        result["provenance"] = stamp(started_at)
    emit(result, getattr(args, "out", None))
    if action == "check" and result["first_token_agreement"] < 1.0:
        print("edge-infer bench llamacpp check: llama.cpp and edge-infer disagree on a first greedy token; "
              "the export (tensor mapping, RoPE layout, hyperparameters) is suspect", file=sys.stderr)
        return 1
    return 0
