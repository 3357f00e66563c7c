"""``edge-infer agent``: the phone-agent suite, one episode, or the task list.

    edge-infer agent suite --serve                      # start the demo model, run every task once
    edge-infer agent suite --base-url http://host:8000/v1 --runs 3 --json
    edge-infer agent episode add_alarm --serve -v       # one episode, every step shown
    edge-infer agent episode wifi_on --adb --base-url ...  # on a real phone
    edge-infer agent tasks

Exit status: 0 the run completed (whatever the model scored); 1 the server
could not be reached or failed during an episode; 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from dataclasses import replace

from edge_infer.engine.cli_args import add_engine_args

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
API_KEY_ENV = "EDGE_INFER_API_KEY"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 0 completed; 1 the server failed or could not be reached; 2 bad input"
    sub = parser.add_subparsers(dest="agent_command", metavar="SUBCOMMAND")
    suite = sub.add_parser("suite", help="run the task suite and report per task", description="run the task suite and report per task")
    suite.add_argument("--tasks", default=None, metavar="LIST", help="comma-separated tasks (wifi_on includes its variants; default: all)")
    suite.add_argument("--no-variants", action="store_true", help="base tasks only (no rename/reorder/decoy/chain)")
    suite.add_argument("--runs", type=int, default=1, metavar="N", help="runs of every task, interleaved (default 1)")
    suite.add_argument("--json", action="store_true", help="print the result as one JSON line (the table goes to stderr)")
    suite.add_argument("--out", default=None, metavar="FILE", help="also write the full result (every episode) as JSON")
    _common(suite)
    episode = sub.add_parser("episode", help="run one task, showing every step", description="run one task, showing every step")
    episode.add_argument("task", help="a suite task, e.g. wifi_on or wifi_on/decoy (see `edge-infer agent tasks`)")
    episode.add_argument("--prompt", default=None, help="ask this instead of the task's own words (no scoring)")
    episode.add_argument("--adb", action="store_true", help="operate a real phone over adb instead of the simulated one")
    episode.add_argument("--serial", default=None, help="with --adb: the device serial, when several are attached")
    episode.add_argument("-v", "--verbose", action="store_true", help="also print each screen and raw reply")
    _common(episode)
    sub.add_parser("tasks", help="list the suite's tasks", description="list the suite's tasks")


def _common(parser: argparse.ArgumentParser) -> None:
    from edge_infer.agent.loop import AgentConfig

    d = AgentConfig()
    g = parser.add_argument_group("server")
    g.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="an OpenAI-compatible server (default: edge-infer serve's)")
    g.add_argument("--served-model", default=None, metavar="NAME", help="the model name to send (default: the server's first)")
    g.add_argument("--api-key", default=None, help=f"bearer key (default: ${API_KEY_ENV})")
    g.add_argument("--serve", action="store_true", help="start `edge-infer serve` with the engine options below instead of using --base-url")
    g.add_argument("--wait-s", type=float, default=10.0, help="how long to wait for --base-url to answer (default 10)")
    a = parser.add_argument_group("agent")
    a.add_argument("--max-steps", type=int, default=d.max_steps, help=f"step budget (default {d.max_steps})")
    a.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"tokens per reply (default {d.max_tokens})")
    a.add_argument("--temperature", type=float, default=d.temperature, help=f"(default {d.temperature:g}: greedy)")
    a.add_argument("--retries", type=int, default=d.retries, help=f"re-asks of an empty reply (default {d.retries})")
    a.add_argument("--history", type=int, default=d.history, help=f"past actions shown each turn (default {d.history})")
    a.add_argument("--max-elements", type=int, default=d.max_elements, help=f"screen elements shown (default {d.max_elements})")
    add_engine_args(parser, default_model="the embedded text demo model, trained on this agent's turns")


def run(args: argparse.Namespace) -> int:
    from edge_infer.agent.chat import ChatError
    from edge_infer.agent.device import DeviceError

    command = getattr(args, "agent_command", None)
    if command is None:
        print("usage: edge-infer agent {suite,episode,tasks} ... (edge-infer agent SUBCOMMAND --help)", file=sys.stderr)
        return EXIT_USAGE
    if command == "tasks":
        return _list_tasks()
    try:
        tasks, config = _inputs(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _server(args) as served:
            base_url = served.base_url if served else args.base_url
            from edge_infer.agent.chat import OpenAIChat, wait_for_server

            name = wait_for_server(base_url, args.wait_s if not served else 5.0, config.api_key)
            config = replace(config, base_url=base_url, model=args.served_model or name)
            model = OpenAIChat(base_url, config.model, config.api_key, config.max_tokens, config.temperature, config.timeout_s)
            if command == "suite":
                return _suite(args, tasks, config, model, served)
            return _episode(args, tasks[0], config, model)
    except DeviceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ChatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _inputs(args: argparse.Namespace):
    from edge_infer.agent.loop import AgentConfig
    from edge_infer.agent.tasks import by_id, select

    if args.model and not args.serve:
        raise ValueError(f"a model ({args.model}) is given but not --serve; add --serve to start it, or drop it to use --base-url")
    for flag in ("max_steps", "max_tokens", "history", "max_elements") + (("runs",) if args.agent_command == "suite" else ()):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.retries < 0 or args.temperature < 0:
        raise ValueError("--retries and --temperature must not be negative")
    if args.agent_command == "suite":
        names = [n.strip() for n in args.tasks.split(",") if n.strip()] if args.tasks else None
        tasks = select(names, variants=not args.no_variants)
    else:
        tasks = [by_id(args.task)]
        if args.adb and tasks[0].simulator_only and args.prompt is None:
            raise ValueError(f"{tasks[0].id} is judged on the simulator's toggle history; a real phone cannot be scored on it")
    config = AgentConfig(
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or "unused", max_steps=args.max_steps,
        max_tokens=args.max_tokens, temperature=args.temperature, retries=args.retries, history=args.history,
        max_elements=args.max_elements,
    )
    return tasks, config


def _server(args: argparse.Namespace):
    if not args.serve:
        return nullcontext(None)
    from edge_infer.agent.serve import ServedModel
    from edge_infer.bench.measures.serve import server_command
    from edge_infer.models.checkpoint import demo_model_dir

    # The text demo was trained on the phone agent's turns; the vision demo (serve's default) was not.
    args.model = args.model or str(demo_model_dir())
    print(f"starting edge-infer serve {args.model} ...", file=sys.stderr, flush=True)
    return ServedModel(lambda port: server_command(args, port))


def _suite(args, tasks, config, model, served) -> int:
    from edge_infer.agent import suite
    from edge_infer.agent.serve import server_rates

    def progress(run: int, o) -> None:
        verdict = "PASS" if o.success else "fail"
        extra = " false claim" if o.false_claim else ""
        extra += f" collateral: {'; '.join(o.collateral)}" if o.collateral else ""
        print(f"  run {run} {o.task}: {verdict} ({o.stop_reason}, {o.steps} steps, {o.wall_s:.1f} s){extra}",
              file=sys.stderr, flush=True)

    outcomes = suite.run_suite(tasks, config, args.runs, model, progress)
    rates = server_rates(config.base_url.removesuffix("/").removesuffix("/v1"))
    print(suite.table(suite.report(outcomes)), file=sys.stderr if args.json else sys.stdout)
    result = {**suite.metrics(outcomes), **rates, "runs": args.runs, "model": config.model,
              "server": served.banner if served else config.base_url, "by_task": suite.as_json(outcomes)["tasks"]}
    if args.json:
        print(json.dumps(result))
    else:
        shown = ", ".join(f"{k} {v}" for k, v in rates.items())
        print(f"\noverall pass rate {result['pass_rate']:.0%} over {len(outcomes)} episodes" + (f"; {shown}" if shown else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, **suite.as_json(outcomes)}, f, indent=1)
    return EXIT_FAILED if any(o.error for o in outcomes) else EXIT_OK


def _episode(args, task, config, model) -> int:
    from edge_infer.agent.device import AdbDevice
    from edge_infer.agent.loop import run_episode
    from edge_infer.agent.state import read_state
    from edge_infer.agent.tasks import score

    device = AdbDevice(args.serial) if args.adb else task.device()
    before = read_state(device) if args.prompt is None else None
    episode = run_episode(device, args.prompt or task.prompt, config, model)
    print(f"task: {episode.task}")
    for i, step in enumerate(episode.steps, 1):
        if args.verbose:
            print(f"--- step {i} screen:\n{step.screen}\n--- reply: {step.reply!r}")
        for note in step.notes:
            print(f"  note: {note}")
        call = f"{step.result.action} [{step.call.source}]" if step.result else f"no action [{step.call.source if step.call else 'no reply'}]"
        result = f" -> {step.result.message}" if step.result else ""
        print(f"step {i}: {call}{result}")
    print(f"stopped: {episode.stop_reason}" + (f" ({episode.error})" if episode.error else "")
          + f"; declared done: {episode.declared_done}; {episode.prompt_tokens + episode.completion_tokens} tokens, {episode.wall_s:.1f} s")
    if before is not None:
        outcome = score(task, episode, before, read_state(device))
        damage = "; ".join(outcome.collateral) or "none"
        print(f"goal reached: {outcome.goal_reached}; collateral: {damage}; false claim: {outcome.false_claim}; "
              f"success: {outcome.success}")
    return EXIT_FAILED if episode.error else EXIT_OK


def _list_tasks() -> int:
    from edge_infer.agent.tasks import SUITE

    width = max(len(t.id) for t in SUITE)
    for task in SUITE:
        print(f"{task.id.ljust(width)}  {task.prompt}" + ("  (simulator only)" if task.simulator_only else ""))
    return EXIT_OK
