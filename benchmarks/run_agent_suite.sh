#!/usr/bin/env bash
# The agent suite over builds of the demo model, in one grid.
#
#   benchmarks/run_agent_suite.sh [grid options, e.g. --cores 0-1 --passes 3]
#
# Runs benchmarks/specs/agent-demo.json into benchmarks/results/agent-demo.json:
# fp32, bf16, cpu_int4 (W4A16 g128) and cpu_w4a8 (W4A8 g128) of the shipped
# demo model, each arm serving its build and playing every task and variant
# greedily (docs/agent.md). On a CPU where cpu_w4a8 cannot run (missing_requirement)
# the W4A8 arm is left out of the grid, with the reason printed, instead of being
# recorded as a failed pass. Run it on quiet cores from a clean tree.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${EDGE_INFER:-}" ]; then
  if [ -x .venv/bin/edge-infer ]; then EDGE_INFER=.venv/bin/edge-infer; else EDGE_INFER=edge-infer; fi
fi
export EDGE_INFER  # the spec's arms run "${EDGE_INFER:-edge-infer} agent suite ..."
PYTHON=$(dirname "$(command -v "$EDGE_INFER")")/python; [ -x "$PYTHON" ] || PYTHON=python

spec=benchmarks/specs/agent-demo.json
reason=$("$PYTHON" -c 'from edge_infer.quant.w4a8 import missing_requirement; print(missing_requirement() or "")')
if [ -n "$reason" ]; then
  echo "leaving out the w4a8-g128 arm: $reason" >&2
  spec=$(mktemp --suffix=-agent-demo.json)
  trap 'rm -f "$spec"' EXIT
  "$PYTHON" -c 'import json, sys
s = json.load(open(sys.argv[1]))
s["arms"] = [a for a in s["arms"] if "cpu_w4a8" not in a["command"]]
json.dump(s, open(sys.argv[2], "w"), indent=2)' benchmarks/specs/agent-demo.json "$spec"
fi
mkdir -p benchmarks/results
"$EDGE_INFER" bench grid --spec "$spec" --out benchmarks/results/agent-demo.json "$@"
