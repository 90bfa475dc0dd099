#!/usr/bin/env bash
# The executor's table for docs/measurements.md: on the test models, the optimal plan
# (--target schedule: the nested schedule ckplan run executes; the default for
# a profile, pytorch, counts memory as PyTorch's checkpoint wrappers hold it) at
# the budget halfway between the smallest feasible one and no checkpointing,
# and the every baseline; predicted against measured peak and step (adam), and the
# predicted overhead less the measured one, in percentage points.
#   bash bench/run_table.sh [BUILD_DIR]     (after scripts/test.sh built the test models)
set -euo pipefail
PY=${CKPLAN_PYTHON:-.venv/bin/python3}
BUILD=${1:-build}
CK=$BUILD/ckplan
M=$BUILD/test_models
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
printf "| model | plan | budget | predicted peak | measured peak | error | predicted step | measured step | baseline step | overhead error | verdict |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
for m in ${MODELS:-mlp_chain resnet18 mobilenet_v3_small gpt unet sdpa_decoder bf16_decoder gpt2 llama}; do
  inp=$("$PY" -c "import json;print(' '.join('--input '+t for t in json.load(open('$M/$m.json'))['inputs']))")
  $CK profile $M/$m.pt $inp -o $T/rt_$m.prof.json > /dev/null
  min=$($CK solve $T/rt_$m.prof.json --target schedule --budget 1TB -o - 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["min_budget_bytes"])')
  none=$($CK solve $T/rt_$m.prof.json --target schedule --budget 1TB --algo none -o - 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["predicted"]["peak_bytes"])')
  half=$(( (min + none) / 2 ))
  for spec in "optimal $half" "every 1TB"; do
    set -- $spec
    $CK solve $T/rt_$m.prof.json --target schedule --budget $2 --algo $1 -o $T/rt_$m.$1.plan.json > /dev/null
    $CK run $M/$m.pt --plan $T/rt_$m.$1.plan.json --steps 7 -o $T/rt_$m.$1.run.json > /dev/null || true  # the verdict is in the table
    "$PY" - "$m" "$1" $T/rt_$m.$1.run.json <<'PY'
import json,sys
r=json.load(open(sys.argv[3])); M=1024*1024
b = "-" if r["budget_bytes"] >= 1e12 else "%.2f MiB" % (r['budget_bytes']/M)
print("| %s | %s | %s | %.2f MiB | %.2f MiB | %+.1f%% | %.1f ms (%+.1f%%) | %.1f ms (%+.1f%%) | %.1f ms | %+.1f pp | %s |" % (
  sys.argv[1], sys.argv[2], b, r['predicted']['peak_bytes']/M, r['measured']['peak_bytes']/M, r['peak_error_pct'],
  r['predicted']['time_ms'], r['predicted']['overhead_pct'], r['measured']['step_ms'], r['measured_overhead_pct'], r['baseline']['step_ms'],
  r['predicted']['overhead_pct'] - r['measured_overhead_pct'], r['verdict']))
PY
  done
done
