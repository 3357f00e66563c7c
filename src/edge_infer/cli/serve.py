"""``edge-infer serve``: plan, then serve a text model, a speech model, or both, over an OpenAI-compatible API.

``MODEL`` is a text checkpoint or a Qwen3-TTS one; ``--deploy-config`` names
a speech pipeline; ``--speech DIR`` adds a speech model beside a text one, in
the same process and on the same port. Every memory plan runs first; a plan
that does not fit is printed and the command exits 1 before anything is
loaded. HTTP comes up at once (``/health`` answers 503 while the weights
load, with a progress bar on a terminal); the URL and a ``curl`` line per
model are printed when they are ready. SIGTERM or Ctrl-C: no new requests,
in-flight ones get ``--shutdown-grace-s`` seconds to finish and are then
cancelled, the workers are stopped, and the exit status is 0 (exit codes:
``server.exit_codes``).

For a speech model the engine flags map onto its two stages: ``--dtype``,
``--max-num-seqs`` and ``--num-threads`` onto both, ``--max-model-len``,
``--max-num-batched-tokens``, ``--kv-cache-memory-bytes`` and
``--quantization`` onto the Talker; ``--stage-overrides`` comes last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.engine.cli_args import add_engine_args, engine_settings
from edge_infer.media.sources import ALLOWED_DIR_FLAG, MAX_BYTES_FLAG, REMOTE_FLAG, MediaPolicy
from edge_infer.server.exit_codes import EXIT_ENGINE_DEAD, EXIT_LOAD_FAILED
from edge_infer.server.limits import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES,
                                     DEFAULT_MAX_BODY_ITEMS, DEFAULT_SEND_TIMEOUT_S)

if TYPE_CHECKING:  # pragma: no cover
    from edge_infer.memory.ledger import Reservation
    from edge_infer.memory.plan import TextPlan
    from edge_infer.server.service import ServeSettings
    from edge_infer.tts.deploy import SpeechPipeline

API_KEY_ENV = "EDGE_INFER_API_KEY"
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
    g.add_argument("--max-body-bytes-in-flight", type=int, default=None,
                   help="request bodies held at once by the requests in flight (the memory plan's 'request bodies' "
                        "item); a request that would pass it gets 429 before its body is read (default: twice "
                        "--max-body-bytes)")
    g.add_argument("--max-body-items", type=int, default=DEFAULT_MAX_BODY_ITEMS,
                   help="JSON items (commas and brackets) a request body may hold; more get 413 before it is parsed "
                        f"(default {DEFAULT_MAX_BODY_ITEMS:,})")
    g.add_argument("--header-timeout-s", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                   help="seconds a connection gets to send a complete request head, after it opens or after its last "
                        f"response; then it is closed (default {DEFAULT_HEADER_TIMEOUT_S:g})")
    g.add_argument("--body-timeout-s", type=float, default=DEFAULT_BODY_TIMEOUT_S,
                   help="seconds a request gets to send its whole body, after its head; then it gets 408 "
                        f"(default {DEFAULT_BODY_TIMEOUT_S:g})")
    g.add_argument("--send-timeout-s", type=float, default=DEFAULT_SEND_TIMEOUT_S,
                   help="seconds a client may take none of what it is sent (the socket full, or bytes left after the "
                        f"connection closed); then the connection is reset and its request cancelled (default "
                        f"{DEFAULT_SEND_TIMEOUT_S:g})")
    g.add_argument("--max-connections-per-client", type=int, default=0,
                   help="connections one client address may hold open at once; more get 429 and are closed (default "
                        "0: no limit; behind a proxy every client has the proxy's address)")
    g.add_argument("--parse-special-tokens-in-content", action="store_true",
                   help="tokenize special-token text (e.g. <|im_end|>) in chat messages and tools as control tokens; by "
                        "default it is plain text, so a user cannot close their turn or open another role's")
    g.add_argument("--no-restart", action="store_true",
                   help=f"do not restart a dead engine worker or pipeline stage: exit {EXIT_ENGINE_DEAD} at once (for a "
                        "supervisor to act)")
    g.add_argument("--max-restarts", type=int, default=3,
                   help=f"restarts of a dead engine worker or pipeline stage within 10 minutes before the server exits "
                        f"{EXIT_ENGINE_DEAD} (default 3)")
    g.add_argument("--heartbeat-timeout-s", type=float, default=None,
                   help="seconds of silence from the engine worker before it is unresponsive: /health 503, requests end "
                        "(default 3)")
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    m = parser.add_argument_group("media (image, audio and video parts of a multimodal model's chat requests)")
    m.add_argument(ALLOWED_DIR_FLAG, default=None, metavar="DIR",
                   help="read file:// media URLs under DIR only (symlinks and .. resolved first); off by default: "
                        "requests send data: URLs")
    m.add_argument(REMOTE_FLAG, action="store_true",
                   help="fetch http(s) media URLs (requests can then make the server fetch any URL it reaches, its "
                        "own network included); off by default")
    m.add_argument(MAX_BYTES_FLAG, type=int, default=MediaPolicy.max_bytes,
                   help=f"largest media item read from any source (default {MediaPolicy.max_bytes >> 20} MiB)")
    m.add_argument("--media-timeout-s", type=float, default=MediaPolicy.timeout_s,
                   help=f"longest download of a remote media item (default {MediaPolicy.timeout_s:g} s)")
    s = parser.add_argument_group("speech (a Qwen3-TTS checkpoint, or a speech deploy config)")
    s.add_argument("--speech", default=None, metavar="DIR", help="also serve this Qwen3-TTS checkpoint (beside the text MODEL)")
    s.add_argument("--deploy-config", default=None, help="serve this speech pipeline (YAML; its stages name their model)")
    s.add_argument("--stage-overrides", default=None, help='JSON per stage id, e.g. \'{"1": {"engine": {"dtype": "float32"}}}\'')
    s.add_argument("--max-input-chars", type=int, default=4096, help="longest /v1/audio/speech input accepted (default 4096)")


def run(args: argparse.Namespace) -> int:
    if min(args.max_queue, args.shutdown_grace_s, args.max_restarts, args.max_connections_per_client) < 0:
        print("error: --max-queue, --shutdown-grace-s, --max-restarts and --max-connections-per-client must not be "
              "negative", file=sys.stderr)
        return 2
    if args.max_body_bytes < 1024 or (args.heartbeat_timeout_s is not None and args.heartbeat_timeout_s <= 0):
        print("error: --max-body-bytes must be at least 1024 and --heartbeat-timeout-s positive", file=sys.stderr)
        return 2
    if args.max_body_items < 1024:
        print("error: --max-body-items must be at least 1024", file=sys.stderr)
        return 2
    if not all(math.isfinite(t) and t > 0 for t in (args.header_timeout_s, args.body_timeout_s, args.send_timeout_s)):
        print("error: --header-timeout-s, --body-timeout-s and --send-timeout-s must be positive numbers of seconds",
              file=sys.stderr)
        return 2
    if args.max_body_bytes_in_flight is None:
        args.max_body_bytes_in_flight = 2 * args.max_body_bytes
    if args.max_body_bytes_in_flight < args.max_body_bytes:
        print("error: --max-body-bytes-in-flight must be at least --max-body-bytes (one request of the largest "
              "body must fit)", file=sys.stderr)
        return 2
    if args.max_media_bytes < 1 or args.media_timeout_s <= 0:
        print(f"error: {MAX_BYTES_FLAG} and --media-timeout-s must be positive", file=sys.stderr)
        return 2
    if args.allowed_media_dir is not None and not Path(args.allowed_media_dir).is_dir():
        print(f"error: {ALLOWED_DIR_FLAG} {args.allowed_media_dir} is not a directory", file=sys.stderr)
        return 2
    from edge_infer.runtime.config import DeployConfigError
    from edge_infer.runtime.omni import DeployRefused
    from edge_infer.server.metrics import SharedMetrics
    from edge_infer.tts.deploy import is_qwen3_tts_checkpoint

    shared = SharedMetrics()
    speech_only = bool(args.deploy_config) or bool(args.model and is_qwen3_tts_checkpoint(args.model))
    try:
        if speech_only:
            services = [_speech_service(args, shared, speech_pipeline(args, args.model))]
        else:
            # Beside a speech model, the text model's KV cache is sized from what the speech stages leave, and the
            # speech plan books the text model's: one process, one free memory, counted once.
            pipeline = speech_pipeline(args, args.speech) if args.speech else None
            services = [_text_service(args, shared, pipeline)]
            if pipeline is not None:
                services.append(_speech_service(args, shared, pipeline, services[0].frontend.plan))
    except DeployRefused as exc:
        print(exc.plan.render(), file=sys.stderr)
        hint = (" or give the text model less (--kv-cache-memory-bytes, --max-num-seqs, --max-model-len, "
                "--quantization)") if exc.plan.beside else ""
        print(f"error: the pipeline does not fit; lower a stage's reservation{hint} (nothing was started)",
              file=sys.stderr)
        return 1
    except (DeployConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _serve(services, args)


def _settings(args: argparse.Namespace, name: str, **kind_settings: Any) -> "ServeSettings":
    from edge_infer.server.service import ServeSettings

    return ServeSettings(
        served_model_name=name, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, max_queue=args.max_queue,
        shutdown_grace_s=args.shutdown_grace_s, max_body_bytes=args.max_body_bytes,
        max_body_bytes_in_flight=args.max_body_bytes_in_flight, max_body_items=args.max_body_items,
        body_timeout_s=args.body_timeout_s, **kind_settings,
    )


def _text_service(args: argparse.Namespace, shared: Any, speech: SpeechPipeline | None = None) -> Any:
    """The text model's service, planned against the free memory the ``speech`` pipeline beside it leaves."""
    from edge_infer.engine.frontend import Frontend
    from edge_infer.errors import PlanRefusedError
    from edge_infer.server.text_service import TextService
    from edge_infer.server.tool_parsers import detect_parser

    planning: dict[str, Any] = {}
    if speech is not None:
        from edge_infer.hardware.memory import available_memory_bytes
        from edge_infer.runtime.deploy_plan import plan_deploy

        free = available_memory_bytes()
        speech_bytes = plan_deploy(speech.config).stages_bytes
        planning["available_bytes"] = max(0, free - speech_bytes)
    # A refused plan or a bad checkpoint is reported by edge_infer.cli in one line (nothing loaded).
    try:
        frontend = Frontend.create(args.model, frontend="server", body_bytes_in_flight=args.max_body_bytes_in_flight,
                                   **engine_settings(args), **planning)
    except PlanRefusedError as exc:
        if speech is None:
            raise
        raise PlanRefusedError(f"{exc}\nthe speech model beside it (--speech) reserves {speech_bytes / 2**20:,.1f} MiB "
                               f"of the {free / 2**20:,.1f} MiB available; the text model is planned in the rest",
                               exc.plan) from None
    frontend.media_policy = media_policy(args)
    plan = frontend.plan
    after = " (after the speech pipeline's)" if speech is not None else ""
    print(f"memory plan: steady {plan.steady_bytes / 2**20:,.1f} MiB, load peak {plan.load_peak_bytes / 2**20:,.1f} MiB, "
          f"{plan.available_bytes / 2**20:,.1f} MiB available{after}: admitted", file=sys.stderr)
    template = frontend.tokenizer.chat_template if frontend.tokenizer else None
    settings = _settings(
        args, args.served_model_name or Path(plan.model).name,
        tool_call_parser=detect_parser(template) if args.tool_call_parser == "auto" else args.tool_call_parser,
        special_tokens_in_content=args.parse_special_tokens_in_content,
    )
    return TextService(frontend, settings, worker=args.worker, restart=_restart_policy(args),
                       heartbeat_timeout_s=args.heartbeat_timeout_s, shared=shared)


def _restart_policy(args: argparse.Namespace) -> Any:
    from edge_infer.server.service import RestartPolicy

    return RestartPolicy(enabled=not args.no_restart, max_restarts=args.max_restarts)


def media_policy(args: argparse.Namespace) -> MediaPolicy:
    """Where the media parts of chat requests may be read from, as the operator's flags say."""
    allowed = Path(args.allowed_media_dir).resolve() if args.allowed_media_dir else None
    return MediaPolicy(allowed_dir=allowed, allow_remote=args.allow_remote_media, max_bytes=args.max_media_bytes,
                       timeout_s=args.media_timeout_s)


def speech_pipeline(args: argparse.Namespace, model: str | None) -> SpeechPipeline:
    """The speech pipeline: ``--deploy-config``'s, or the bundled one on checkpoint ``model`` (served alone, it takes
    the engine flags; beside a text model, whose flags they are, its stages keep their defaults)."""
    from edge_infer.runtime.config import load_deploy_config
    from edge_infer.runtime.config_problems import DeployConfigError
    from edge_infer.tts.deploy import EngineFlags, SpeechPipeline

    speech_only = model == args.model
    if speech_only and (args.group_size or args.asym or args.quantize_head):
        raise ValueError("--group-size, --asym and --quantize-head are text-model options; the Talker uses the defaults "
                         "of --quantization")
    if args.deploy_config:
        if args.model:
            raise ValueError("give a checkpoint directory or --deploy-config (whose stages name their model), not both")
        try:
            return SpeechPipeline.from_config(load_deploy_config(args.deploy_config, args.stage_overrides))
        except ValueError as exc:
            if isinstance(exc, DeployConfigError):
                raise
            raise ValueError(f"{exc}. serve --deploy-config serves speech pipelines; run other pipelines (such as "
                             "thinker_encoder, chat with media) through edge_infer.Omni or AsyncOmni "
                             "(docs/deploy-config.md)") from None
    flags = EngineFlags(dtype=args.dtype, max_num_seqs=args.max_num_seqs, num_threads=args.num_threads,
                        max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                        kv_cache_memory_bytes=args.kv_cache_memory_bytes, quantization=args.quantization) \
        if speech_only else None
    return SpeechPipeline.for_checkpoint(model, args.stage_overrides, flags)


def text_model_reservation(plan: TextPlan) -> Reservation:
    """A text model's steady plan as a reservation in a speech pipeline's ledger (on this machine's CPU pool)."""
    from edge_infer.memory.device import detect_machine
    from edge_infer.memory.ledger import Reservation

    pool = detect_machine().device("cpu").pool or "ram"
    return Reservation(owner=f"text model {Path(plan.model).name}", pool=pool, device="cpu", **plan.ledger_items())


def _speech_service(args: argparse.Namespace, shared: Any, pipeline: SpeechPipeline,
                    text: TextPlan | None = None) -> Any:
    """The speech model's service; beside a ``text`` model, whose steady plan its deploy plan books."""
    from edge_infer.server.speech_service import SpeechService

    beside = [] if text is None else [text_model_reservation(text)]
    name = args.served_model_name if text is None and args.served_model_name else Path(pipeline.model or "speech").name
    service = SpeechService(pipeline, _settings(args, name), args.max_input_chars, shared=shared, beside=beside,
                            restart=_restart_policy(args))
    print(service.omni.plan.render(), file=sys.stderr)
    return service


def _serve(services: list[Any], args: argparse.Namespace) -> int:
    """Run uvicorn over the app of ``services``; SIGTERM drains them."""
    import asyncio

    import uvicorn
    from tqdm import tqdm

    from edge_infer.server.app import build_app
    from edge_infer.server.connection import deadline_protocol

    class Server(uvicorn.Server):
        exit_code = 0

        def handle_exit(self, sig: int, frame) -> None:
            if not self.should_exit and loop is not None:
                for service in services:
                    loop.call_soon_threadsafe(lambda s=service: asyncio.ensure_future(s.drain()))
            super().handle_exit(sig, frame)

    def fatal(code: int, reason: str) -> None:
        print(f"error: {reason}; exiting with status {code}", file=sys.stderr)
        server.exit_code = code
        server.should_exit = True

    async def load_one(service: Any) -> None:
        bar = tqdm(desc=f"loading {service.settings.served_model_name}", unit="tensor", file=sys.stderr, disable=None,
                   leave=False)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        service.on_fatal = fatal
        try:
            await service.load(progress)
        except Exception as exc:
            fatal(EXIT_LOAD_FAILED, f"{service.settings.served_model_name} failed to load: {exc}")
            return
        finally:
            bar.close()
        if service.phase == "ready":
            print(_banner(service, args), flush=True)

    async def load() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(load_one(s) for s in services))

    loop = None
    config = uvicorn.Config(
        build_app(services, load), host=args.host, port=args.port, log_level=args.log_level, access_log=False,
        timeout_graceful_shutdown=args.shutdown_grace_s + UVICORN_GRACE_MARGIN_S,
        http=deadline_protocol(args.header_timeout_s, args.send_timeout_s, args.max_connections_per_client),
        ws="none",  # no route takes a WebSocket: an upgrade request is an ordinary one (404)
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


def _banner(service: Any, args: argparse.Namespace) -> str:
    """What is served where, and a curl line to try it."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    base = f"http://{host}:{args.port}"
    name = service.settings.served_model_name
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if service.settings.api_key else ""
    if service.kind == "speech":
        stages = " -> ".join(s.name or s.executor for s in service.pipeline.config.stages)
        what, path, extra = f"speech: {stages}; voices: {', '.join(service.voices)}", "/v1/audio/speech", " -o hello.wav"
        body = {"model": name, "input": "Hello from the edge!", "voice": service.voices[0]}
    else:
        info = service.engine.ready_info
        what = (f"loaded in {info.load_s:.1f} s: {info.dtype}, {info.weight_bytes / 2**20:,.1f} MiB weights, KV cache "
                f"{info.kv_cache_bytes / 2**20:,.1f} MiB = {info.kv_blocks} blocks, {info.num_threads} threads")
        path, extra = "/v1/chat/completions", ""
        body = {"model": name, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64}
    return "\n".join([
        f"edge-infer is serving {name!r} ({what}) at {base}/v1  (health: {base}/health, metrics: {base}/metrics)",
        "try:",
        f"  curl {base}{path} -H 'Content-Type: application/json'{auth} -d '{json.dumps(body)}'{extra}",
    ])
