#!/usr/bin/env bash
# ckplan on a CUDA GPU, unattended, in under 8 minutes: builds ckplan, runs the
# tests that exercise CUDA, then for a GPT-2-small-shaped decoder (12 blocks,
# d_model 768, 12 heads, sequence 1024, batch 8, bf16, SDPA) and torchvision
# resnet50 (batch 64, 3x224x224, weights=None), and the fine-tuning and mixed-precision
# jobs (the decoder with 6 blocks and fp32 weights under torch.autocast bf16, and the
# same frozen with peft's LoRA adapters trained: gpt2_autocast, gpt2_lora):
#   profile --device cuda; solve at the budget halfway between the `every`
#   baseline's peak and no checkpointing (the strategy table's rows, as the
#   PyTorch target counts them); run --device cuda (verdict, peaks, steps); the
#   plan applied to the eager model with ckplan_torch.apply_plan and real AdamW
#   steps (torch.cuda.max_memory_allocated against the budget and prediction);
#   ckplan's per-op kernel times (CUPTI, or CUDA events where CUPTI cannot
#   start: the profile's environment.timer) against Kineto's kernel times and
#   CUDA events around the step; and profile --device meta --gpu h200 against
#   the measured figures.
# Writes one Markdown table to stdout and to --out FILE, else $OUT/gpu_check.md
# when $OUT is set, else out/gpu_check/gpu_check.md. Every step runs under its
# own `timeout`, capped by what is left of --limit (default 470 s); a failed
# step is a row of the table and the script goes on.
#
#   bash bench/gpu_check.sh [--out FILE] [--limit SECONDS] [--models "gpt2 resnet50 gpt2_autocast gpt2_lora"] [--setup] [--no-build]
#   bash bench/gpu_check.sh --cpu-dry-run     # the same steps on the CPU, tiny shapes (batch 2, seq 64,
#                                             # 2 blocks of width 128; resnet50 at 2x3x32x32)
#
# Exit 0 when every step ran, 1 when one failed or ran out of time, 2 when
# there is no GPU (nvidia-smi missing, or torch.cuda.is_available() false),
# said in one line before anything heavy.
#
# The build: cmake directly on the build folder with the machine's torch
# (CKPLAN_PYTHON, else .venv/bin/python3, else python3): scripts/setup.sh makes
# its own environment from python/requirements.lock (2.9 GB of wheels), which a
# GPU machine without network cannot download; --setup runs it first anyway.
# Debian packages the build needs (setup.sh's list) are checked first; missing
# ones are installed with apt-get when root, else named in one line.
# --no-build takes the build folder's binaries as they are (none built: the
# steps that need them are reported as not run).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD

DRY=0
LIMIT=470
OUT_FILE=""
MODELS="gpt2 resnet50 gpt2_autocast gpt2_lora"
RUN_SETUP=0
NO_BUILD=0
while (($#)); do
  case $1 in
    --cpu-dry-run) DRY=1 ;;
    --out) OUT_FILE=$2; shift ;;
    --out=*) OUT_FILE=${1#--out=} ;;
    --limit) LIMIT=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --setup) RUN_SETUP=1 ;;
    --no-build) NO_BUILD=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
START=$(date +%s)
DEADLINE=$((START + LIMIT))
RESERVE=15  # for the table at the end

say() { echo "gpu_check: [$(($(date +%s) - START)) s] $*" >&2; }

# ---- a GPU, and a Python with torch: one line and exit 2 when not -------------
if ((DRY == 0)); then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no GPU here (nvidia-smi not found); run it on a CUDA machine, or try --cpu-dry-run"
    exit 2
  fi
  if ! timeout 30 nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no GPU here (nvidia-smi -L fails); run it on a CUDA machine, or try --cpu-dry-run"
    exit 2
  fi
fi
PY=""
for candidate in "${CKPLAN_PYTHON:-}" "$ROOT/.venv/bin/python3" python3; do
  if [[ -z "$candidate" ]] || ! command -v "$candidate" >/dev/null 2>&1; then continue; fi
  if timeout 120 "$candidate" -c 'import torch' >/dev/null 2>&1; then
    PY=$(command -v "$candidate")
    break
  fi
done
if [[ -z "$PY" ]]; then
  echo "gpu_check: no python3 with torch (tried \$CKPLAN_PYTHON, .venv/bin/python3, python3)"
  exit 2
fi
if ((DRY == 0)) && ! timeout 120 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "gpu_check: no usable GPU here (torch.cuda.is_available() is false in $PY); try --cpu-dry-run"
  exit 2
fi

# ---- where things go ---------------------------------------------------------
if ((DRY)); then
  DEVICE=cpu; DRY_FLAG=--dry; MODE="CPU dry run (--device cpu, tiny shapes)"; JOBS=2
else
  DEVICE=cuda; DRY_FLAG=""; MODE="GPU (--device cuda)"; JOBS=$(nproc)
fi
if [[ -n "${OUT:-}" ]]; then W=$OUT/gpu_check; else W=$ROOT/out/gpu_check; fi
[[ -n "$OUT_FILE" ]] || OUT_FILE=${OUT:+$OUT/gpu_check.md}
[[ -n "$OUT_FILE" ]] || OUT_FILE=$W/gpu_check.md
rm -rf "$W"
mkdir -p "$W/logs"
# The .pt2 files (GPT-2 small: 250 MB) stay out of $OUT.
MODEL_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ckplan-gpu-check.XXXXXX")
trap 'rm -rf "$MODEL_DIR"' EXIT
: >"$W/steps.tsv"

# step NAME CAP CMD...: CMD under `timeout`, at most CAP seconds and never past
# STEP_DEADLINE; its output in logs/NAME.log, a row in steps.tsv. Exit codes in
# $OK_CODES (default 0) count as ran.
STEP_DEADLINE=$((DEADLINE - RESERVE))
OK_CODES="0"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$W/steps.tsv"; }
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((STEP_DEADLINE - $(date +%s)))
  if ((left < 5)); then
    record "$name" "skipped" 0 "no time left"
    say "$name skipped: no time left"
    return 124
  fi
  local t=$((cap < left ? cap : left)) log="$W/logs/${name//[:\/ ]/_}.log" begin rc status note
  begin=$(date +%s)
  timeout -k 5 "$t" "$@" >"$log" 2>&1
  rc=$?
  local seconds=$(($(date +%s) - begin))
  note=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-200)
  if [[ " $OK_CODES " == *" $rc "* ]]; then
    status=ok
  elif ((rc == 124 || rc == 137)); then
    status="timeout (${t} s)"
  else
    status="failed (exit $rc)"
  fi
  record "$name" "$status" "$seconds" "$note"
  say "$name: $status in $seconds s"
  return $rc
}
skip() { record "$1" "skipped" 0 "$2"; say "$1 skipped: $2"; }

# ---- the models' files, exported while ckplan builds (Python on the CPU) -------
read -r -a MODEL_LIST <<<"$MODELS"
(
  for model in "${MODEL_LIST[@]}"; do
    step "$model:export" 120 "$PY" bench/gpu_check.py export "$model" "$MODEL_DIR/$model.pt2" $DRY_FLAG
  done
) &
EXPORTS=$!

# ---- build -------------------------------------------------------------------
BUILD=${CKPLAN_BUILD_DIR:-build}
if [[ -f "$BUILD/CMakeCache.txt" ]] &&
   [[ "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt")" != "$ROOT" ]]; then
  BUILD=build-gpu-check  # a build folder carried from another checkout: leave it
fi
LOCK=()
command -v flock >/dev/null 2>&1 && LOCK=(flock /tmp/ckplan-build.lock)
TESTS=ON
have_header() { [[ -f /usr/include/$1 || -f /usr/local/include/$1 ]]; }
missing_packages() {
  local m=()
  command -v cmake >/dev/null 2>&1 || m+=(cmake)
  command -v g++ >/dev/null 2>&1 || m+=(g++)
  command -v make >/dev/null 2>&1 || m+=(make)
  have_header CLI/CLI.hpp || m+=(libcli11-dev)
  have_header nlohmann/json.hpp || m+=(nlohmann-json3-dev)
  have_header boost/graph/adjacency_list.hpp || m+=(libboost-graph-dev)
  have_header doctest/doctest.h || m+=(doctest-dev)
  echo "${m[*]}"
}
BUILT=0
if ((NO_BUILD)); then
  [[ -x "$BUILD/ckplan" && -x "$BUILD/ckplan-torch" ]] && BUILT=1
  record build "$( ((BUILT)) && echo ok || echo skipped)" 0 "--no-build: $BUILD/ckplan as it is"
elif ((RUN_SETUP)); then
  step build:setup 300 env CKPLAN_BUILD_DIR="$BUILD" bash scripts/setup.sh
fi
missing=$( ((NO_BUILD)) || missing_packages)
if [[ -n "$missing" ]]; then
  say "the build needs Debian packages that are missing: $missing"
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    APT="DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::http::Timeout=10 -o Acquire::Retries=0 -y -qq"
    step build:apt-get 90 bash -c "$APT install --no-install-recommends $missing || { $APT update && $APT install --no-install-recommends $missing; }"
    missing=$(missing_packages)
  fi
fi
if [[ "$missing" == "doctest-dev" ]]; then
  TESTS=OFF  # the tools build without the tests
  skip build:doctest "doctest-dev is missing: the tests are not built"
  missing=""
fi
if ((NO_BUILD)); then
  :
elif [[ -n "$missing" ]]; then
  skip build "missing Debian packages: $missing (scripts/setup.sh installs them: apt-get install $missing)"
else
  configured=1
  cached_python=$(sed -n 's/^CKPLAN_PYTHON:FILEPATH=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  if [[ ! -f "$BUILD/CMakeCache.txt" ]] ||
     { ((DRY == 0)) && [[ "$(readlink -f "$cached_python" 2>/dev/null)" != "$(readlink -f "$PY")" ]]; }; then
    step build:configure 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCKPLAN_PYTHON="$PY" \
      -DCKPLAN_BUILD_TESTS=$TESTS || configured=0
  fi
  if ((configured)) && step build:ckplan 300 "${LOCK[@]}" cmake --build "$BUILD" -j"$JOBS" --target ckplan; then
    BUILT=1
  fi
fi
CK=$ROOT/$BUILD/ckplan
if ((BUILT)); then
  for c in profile solve run; do timeout 20 "$CK" "$c" --help >"$W/logs/help_$c.txt" 2>&1; done
fi
TESTS=$(sed -n 's/^CKPLAN_BUILD_TESTS:BOOL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)

# The tests that exercise CUDA. No label marks them: `gpu-timing` (the CUPTI
# layer with canned records, and "real CUPTI on this machine") and, in the torch
# label, profiler_tests' case "--device cuda: ..." (the GPU profile of mlp_chain
# against the CPU one and PyTorch's count). This part first: the second needs the
# test models, made last.
if ((BUILT)) && [[ "$TESTS" == ON ]]; then
  if ((NO_BUILD)) || step build:gpu_timing_tests 120 "${LOCK[@]}" cmake --build "$BUILD" -j"$JOBS" --target gpu_timing_tests; then
    step test:gpu-timing 60 bash -c "cd '$BUILD' && ctest -L gpu-timing --output-on-failure --timeout 50"
  fi
elif ((BUILT)); then
  skip test:gpu-timing "the build has no tests (CKPLAN_BUILD_TESTS=$TESTS)"
fi

# ---- facts for the table's header ---------------------------------------------
NVIDIA_SMI=$( ((DRY)) || timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)
step info 60 "$PY" - "$W/info.json" "$MODE" "$BUILD" "$MODELS" "$NVIDIA_SMI" <<'PY'
import json, platform, sys, time
import torch
path, mode, build, models, smi = sys.argv[1:6]
info = {"mode": mode, "models": models.split(), "machine": f"{platform.node()}, {platform.machine()}",
        "torch": f"{torch.__version__} ({sys.executable})", "started": time.strftime("%Y-%m-%d %H:%M:%S")}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info["gpu"] = f"{p.name}, {p.total_memory / 2**30:.1f} GiB, compute {p.major}.{p.minor}"
    info["cuda"] = f"torch's CUDA {torch.version.cuda}; nvidia-smi: {smi}"
try:
    cache = open(f"{build}/CMakeCache.txt").read()
    cupti = [l.split("=", 1)[1] for l in cache.splitlines() if l.startswith("CUDA_cupti_LIBRARY:")]
    info["cupti"] = (f"linked: {cupti[0]}" if cupti and not cupti[0].endswith("NOTFOUND")
                     else "not found at build time: ckplan's GPU timer falls back to CUDA events")
    info["build"] = build
except OSError:
    info["build"] = f"{build} (not configured)"
json.dump(info, open(path, "w"), indent=2)
print(info)
PY

# ---- the models --------------------------------------------------------------
wait "$EXPORTS"
models_left=${#MODEL_LIST[@]}
for model in "${MODEL_LIST[@]}"; do
  # Each model gets its share of what is left, the profiler test's 90 s kept aside.
  now=$(date +%s)
  STEP_DEADLINE=$((now + (DEADLINE - RESERVE - 90 - now) / models_left))
  models_left=$((models_left - 1))
  D=$W/$model
  mkdir -p "$D"
  PT2=$MODEL_DIR/$model.pt2
  if [[ ! -f "$PT2" || ! -f "${PT2%.pt2}.json" ]]; then
    skip "$model:profile" "no model file"
    continue
  fi
  cp "${PT2%.pt2}.json" "$D/model.json"
  read -r -a INPUTS < <("$PY" -c 'import json,sys; print(" ".join("--input " + s for s in json.load(open(sys.argv[1]))["inputs"]))' "$D/model.json")
  DTYPE=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]))["dtype"]; print("--dtype " + d if d else "")' "$D/model.json")
  if ((BUILT == 0)); then
    skip "$model:ckplan" "ckplan did not build"
    continue
  fi
  # shellcheck disable=SC2086
  if step "$model:profile" 150 "$CK" profile "$PT2" "${INPUTS[@]}" $DTYPE --device "$DEVICE" -o "$D/profile.json"; then
    # No checkpointing (the loose budget wraps nothing) and the every baseline; the budget halfway.
    if step "$model:solve-loose" 30 bash -c "'$CK' solve '$D/profile.json' --budget 1TB -o '$D/loose.plan.json' > '$D/loose.solve.txt'" &&
       step "$model:solve-every" 30 "$CK" solve "$D/profile.json" --budget 1TB --algo every -o "$D/every.plan.json" &&
       step "$model:halfway" 30 "$PY" bench/gpu_check.py halfway "$D/loose.solve.txt" "$D/loose.plan.json" \
         "$D/every.plan.json" --out "$D/halfway.json"; then
      BUDGET=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["budget_bytes"])' "$D/halfway.json")
      if step "$model:solve" 60 bash -c "'$CK' solve '$D/profile.json' --budget $BUDGET -o '$D/plan.json' > '$D/plan.solve.txt'"; then
        OK_CODES="0 4" step "$model:run" 150 "$CK" run "$PT2" --plan "$D/plan.json" --device "$DEVICE" --steps 3 -o "$D/run.json"
        step "$model:eager" 120 "$PY" bench/gpu_check.py eager "$model" "$D/plan.json" "$D/eager.json" \
          --device "$DEVICE" $DRY_FLAG
      else
        skip "$model:run" "no plan"
      fi
    else
      skip "$model:solve" "no halfway budget"
    fi
  else
    skip "$model:solve" "no profile"
  fi
  # The cost model on meta tensors, and its plan at the same budget.
  # shellcheck disable=SC2086
  if step "$model:meta-profile" 90 "$CK" profile "$PT2" "${INPUTS[@]}" $DTYPE --device meta --gpu h200 \
       -o "$D/meta.profile.json" && [[ -f "$D/halfway.json" ]]; then
    # An autocast job on meta takes CUDA's autocast policy: on the CPU dry run the measured profile took
    # the CPU's (other ops in fp32), so its budget may be below the meta plan's smallest.
    if ((DRY)) && [[ "$model" == gpt2_autocast || "$model" == gpt2_lora ]]; then
      skip "$model:meta-solve" "CPU dry run: the meta profile takes CUDA's autocast policy, the CPU profile the CPU's"
      continue
    fi
    step "$model:meta-solve" 30 bash -c "'$CK' solve '$D/meta.profile.json' --budget $BUDGET -o '$D/meta.plan.json' > '$D/meta.solve.txt'"
  fi
done

# ---- the profiler's CUDA test: needs the test model mlp_chain ------------------
STEP_DEADLINE=$((DEADLINE - RESERVE))
if ((BUILT)) && [[ "$TESTS" == ON ]]; then
  made=1
  if [[ ! -f "$BUILD/test_models/mlp_chain.pt" || ! -f "$BUILD/test_models/mlp_chain.json" ]]; then
    step test:make-mlp_chain 60 "$PY" tests/models/make_models.py "$BUILD/test_models" mlp_chain || made=0
  fi
  # /fast: this target alone (make), not the test models' target, which makes all of them.
  target=profiler_tests
  grep -q '^CMAKE_GENERATOR:INTERNAL=Unix Makefiles' "$BUILD/CMakeCache.txt" && target=profiler_tests/fast
  if ((made)) && { ((NO_BUILD)) || step build:profiler_tests 150 "${LOCK[@]}" cmake --build "$BUILD" -j"$JOBS" --target "$target"; }; then
    binary=$(find "$BUILD" -maxdepth 2 -name profiler_tests -type f | head -n 1)
    step "test:profiler --device cuda" 60 "${binary:-$BUILD/tests/profiler_tests}" "--test-case=--device cuda*"
  fi
fi

if ! timeout 10 "$PY" bench/gpu_check.py table "$W" --out "$OUT_FILE"; then
  echo "gpu_check: the table could not be written; the steps:"
  cat "$W/steps.tsv"
fi
say "done in $(($(date +%s) - START)) s; table in $OUT_FILE, logs in $W/logs"
# Every step ran (a verdict other than ok is a finding, not a failure): 0; else 1.
if cut -f2 "$W/steps.tsv" | grep -qv '^ok$'; then exit 1; fi
exit 0
