"""``edge-infer serve`` for a speech model: a Qwen3-TTS checkpoint (or ``--deploy-config``) behind the speech API.

The engine flags map onto the two stages: ``--dtype``, ``--max-num-seqs``
and ``--num-threads`` onto both, ``--max-model-len``,
``--max-num-batched-tokens``, ``--kv-cache-memory-bytes`` and
``--quantization`` onto the Talker; ``--stage-overrides`` comes last. The
deploy plan (every stage's reservation in the shared-RAM ledger) is checked
before any stage process starts; a plan that does not fit exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_infer.tts.deploy import EngineFlags


def engine_flags(args: argparse.Namespace) -> "EngineFlags":
    from edge_infer.tts.deploy import EngineFlags

    return EngineFlags(dtype=args.dtype, max_num_seqs=args.max_num_seqs, num_threads=args.num_threads,
                       max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
                       kv_cache_memory_bytes=args.kv_cache_memory_bytes, quantization=args.quantization)


def serve_speech(args: argparse.Namespace, serve: Any) -> int:
    from edge_infer.runtime.config import DeployConfigError, load_deploy_config
    from edge_infer.runtime.omni import DeployRefused
    from edge_infer.server.speech_app import build_speech_app
    from edge_infer.server.speech_state import SpeechServerState
    from edge_infer.server.cli import API_KEY_ENV
    from edge_infer.server.lifecycle import ServeSettings
    from edge_infer.tts.deploy import SpeechPipeline

    if args.group_size or args.asym or args.quantize_head:
        print("error: --group-size, --asym and --quantize-head are text-model options; the Talker uses the defaults of --quantization",
              file=sys.stderr)
        return 2
    try:
        if args.deploy_config:
            if args.model:
                print("error: give a checkpoint directory or --deploy-config (whose stages name their model), not both",
                      file=sys.stderr)
                return 2
            pipeline = SpeechPipeline.from_config(load_deploy_config(args.deploy_config, args.stage_overrides))
        else:
            pipeline = SpeechPipeline.for_checkpoint(args.model, args.stage_overrides, engine_flags(args))
        settings = ServeSettings(
            served_model_name=args.served_model_name or Path(pipeline.model or "speech").name,
            api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
            max_queue=args.max_queue, shutdown_grace_s=args.shutdown_grace_s,
        )
        state = SpeechServerState(pipeline, settings, args.max_input_chars)
    except DeployRefused as exc:
        print(exc.plan.render(), file=sys.stderr)
        print("error: the pipeline does not fit; lower a stage's reservation (nothing was started)", file=sys.stderr)
        return 1
    except (DeployConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(state.omni.plan.render(), file=sys.stderr)
    return serve(state, args, build_speech_app, banner)


def banner(state: Any, args: argparse.Namespace) -> str:
    from edge_infer.server.cli import API_KEY_ENV

    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    base = f"http://{host}:{args.port}"
    name = state.settings.served_model_name
    stages = " -> ".join(s.name or s.executor for s in state.pipeline.config.stages)
    body = json.dumps({"model": name, "input": "Hello from the edge!", "voice": state.voices[0]})
    auth = f' -H "Authorization: Bearer ${API_KEY_ENV}"' if state.settings.api_key else ""
    return "\n".join([
        f"edge-infer is serving {name!r} (speech: {stages}) at {base}/v1  (health: {base}/health, metrics: {base}/metrics)",
        f"voices: {', '.join(state.voices)}",
        "try:",
        f"  curl {base}/v1/audio/speech -H 'Content-Type: application/json'{auth} -d '{body}' -o hello.wav",
    ])
