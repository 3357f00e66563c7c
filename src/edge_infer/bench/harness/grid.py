"""`edge-infer bench grid`: run arms for several rotated passes and summarise them.

Order of a run: take the host lock, check that the target cores are idle,
then for each pass run every arm once (pass p starts at arm (p-1) mod n),
re-checking the cores between passes. Then summarise, flag, gate against
expectations and write the result with its provenance.

Exit status: 0 all passes succeeded and every check is within its band;
1 a pass failed or a check failed; 2 bad input; 3 refused to start (cores
busy or host lock held).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from edge_infer.bench.harness import analysis, checks, preflight, provenance, render, stats
from edge_infer.bench.harness.hostlock import HostLock, LockHeld, default_lock_path
from edge_infer.bench.harness.results import (
    FAILING_CHECKS, GridProvenance, GridResult, GridSettings, LoadSample, Observation, save_result,
)
from edge_infer.bench.harness.runner import PassContext, run_arm
from edge_infer.bench.harness.spec import GridSpec, SpecError, load_spec
from edge_infer.hardware.cpu import MASK_ENV, detect, mask_features

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 0 all passes ok and checks passed; 1 a pass or a check failed; 2 bad input; 3 refused (cores busy or host lock held)"
    parser.add_argument("--spec", type=Path, required=True, metavar="FILE", help="JSON file: {\"arms\": [{\"tag\", \"command\", \"env\"}], \"cores\", \"metric\"}")
    parser.add_argument("--passes", type=int, default=3, metavar="N", help="passes per arm (default 3; fewer is flagged)")
    parser.add_argument("--metric", metavar="NAME", help="headline metric for the ranking (default: the spec's, else the first key)")
    parser.add_argument("--keys", metavar="LIST", help="comma-separated metrics to keep; each is required in every arm's output")
    parser.add_argument("--direction", action="append", default=[], metavar="METRIC=max|min",
                        help="override the direction inferred from a metric's name (repeatable)")
    parser.add_argument("--cores", metavar="LIST", help="cores to pin arms to, e.g. 0-1 (default: the spec's, else this process's affinity)")
    parser.add_argument("--allow-busy", action="store_true", help="run even when the target cores are busy; passes are labelled as under load")
    parser.add_argument("--max-stolen-pct", type=float, default=5.0, metavar="PCT", help="refuse when the target cores' mean utilisation exceeds this (default 5)")
    parser.add_argument("--max-core-busy-pct", type=float, default=50.0, metavar="PCT", help="refuse when any target core's utilisation exceeds this (default 50)")
    parser.add_argument("--preflight-window-s", type=float, default=0.75, metavar="S", help="length of each of the two load windows (default 0.75)")
    parser.add_argument("--no-lock", action="store_true", help="skip the host lock (only for runs on cores no other benchmark uses)")
    parser.add_argument("--wait-lock", action="store_true", help="wait for the host lock instead of refusing when it is held")
    parser.add_argument("--settle-s", type=float, default=2.0, metavar="S", help="pause between arms (default 2)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds one arm pass may run (default 1800)")
    parser.add_argument("--noise-threshold", type=float, default=8.0, metavar="PCT", help="flag NOISY above this spread in percent (default 8)")
    parser.add_argument("--check", type=Path, metavar="EXPECTATIONS", help="gate medians against an expectations JSON")
    parser.add_argument("--write-expectations", type=Path, metavar="FILE", help="write expectations (medians, bands from spread) from this run")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the full result JSON here")


def rotation(n_arms: int, pass_index: int) -> list[int]:
    """Arm indices for 1-based pass `pass_index`: starts at (pass_index - 1) mod n."""
    start = (pass_index - 1) % n_arms
    return [(start + i) % n_arms for i in range(n_arms)]


def _fail(message: str, code: int) -> int:
    print(f"edge-infer bench grid: {message}", file=sys.stderr)
    return code


def _progress(obs: Observation, headline: str | None) -> None:
    if obs.status == "ok":
        shown = headline if headline in obs.metrics else next(iter(obs.metrics), None)
        value = f" {shown}={obs.metrics[shown]:.6g}" if shown else ""
        detail = f"ok{value}"
    else:
        detail = f"{obs.status.upper()}: {obs.error}"
    load = " [under load]" if obs.under_load else ""
    print(f"  pass {obs.pass_index} #{obs.position} {obs.arm}: {detail} ({obs.wall_s:.1f} s){load}", file=sys.stderr, flush=True)


def _run_passes(spec: GridSpec, settings: GridSettings, preflight_load: LoadSample) -> tuple[list[Observation], list[LoadSample]]:
    """Every pass of every arm, in rotated order; each pass labelled by the load check before it."""
    required = settings.keys or ([settings.headline_metric] if settings.headline_metric else [])
    observations: list[Observation] = []
    load, loads = preflight_load, [preflight_load]
    for p in range(1, settings.passes + 1):
        if p > 1:
            load = preflight.check_cores(
                settings.cores, settings.preflight_window_s, settings.max_stolen_pct, settings.max_core_busy_pct, f"before pass {p}",
            )
            loads.append(load)
            if load.busy:
                print(f"pass {p}: target cores busy ({load.reason}); its passes are labelled as under load", file=sys.stderr)
        for position, index in enumerate(rotation(len(spec.arms), p), start=1):
            if observations and settings.settle_s > 0:
                time.sleep(settings.settle_s)
            obs = run_arm(
                spec.arms[index], PassContext(p, position, load.busy), settings.cores,
                settings.timeout_s, required, settings.keys or None,
            )
            observations.append(obs)
            _progress(obs, settings.headline_metric)
    return observations, loads


def _settings(args: argparse.Namespace, spec: GridSpec) -> GridSettings:
    """Resolve flags against the spec; ValueError names the bad one."""
    if args.passes < 1:
        raise ValueError("--passes must be at least 1")
    allowed = sorted(os.sched_getaffinity(0))
    cores_text = args.cores or spec.cores
    cores = preflight.parse_cores(cores_text) if cores_text else allowed
    outside = [c for c in cores if c not in allowed]
    if outside:
        raise ValueError(f"cores {outside} are not available to this process (allowed: {allowed}); pick --cores among them")
    _refuse_unhonoured_masks(spec)
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else []
    headline = args.metric or spec.metric or (keys[0] if keys else None)
    if headline and keys and headline not in keys:
        keys.append(headline)
    return GridSettings(
        spec_path=str(args.spec), spec_sha256=spec.sha256, passes=args.passes, cores=cores,
        headline_metric=headline, keys=keys,
        directions={**spec.directions, **stats.parse_direction_overrides(args.direction)},
        noise_threshold_pct=args.noise_threshold, max_stolen_pct=args.max_stolen_pct,
        max_core_busy_pct=args.max_core_busy_pct, preflight_window_s=args.preflight_window_s,
        allow_busy=args.allow_busy, lock=None if args.no_lock else str(default_lock_path()),
        settle_s=args.settle_s, timeout_s=args.timeout,
    )


def _refuse_unhonoured_masks(spec: GridSpec) -> None:
    """A mask can only take features away: an arm masked to a level this CPU lacks would measure a lower one."""
    cpu = detect()
    for arm in spec.arms:
        mask = str(arm.env.get(MASK_ENV, "")).strip()
        lacking = sorted(mask_features(mask, cpu.arch) - cpu.features) if mask else []
        if lacking:
            raise ValueError(
                f"arm {arm.tag!r} runs as {MASK_ENV}={mask}, but this CPU lacks {', '.join(lacking)}: it would measure "
                "a lower ISA level under that arm's name; run this spec on a CPU that has it"
            )


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
        settings = _settings(args, spec)
        expectations = checks.load_expectations(args.check) if args.check else None
    except (SpecError, checks.ExpectationsError, ValueError) as exc:
        return _fail(str(exc), EXIT_USAGE)

    lock = HostLock(Path(settings.lock), wait=args.wait_lock) if settings.lock else None
    try:
        if lock:
            lock.acquire()
    except LockHeld as exc:
        return _fail(str(exc), EXIT_REFUSED)
    try:
        stamp = provenance.collect(settings.cores)
        first = preflight.check_cores(
            settings.cores, settings.preflight_window_s, settings.max_stolen_pct, settings.max_core_busy_pct, "preflight",
        )
        if first.busy and not settings.allow_busy:
            return _fail(
                f"refusing to run: target cores {settings.cores} are busy: {first.reason}. "
                "Wait for the load to go away, choose idle --cores, or pass --allow-busy to run and label every pass as under load.",
                EXIT_REFUSED,
            )
        if first.busy:
            print(f"target cores busy ({first.reason}); running anyway (--allow-busy), passes labelled as under load", file=sys.stderr)
        observations, loads = _run_passes(spec, settings, first)
    finally:
        if lock:
            lock.release()

    stamp.finished_at = provenance.now_utc()
    result = assemble(spec, settings, observations, loads, GridProvenance(**stamp.model_dump(), arms=spec.arms))
    if expectations:
        result.checks = checks.run_checks(result, expectations)
    print(render.grid_text(result))

    if args.write_expectations:
        derived, skipped = checks.derive_expectations(result)
        checks.write_expectations(derived, args.write_expectations)
        print(f"\nexpectations written to {args.write_expectations}")
        if skipped:
            print(f"  skipped (fewer than 2 passes or zero median): {', '.join(skipped)}")
    if args.out:
        save_result(result, args.out)
        print(f"result written to {args.out}")

    regressions = [c for c in result.checks if c.status in FAILING_CHECKS]
    failed = [o for o in result.observations if o.status != "ok"]
    if regressions:
        print(f"\nFAILED: {len(regressions)} check(s) outside their band or without a result: "
              + ", ".join(f"{c.arm}/{c.metric} {c.status}" for c in regressions))
    if failed:
        print(f"\nFAILED: {len(failed)} pass(es) did not succeed (see the list above)")
    return EXIT_FAILED if regressions or failed else EXIT_OK


def assemble(
    spec: GridSpec, settings: GridSettings, observations: list[Observation], loads: list[LoadSample], stamp: GridProvenance,
) -> GridResult:
    tags = [a.tag for a in spec.arms]
    if settings.headline_metric is None:
        # No metric named anywhere: the first numeric key the arms printed.
        first_ok = next((o for o in observations if o.status == "ok" and o.metrics), None)
        settings = settings.model_copy(update={"headline_metric": next(iter(first_ok.metrics)) if first_ok else None})
    metrics = analysis.metric_names(observations, settings.keys)
    rows = analysis.summarize(observations, tags, metrics, settings.directions)
    arms = analysis.arm_statuses(observations, tags)
    ranking_text, ranking_flag = analysis.ranking(rows, settings.headline_metric)
    flags = analysis.flags_for(observations, arms, rows, settings.passes, settings.noise_threshold_pct)
    if ranking_flag:
        flags.append(ranking_flag)
    return GridResult(
        settings=settings, observations=observations, arms=arms, summary=rows, ranking=ranking_text,
        flags=flags, checks=[], load=loads, provenance=stamp,
    )
