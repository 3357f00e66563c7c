"""``edge-infer generate``: one prompt in, text out (streamed to the terminal)."""
from __future__ import annotations

import argparse
import sys

from edge_infer.cli.attachments import PART_TYPES, file_part
from edge_infer.engine.cli_args import add_engine_args, engine_settings


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.add_argument("--prompt", "-p", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    for kind in PART_TYPES:
        parser.add_argument(f"--{kind}", action="append", default=[], metavar="FILE",
                            help=f"send a{'n' if kind[0] in 'aeiou' else ''} {kind} file with the prompt (repeatable; "
                                 "implies --chat; a multimodal model)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")


def run(args: argparse.Namespace) -> int:
    from edge_infer.engine.llm import LLM
    from edge_infer.engine.sampling_params import SamplingParams

    # Errors (a refused plan, a bad checkpoint or prompt) are reported by edge_infer.cli in one line.
    try:
        parts = [file_part(kind, path) for kind in PART_TYPES for path in getattr(args, kind)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with LLM(args.model, worker=args.worker, **engine_settings(args)) as llm:
        params = SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos,
        )
        if parts:
            out = llm.chat([{"role": "user", "content": [*parts, {"type": "text", "text": args.prompt}]}], params)[0]
        elif args.chat:
            out = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
        else:
            out = llm.generate(args.prompt, params)[0]
    print(out.outputs[0].text)
    print(f"[{len(out.outputs[0].token_ids)} tokens, finish_reason={out.finish_reason}]", file=sys.stderr)
    if out.error is not None:
        print(f"error: {out.error}", file=sys.stderr)
        return 1
    return 0
