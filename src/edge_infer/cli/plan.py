"""``edge-infer plan``: the memory plan, before anything is loaded."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edge_infer.engine.cli_args import add_engine_args, engine_settings
from edge_infer.server.limits import DEFAULT_MAX_BODY_BYTES


def configure(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    parser.add_argument("--deploy-config", default=None, help="plan a multi-stage deploy config instead of one text model")
    parser.add_argument("--profile", default=None, help="device profile (a bundled name such as laptop, or a file) for --deploy-config")
    parser.add_argument("--stage-overrides", default=None, help='per-stage overrides as JSON, e.g. \'{"1": {"device": "igpu"}}\'')
    parser.add_argument("--available-bytes", type=int, default=None, help="plan against this much memory instead of MemAvailable")
    parser.add_argument("--cpu", default=None, metavar="PROFILE",
                        help="plan for another CPU (edge-infer doctor --help lists the profiles), not this one")
    parser.add_argument("--server", action="store_true",
                        help="plan as `edge-infer serve` runs it: the server's process and its request bodies in flight "
                             "(default: as the library, LLM or LocalTextEngine, runs it)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"with --server: the serve flag of that name (default {DEFAULT_MAX_BODY_BYTES >> 20} MiB)")
    parser.add_argument("--max-body-bytes-in-flight", type=int, default=None,
                        help="with --server: the serve flag of that name (default, as there: twice --max-body-bytes)")
    parser.add_argument("--speech", default=None, metavar="DIR",
                        help="plan as `serve MODEL --speech DIR` runs: the speech stages first, the text model (served) "
                             "in what they leave, then both in one ledger")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace) -> int:
    if args.max_body_bytes_in_flight is None:
        args.max_body_bytes_in_flight = 2 * args.max_body_bytes  # serve's rule
    if args.deploy_config:
        from edge_infer.cli.plan_deploy import run_deploy_plan

        return run_deploy_plan(args)
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.errors import EdgeInferError
    from edge_infer.hardware.cpu import profile
    from edge_infer.memory.plan import plan_text_session

    try:
        cpu = profile(args.cpu) if args.cpu else None
        if args.speech:
            return _plan_beside_speech(args, cpu)
        served = dict(frontend="server", body_bytes_in_flight=args.max_body_bytes_in_flight) if args.server else {}
        plan = plan_text_session(resolve_model(args.model), available_bytes=args.available_bytes, cpu=cpu,
                                 **served, **engine_settings(args))
    except (EdgeInferError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.table())
    return 0 if plan.admitted else 1


def _plan_beside_speech(args: argparse.Namespace, cpu: Any) -> int:
    """serve's planning of a text model beside a speech one (cli/serve.py): the speech stages alone, the text
    model in the rest, then the speech plan booking the text model's."""
    from edge_infer.cli.plan_deploy import with_available
    from edge_infer.cli.serve import speech_pipeline, text_model_reservation
    from edge_infer.engine.frontend import resolve_model
    from edge_infer.hardware.memory import available_memory_bytes
    from edge_infer.memory.device import machine_profile
    from edge_infer.memory.plan import plan_text_session
    from edge_infer.runtime.deploy_plan import plan_deploy

    pipeline = speech_pipeline(args, args.speech)
    machine = machine_profile(None)
    if args.available_bytes is not None:
        machine = with_available(machine, args.available_bytes)
    free = available_memory_bytes() if args.available_bytes is None else args.available_bytes
    speech_bytes = plan_deploy(pipeline.config, machine).stages_bytes
    text = plan_text_session(resolve_model(args.model), available_bytes=max(0, free - speech_bytes), cpu=cpu,
                             frontend="server", body_bytes_in_flight=args.max_body_bytes_in_flight,
                             **engine_settings(args))
    both = plan_deploy(pipeline.config, machine, beside=[text_model_reservation(text)]) if text.admitted else None
    if args.json:
        print(json.dumps({"text": text.to_dict(), "speech": both.to_dict() if both else None}, indent=2))
    else:
        print(text.table())
        print(f"(the text model is planned in what the speech stages leave: {speech_bytes / 2**20:,.1f} MiB of "
              f"{free / 2**20:,.1f} MiB)")
        if both is not None:
            print(both.render())
    return 0 if both is not None and both.admitted else 1
