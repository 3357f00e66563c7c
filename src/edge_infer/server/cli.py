"""``edge-infer serve``: plan, then serve the model over an OpenAI-compatible HTTP API.

The memory plan runs first; a plan that does not fit is printed and the
command exits 1 before anything is loaded. HTTP comes up at once (``/health``
answers 503 while the weights load, with a progress bar on a terminal); the
URL and a ``curl`` line are printed when the model is ready. SIGTERM or
Ctrl-C: no new requests, in-flight ones get ``--shutdown-grace-s`` seconds to
finish and are then cancelled, the worker is stopped, and the exit status is 0.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from edge_infer.engine.cli_args import add_engine_args, engine_settings
from edge_infer.server.exit_codes import EXIT_ENGINE_DEAD, EXIT_LOAD_FAILED

API_KEY_ENV = "EDGE_INFER_API_KEY"
DEFAULT_MAX_BODY_BYTES = 16 << 20
# uvicorn's own deadline for responses after SIGTERM, beyond our grace period (which cancels them first).
UVICORN_GRACE_MARGIN_S = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    from edge_infer.server.tool_parsers import PARSERS

    add_engine_args(parser)
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' on /v1 (or set {API_KEY_ENV})")
    g.add_argument("--served-model-name", default=None, help="the model name clients send (default: the checkpoint directory's name)")
    g.add_argument("--max-queue", type=int, default=32,
                   help="sequences that may wait beyond --max-num-seqs; more get 429 with Retry-After (default 32)")
    g.add_argument("--shutdown-grace-s", type=float, default=10.0,
                   help="on SIGTERM, seconds in-flight requests get to finish before they are cancelled (default 10)")
    g.add_argument("--tool-call-parser", default="auto", choices=["auto", *PARSERS],
                   help="tool-call format in model output (default: from the chat template)")
    g.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest request body accepted; bigger ones get 413 before they are read (default {DEFAULT_MAX_BODY_BYTES >> 20} MiB)")
    g.add_argument("--parse-special-tokens-in-content", action="store_true",
                   help="tokenize special-token text (e.g. <|im_end|>) in chat messages and tools as control tokens; by "
                        "default it is plain text, so a user cannot close their turn or open another role's")
    g.add_argument("--no-restart", action="store_true",
                   help=f"do not restart a dead engine worker: exit {EXIT_ENGINE_DEAD} at once (for a supervisor to act)")
    g.add_argument("--max-restarts", type=int, default=3,
                   help=f"engine worker restarts within 10 minutes before the server exits {EXIT_ENGINE_DEAD} (default 3)")
    g.add_argument("--heartbeat-timeout-s", type=float, default=None,
                   help="seconds of silence from the engine worker before it is unresponsive: /health 503, requests end "
                        "(default 3)")
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    s = parser.add_argument_group("speech (a Qwen3-TTS checkpoint, or a speech deploy config)")
    s.add_argument("--deploy-config", default=None, help="serve this speech pipeline (YAML; its stages name their model)")
    s.add_argument("--stage-overrides", default=None, help='JSON per stage id, e.g. \'{"1": {"engine": {"dtype": "float32"}}}\'')
    s.add_argument("--max-input-chars", type=int, default=4096, help="longest /v1/audio/speech input accepted (default 4096)")


def run(args: argparse.Namespace) -> int:
    from edge_infer.engine.frontend import Frontend
    from edge_infer.server.lifecycle import ServeSettings
    from edge_infer.server.state import RestartPolicy, ServerState
    from edge_infer.server.tool_parsers import detect_parser

    if args.max_queue < 0 or args.shutdown_grace_s < 0 or args.max_restarts < 0:
        print("error: --max-queue, --shutdown-grace-s and --max-restarts must not be negative", file=sys.stderr)
        return 2
    if args.max_body_bytes < 1024 or (args.heartbeat_timeout_s is not None and args.heartbeat_timeout_s <= 0):
        print("error: --max-body-bytes must be at least 1024 and --heartbeat-timeout-s positive", file=sys.stderr)
        return 2
    from edge_infer.tts.deploy import is_qwen3_tts_checkpoint

    if args.deploy_config or (args.model and is_qwen3_tts_checkpoint(args.model)):
        from edge_infer.server.speech_cli import serve_speech

        return serve_speech(args, _serve)
    # A refused plan or a bad checkpoint is reported by edge_infer.cli in one line (nothing loaded).
    frontend = Frontend.create(args.model, frontend="server", **engine_settings(args))
    plan = frontend.plan
    print(
        f"memory plan: steady {plan.steady_bytes / 2**20:,.1f} MiB, load peak {plan.load_peak_bytes / 2**20:,.1f} MiB, "
        f"{plan.available_bytes / 2**20:,.1f} MiB available: admitted",
        file=sys.stderr,
    )
    template = frontend.tokenizer.chat_template if frontend.tokenizer else None
    settings = ServeSettings(
        served_model_name=args.served_model_name or Path(plan.model).name,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_queue=args.max_queue,
        shutdown_grace_s=args.shutdown_grace_s,
        tool_call_parser=detect_parser(template) if args.tool_call_parser == "auto" else args.tool_call_parser,
        max_body_bytes=args.max_body_bytes,
        special_tokens_in_content=args.parse_special_tokens_in_content,
    )
    restart = RestartPolicy(enabled=not args.no_restart, max_restarts=args.max_restarts)
    state = ServerState(frontend, settings, worker=args.worker, restart=restart, heartbeat_timeout_s=args.heartbeat_timeout_s)
    return _serve(state, args)


def _serve(state, args: argparse.Namespace, build=None, banner=None) -> int:
    """Run uvicorn over ``build(state, load)`` (the text app by default); SIGTERM drains ``state``."""
    import asyncio

    import uvicorn
    from tqdm import tqdm

    from edge_infer.server.app import build_app

    class Server(uvicorn.Server):
        exit_code = 0

        def handle_exit(self, sig: int, frame) -> None:
            if not self.should_exit and loop is not None:
                loop.call_soon_threadsafe(lambda: asyncio.ensure_future(state.drain()))
            super().handle_exit(sig, frame)

    async def load() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        bar = tqdm(desc="loading weights", unit="tensor", file=sys.stderr, disable=None, leave=False)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        def fatal(code: int, reason: str) -> None:
            print(f"error: {reason}; exiting with status {code}", file=sys.stderr)
            server.exit_code = code
            server.should_exit = True

        state.on_fatal = fatal
        try:
            await state.load(progress)
        except Exception as exc:
            bar.close()
            fatal(EXIT_LOAD_FAILED, f"the model failed to load: {exc}")
            return
        bar.close()
        if state.phase == "ready":
            print((banner or _banner)(state, args), flush=True)

    loop = None
    config = uvicorn.Config(
        (build or build_app)(state, load), host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        timeout_graceful_shutdown=args.shutdown_grace_s + UVICORN_GRACE_MARGIN_S,
    )
    server = Server(config)
    # uvicorn re-raises the signal it handled once it has shut down; a no-op handler makes that a clean exit.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return server.exit_code


def _banner(state, args: argparse.Namespace) -> str:
    info = state.engine.ready_info
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    base = f"http://{host}:{args.port}"
    name = state.settings.served_model_name
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64})
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if state.settings.api_key else ""
    return "\n".join([
        f"loaded {name} in {info.load_s:.1f} s ({info.dtype}, {info.weight_bytes / 2**20:,.1f} MiB weights, "
        f"KV cache {info.kv_cache_bytes / 2**20:,.1f} MiB = {info.kv_blocks} blocks, {info.num_threads} threads)",
        f"edge-infer is serving {name!r} at {base}/v1  (health: {base}/health, metrics: {base}/metrics)",
        "try:",
        f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'",
    ])
