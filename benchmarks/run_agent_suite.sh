#!/usr/bin/env bash
# The agent suite over builds of the demo model, in one grid.
#
#   benchmarks/run_agent_suite.sh [grid options, e.g. --cores 0-1 --passes 3]
#
# Runs benchmarks/specs/agent-demo.json into benchmarks/results/agent-demo.json:
# fp32, bf16, cpu_int4 (W4A16 g128), cpu_w4a8 (W4A8 g128) and cpu_w8a8 (W8A8 g128) of the shipped
# demo model, each arm serving its build and playing every task and variant
# three times, sampled at temperature 0.7 (the model's own default), so a
# pass rate is a rate over runs and not one greedy path (docs/agent.md).
# On a CPU where an int8 kernel cannot run (missing_requirement) its arm is
# left out of the grid, with the reason printed, instead of being recorded
# as a failed pass. Run it on quiet cores from a clean tree.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${EDGE_INFER:-}" ]; then
  if [ -x .venv/bin/edge-infer ]; then EDGE_INFER=.venv/bin/edge-infer; else EDGE_INFER=edge-infer; fi
fi
export EDGE_INFER  # the spec's arms run "${EDGE_INFER:-edge-infer} agent suite ..."
PYTHON=$(dirname "$(command -v "$EDGE_INFER")")/python; [ -x "$PYTHON" ] || PYTHON=python

spec=$(mktemp --suffix=-agent-demo.json)
trap 'rm -f "$spec"' EXIT
# The int8-kernel arms this CPU cannot run are left out, each with its reason.
"$PYTHON" - benchmarks/specs/agent-demo.json "$spec" <<'PY'
import json, sys
from edge_infer.quant.native import missing_requirement
spec = json.load(open(sys.argv[1]))
kept = []
for arm in spec["arms"]:
    kernel = next((k for k in ("cpu_w4a8", "cpu_w8a8") if k in arm["command"]), None)
    reason = kernel and missing_requirement(kernel.replace("_", "-"))
    if reason:
        print(f"leaving out the {arm['tag']} arm: {reason}", file=sys.stderr)
    else:
        kept.append(arm)
json.dump({**spec, "arms": kept}, open(sys.argv[2], "w"), indent=2)
PY
mkdir -p benchmarks/results
"$EDGE_INFER" bench grid --spec "$spec" --out benchmarks/results/agent-demo.json "$@"
