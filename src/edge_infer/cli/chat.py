"""``edge-infer chat``: an interactive conversation in the terminal, streamed token by token."""
from __future__ import annotations

import argparse
import asyncio
import sys

from edge_infer.engine.cli_args import add_engine_args, engine_settings


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.add_argument("--system", default=None, help="system message")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)


async def _chat(args: argparse.Namespace) -> int:
    from edge_infer.engine.local import LocalTextEngine
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.errors import PlanRefusedError
    from edge_infer.memory.plan import plan_text_session

    plan = plan_text_session(resolve_model(args.model), **engine_settings(args))
    if not plan.admitted:
        raise PlanRefusedError("memory plan refused:\n" + plan.table(), plan)
    engine = LocalTextEngine(plan, worker=args.worker)
    await engine.start()
    session = engine.open_session()
    history = [{"role": "system", "content": args.system}] if args.system else []
    print("edge-infer chat — empty line or Ctrl-D to quit", file=sys.stderr)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, lambda: input("you> "))
            if not line.strip():
                break
            history.append({"role": "user", "content": line})
            _, stream = await engine.submit(session, history, max_tokens=args.max_tokens, temperature=args.temperature)
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


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_chat(args))
