#!/usr/bin/env bash
# The main job on the bundled model: installs and builds, then profiles
# data/example.pt, solves for a budget, runs a real training step under the
# plan, and writes the report. Outputs go to out/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
CKPLAN=${CKPLAN_BUILD_DIR:-build}/ckplan
PYTHON=.venv/bin/python  # the project's environment (a fresh machine may have no python3)
mkdir -p out
echo "== ckplan profile"
"$CKPLAN" profile data/example.pt --input 8x3x32x32 -o out/profile.json
echo
echo "== ckplan solve (halfway between the smallest feasible budget and no checkpointing)"
minimum=$("$CKPLAN" solve out/profile.json --budget 1TB --optimizer adam -o - 2>/dev/null |
          "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["min_budget_bytes"])')
none=$("$CKPLAN" solve out/profile.json --budget 1TB --algo none -o - 2>/dev/null |
       "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["predicted"]["peak_bytes"])')
budget=$(( (minimum + none) / 2 ))
"$CKPLAN" solve out/profile.json --budget "$budget" -o out/plan.json
echo
echo "== ckplan run (the PyTorch-target plan, run as PyTorch runs it: its modules recomputed as torch.utils.checkpoint does)"
"$CKPLAN" run data/example.pt --plan out/plan.json -o out/run_pytorch.json
echo
echo "== ckplan solve --target schedule (the schedule ckplan run executes, checked next)"
"$CKPLAN" solve out/profile.json --budget "$budget" --target schedule -o out/schedule.plan.json
echo
echo "== ckplan run (a real training step under the schedule plan, and without checkpointing)"
"$CKPLAN" run data/example.pt --plan out/schedule.plan.json -o out/run.json
echo
echo "== ckplan report"
"$CKPLAN" report out/profile.json --budget "$budget" --runs out/run.json -o out/report.html
echo
echo "report: $(pwd)/out/report.html"
