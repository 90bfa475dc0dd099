#!/usr/bin/env bash
# Installs what ckplan needs on a fresh Debian machine (as root), then
# configures and builds it in build/. Called by demo.sh and test.sh.
#
#  * Debian packages: the compiler, CMake, CLI11, nlohmann-json, OpenSSL's
#    libcrypto (a model file's SHA-256), doctest, Chromium (the report's
#    render test).
#  * A Python environment with the pinned torch wheel (LibTorch for the C++
#    build, CUDA-enabled, runs without a GPU), torchvision and transformers
#    (python/requirements.lock). It is kept outside the checkout, keyed by the
#    lock file and the Python version, in $CKPLAN_CACHE (default
#    ~/.cache/ckplan/venv-<key>), and linked into the checkout as .venv: a
#    second set-up on the same machine, in a new clone too, reuses it. The
#    wheels themselves are kept in $CKPLAN_CACHE/wheels: rebuilding the
#    environment never downloads them again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "ckplan setup: $*" >&2; }

PACKAGES=(cmake g++ make pkg-config libcli11-dev nlohmann-json3-dev libssl-dev doctest-dev chromium)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# The lock's wheels are for CPython 3.11: the image's python3, or Debian's.
PYTHON=""
for candidate in "${CKPLAN_BASE_PYTHON:-}" python3 /usr/bin/python3.11; do
  [[ -n "$candidate" ]] || continue
  if command -v "$candidate" >/dev/null 2>&1 &&
     [[ $("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == 3.11 ]] &&
     "$candidate" -c 'import venv, ensurepip' 2>/dev/null; then
    PYTHON=$(command -v "$candidate")
    break
  fi
done
if [[ -z "$PYTHON" ]]; then
  missing+=(python3.11 python3.11-venv)
  PYTHON=/usr/bin/python3.11
fi

if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

LOCK=python/requirements.lock
CACHE=${CKPLAN_CACHE:-$HOME/.cache/ckplan}
KEY=$( (cat "$LOCK"; "$PYTHON" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
VENV=$CACHE/venv-$KEY
WHEELS=$CACHE/wheels
if [[ ! -f "$VENV/.ckplan-complete" ]]; then
  start=$(date +%s)
  mkdir -p "$CACHE" "$WHEELS"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-index \
      --find-links "$WHEELS" -r "$LOCK"
  }
  if ! pip_install 2>/dev/null; then
    say "downloading the pinned wheels into $WHEELS (about 2.9 GB, once per machine)"
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-cache-dir \
      -d "$WHEELS" -r "$LOCK"
    say "installing them into $VENV"
    pip_install
  fi
  "$VENV/bin/python" -c 'import torch, torchvision, transformers' ||
    { say "the environment $VENV does not import torch"; exit 1; }
  touch "$VENV/.ckplan-complete"
  say "Python environment ready in $(( $(date +%s) - start )) s: $VENV"
fi
# The checkout's .venv (ignored by git) is the shared environment.
if [[ "$(readlink .venv 2>/dev/null)" != "$VENV" ]]; then
  rm -rf .venv
  ln -s "$VENV" .venv
fi

BUILD_DIR=${CKPLAN_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${CKPLAN_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
