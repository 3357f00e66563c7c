"""The ``edge-infer`` command line.

Each subcommand lives in the module that owns the feature; that module
exposes ``configure(parser)`` and ``run(args) -> int``. Only the module of
the command being run is imported, so ``edge-infer --help`` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("edge_infer.cli.serve", "OpenAI-compatible HTTP server"),
    "generate": ("edge_infer.cli.generate", "generate text for one prompt"),
    "chat": ("edge_infer.cli.chat", "interactive chat in the terminal"),
    "plan": ("edge_infer.cli.plan", "memory plan before loading (text model or deploy config)"),
    "doctor": ("edge_infer.cli.doctor", "what this machine can run: CPU features, memory, the kernel of each choice"),
    "synth": ("edge_infer.cli.synth", "write a random checkpoint of a supported family"),
    "quantize": ("edge_infer.cli.quantize", "write a cpu_int4 (4-bit) or cpu_int8 (8-bit) checkpoint"),
    "tts": ("edge_infer.cli.tts", "speak text to a WAV file with a Qwen3-TTS checkpoint"),
    "bench": ("edge_infer.bench.cli", "measurement harness (grid, pp-tg, init-memory, ...)"),
    "agent": ("edge_infer.cli.agent", "phone-agent task suite on a simulated (or real) Android phone"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    # No abbreviations: `plan --max-body-bytes` once read as another flag that `serve` also has, planning other
    # memory than serve then took.
    parser = argparse.ArgumentParser(prog="edge-infer", description="Inference and serving on edge machines.",
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        if name == command:
            importlib.import_module(module).configure(sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    from edge_infer.errors import EdgeInferError, PlanRefusedError

    try:
        return int(module.run(args) or 0)
    except PlanRefusedError as exc:  # the plan's table, then why in one line; nothing was loaded
        print(exc, file=sys.stderr)
        print(f"edge-infer {args.command}: error: {exc.summary} (nothing was loaded)", file=sys.stderr)
        return 1
    except EdgeInferError as exc:  # a user error: one line, no traceback
        print(f"edge-infer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
