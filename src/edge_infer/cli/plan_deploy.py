"""``edge-infer plan --deploy-config FILE``: the shared-RAM plan of a multi-stage deploy.

Exit status: 0 admitted, 1 refused (with the reasons), 2 the config or the
profile could not be read.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from edge_infer.memory.device import MachineProfile, machine_profile
from edge_infer.runtime.config import DeployConfigError, load_deploy_config
from edge_infer.runtime.deploy_plan import plan_deploy


def with_available(profile: MachineProfile, available_bytes: int) -> MachineProfile:
    """Plan against a given amount of free memory in every pool (``--available-bytes``)."""
    pools = tuple(
        dataclasses.replace(p, available_bytes=available_bytes, total_bytes=max(p.total_bytes, available_bytes), source=f"--available-bytes {available_bytes}")
        for p in profile.pools
    )
    return dataclasses.replace(profile, pools=pools)


def run_deploy_plan(args: argparse.Namespace) -> int:
    try:
        config = load_deploy_config(args.deploy_config, getattr(args, "stage_overrides", None))
        profile = machine_profile(getattr(args, "profile", None))
    except (DeployConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    available = getattr(args, "available_bytes", None)
    if available is not None:
        profile = with_available(profile, available)
    served = getattr(args, "server", False)
    plan = plan_deploy(config, profile, args.max_body_bytes_in_flight if served else 0)
    print(json.dumps(plan.to_dict(), indent=2) if getattr(args, "json", False) else plan.render())
    return 0 if plan.admitted else 1
