"""``edge-infer bench fidelity``: how closely a candidate model follows a reference.

    edge-infer bench fidelity --reference REF --candidate CAND [--prompts FILE] [--json]
    edge-infer bench fidelity --reference REF --candidate-quantization cpu_int4 --group-size 128

The candidate is another checkpoint directory (e.g. the output of
``edge-infer quantize``), or the reference itself quantized at load time.
Metrics and method: ``edge_infer.bench.measures.fidelity_metrics`` and docs/quantization.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edge_infer.config import QUANT_METHODS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", required=True, help="reference checkpoint directory (e.g. the bf16 model)")
    parser.add_argument("--candidate", default=None, help="candidate checkpoint directory (default: the reference)")
    parser.add_argument("--candidate-quantization", default=None, choices=QUANT_METHODS,
                        help="quantize the candidate at load time (cpu_w4a8: int8 activations too)")
    parser.add_argument("--group-size", type=int, default=128, help="cpu_int4 group size of the candidate (default 128)")
    parser.add_argument("--asym", action="store_true", help="cpu_int4 candidate with zero points")
    parser.add_argument("--quantize-head", action="store_true", help="cpu_int4 candidate with its output head quantized too")
    parser.add_argument("--candidate-kv-cache-dtype", default="auto", choices=["auto", "int8"],
                        help="the candidate's KV cache (int8: codes and a scale per token and head)")
    parser.add_argument("--prompts", default=None, help="text file, one prompt per line ('#' comments); default: a built-in set")
    parser.add_argument("--chat", default="auto", choices=["auto", "yes", "no"],
                        help="wrap each prompt as a user message with the reference's chat template (auto: when it has one)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="length of the reference's greedy continuations")
    parser.add_argument("--dtype", default="auto", help="activation dtype of both models: auto, bfloat16 or float32")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument("--out", default=None, help="also write the full result (per prompt) as JSON to this file")


def read_prompts(path: str | None) -> list[str]:
    from edge_infer.bench.measures.fidelity_metrics import DEFAULT_PROMPTS

    if path is None:
        return list(DEFAULT_PROMPTS)
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    prompts = [line for line in lines if line and not line.startswith("#")]
    if not prompts:
        raise ValueError(f"{path} holds no prompts (one per line; blank lines and '#' lines are skipped)")
    return prompts


def run(args: argparse.Namespace) -> int:
    from edge_infer.config import QuantConfig
    from edge_infer.engine.core import EngineCore
    from edge_infer.engine.frontend import Frontend
    from edge_infer.errors import EdgeInferError
    from edge_infer.models.config import ModelConfig
    from edge_infer.models.tokenizer import Tokenizer
    from edge_infer.bench.measures.fidelity_metrics import measure_fidelity

    candidate_dir = args.candidate or args.reference
    if candidate_dir == args.reference and args.candidate_quantization is None and args.candidate_kv_cache_dtype == "auto":
        print("error: the candidate is the reference itself; pass --candidate DIR, --candidate-quantization cpu_int4 "
              "or --candidate-kv-cache-dtype int8", file=sys.stderr)
        return 2
    quant = None
    if args.candidate_quantization:
        quant = QuantConfig.named(args.candidate_quantization, group_size=args.group_size, symmetric=not args.asym,
                                  quantize_head=args.quantize_head)
    try:
        texts = read_prompts(args.prompts)
        tokenizer = Tokenizer(args.reference)
        chat = args.chat == "yes" or (args.chat == "auto" and tokenizer.chat_template is not None)
        prompts = [
            tokenizer.encode_chat([{"role": "user", "content": t}], add_generation_prompt=True)[1] if chat else tokenizer.encode(t)
            for t in texts
        ]
        max_len = max(map(len, prompts)) + args.max_new_tokens
        model_max = ModelConfig.from_dir(args.reference).max_position_embeddings
        if max_len > model_max:
            raise ValueError(f"the longest prompt plus --max-new-tokens needs {max_len} positions; the model has {model_max}")
        # Each prompt computed whole (no cached prefix): both models see the same chunks, run after run.
        settings = dict(dtype=args.dtype, max_model_len=max_len, max_num_seqs=1, max_num_batched_tokens=max(256, max_len),
                        prefix_caching=False)
        ref_frontend = Frontend.create(args.reference, **settings)
        cand_frontend = Frontend.create(candidate_dir, skip_tokenizer_init=True, quantization=quant,
                                        kv_cache_dtype=args.candidate_kv_cache_dtype, **settings)
        reference = EngineCore(ref_frontend.engine_config)
        candidate = EngineCore(cand_frontend.engine_config)
        report = measure_fidelity(
            reference, candidate, prompts, args.max_new_tokens,
            reference_name=_describe(args.reference, ref_frontend.plan.settings),
            candidate_name=_describe(candidate_dir, cand_frontend.plan.settings),
        )
    except (EdgeInferError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = report.to_dict()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "per_prompt"}))
    else:
        print(f"reference  {report.reference}")
        print(f"candidate  {report.candidate}")
        print(f"prompts    {len(report.prompts)} ({'chat' if chat else 'plain'}), {report.positions} teacher-forced positions")
        print(f"top-1 agreement        {report.top1_agreement:.4f}")
        print(f"mean KL (ref || cand)  {report.mean_kl:.5f} nats")
        print(f"greedy kept fraction   {report.greedy_kept_fraction:.4f} (of up to {args.max_new_tokens} tokens)")
        print(f"greedy exact matches   {report.greedy_exact_matches}/{len(report.prompts)}")
    return 0


def _describe(model: str, settings: dict) -> str:
    kv = settings.get("kv_cache_dtype", "auto")
    return f"{model} [{settings['dtype']}, {settings['quantization'] or 'unquantized'}{', int8 kv' if kv == 'int8' else ''}]"
