"""The ``edge-infer`` command line.

Each subcommand lives in the module that owns the feature; that module
exposes ``configure(parser)`` and ``run(args) -> int``. Only the module of
the command being run is imported, so ``edge-infer --help`` stays instant.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("edge_infer.server.cli", "OpenAI-compatible HTTP server"),
    "generate": ("edge_infer.engine.cli", "generate text for one prompt"),
    "chat": ("edge_infer.engine.chat_cli", "interactive chat in the terminal"),
    "plan": ("edge_infer.memory.cli", "memory plan before loading (text model or deploy config)"),
    "synth": ("edge_infer.models.synth", "write a random checkpoint of a supported family"),
    "quantize": ("edge_infer.quant.cli", "write a cpu_int4 (W4A16) checkpoint"),
    "tts": ("edge_infer.tts.cli", "speak text to a WAV file with a Qwen3-TTS checkpoint"),
    "bench": ("edge_infer.bench.cli", "measurement harness (grid, pp-tg, init-memory, ...)"),
    "agent": ("edge_infer.agent.cli", "phone-agent task suite on a simulated (or real) Android phone"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-infer", description="Inference and serving on edge machines.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
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
    return int(module.run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
