#!/usr/bin/env bash
# Installs, builds and runs every test (ctest). The README's test command.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cd "${CKPLAN_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" "$@"
