"""``edge-infer chat``: an interactive conversation in the terminal, streamed token by token.

A line may start with attachments for a multimodal model: ``/image PATH``, ``/audio PATH`` or ``/video PATH``
(quote a path with spaces), then the question: ``/image cat.jpg What is in this picture?``. The files are
sent as data: URLs, the same parts the server takes.
"""
from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from typing import Any

from edge_infer.cli.attachments import PART_TYPES, file_part
from edge_infer.engine.cli_args import add_engine_args, engine_settings

ATTACHMENTS = {f"/{kind}": kind for kind in PART_TYPES}  # /image, /audio, /video


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.add_argument("--system", default=None, help="system message")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)


async def _chat(args: argparse.Namespace) -> int:
    from edge_infer.engine.local import LocalTextEngine
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.errors import EdgeInferError, PlanRefusedError
    from edge_infer.memory.plan import plan_text_session

    plan = plan_text_session(resolve_model(args.model), **engine_settings(args))
    if not plan.admitted:
        raise PlanRefusedError("memory plan refused:\n" + plan.table(), plan)
    engine = LocalTextEngine(plan, worker=args.worker)
    await engine.start()
    session = engine.open_session()
    history = [{"role": "system", "content": args.system}] if args.system else []
    print("edge-infer chat — empty line or Ctrl-D to quit; /image, /audio or /video PATH attach a file",
          file=sys.stderr)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, lambda: input("you> "))
            if not line.strip():
                break
            try:
                content = user_content(line)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                continue
            history.append({"role": "user", "content": content})
            try:
                _, stream = await engine.submit(session, history, max_tokens=args.max_tokens,
                                                temperature=args.temperature)
            except EdgeInferError as exc:  # a picture it cannot read, a kind the model does not take: say so, go on
                history.pop()
                print(f"error: {exc}", file=sys.stderr)
                continue
            reply = []
            print("model> ", end="", flush=True)
            async for event in stream:
                if event.kind == "token":
                    reply.append(event.text)
                    print(event.text, end="", flush=True)
                elif event.kind == "error":
                    print(f"\n[error: {event.error}]", end="")
            print()
            if not engine.healthy:
                print("error: the engine worker is gone; restart edge-infer chat", file=sys.stderr)
                return 1
            history.append({"role": "assistant", "content": "".join(reply)})
    except (EOFError, KeyboardInterrupt):
        print()
    finally:
        await engine.close()
    return 0


def user_content(line: str) -> str | list[dict[str, Any]]:
    """A typed line as a user message's content: the text, or its attachments' parts and then the text."""
    if not line.startswith(tuple(ATTACHMENTS)):
        return line
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise ValueError(f"{exc} (quote a path with spaces: /image \"my picture.png\")") from None
    parts = []
    while words and words[0] in ATTACHMENTS:
        if len(words) < 2:
            raise ValueError(f"{words[0]} needs a file: {words[0]} PATH [question]")
        parts.append(file_part(ATTACHMENTS[words[0]], words[1]))
        words = words[2:]
    text = " ".join(words)
    return parts + ([{"type": "text", "text": text}] if text else [])


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_chat(args))
