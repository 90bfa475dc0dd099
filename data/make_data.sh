#!/usr/bin/env bash
# Regenerates the sample model and its profile in data/ (run from the repo
# root after building): data/example.pt from data/make_example.py, and
# data/example.profile.json from `ckplan profile`.
set -euo pipefail
PY=${CKPLAN_PYTHON:-.venv/bin/python3}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"$PY" data/make_example.py data/example.pt
"${CKPLAN:-build/ckplan}" profile data/example.pt --input 8x3x32x32 -o data/example.profile.json
