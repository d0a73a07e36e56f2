#!/usr/bin/env bash
# Installs what kiln needs to build, and nothing when it is all there (idempotent).
# Debian packages are installed only when running as root (CI, fresh machines); otherwise the
# missing ones are listed.
#   scripts/setup.sh              the Debian packages (all `make train` needs)
#   scripts/setup.sh venv DIR     also a virtual environment DIR holding the Python packages the
#                                 tests build and run with (from PyPI); the user's interpreter is
#                                 left alone. `make test` uses build/venv.
set -euo pipefail

DEBS=(cmake ninja-build g++ pkg-config libopenblas-dev libhwy-dev nlohmann-json3-dev libfmt-dev
      libcli11-dev libgtest-dev ccache clang libclang-rt-14-dev libgloo-dev)
PY_DEPS=(nanobind scikit-build-core numpy pytest ml_dtypes)  # ml_dtypes: bf16 NumPy arrays
MODE=${1:-}
VENV=${2:-build/venv}

missing=()
for pkg in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing Debian packages (run as root to install): ${missing[*]}" >&2
    exit 1
  fi
fi

[ "$MODE" = venv ] || exit 0
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating the test environment $VENV"
  # Packages the interpreter already has are used from there, the rest go into the venv.
  if ! "$PY" -m venv --system-site-packages "$VENV" && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    rm -rf "$VENV"  # Debian's python3 makes venvs only with python3-venv
    echo "setup: installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    "$PY" -m venv --system-site-packages "$VENV"
  fi
  [ -x "$VENV/bin/python" ] || { echo "setup: '$PY -m venv' failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
py_missing=()
for mod in "${PY_DEPS[@]}"; do
  "$VENV/bin/python" -m pip show -q "$mod" >/dev/null 2>&1 || py_missing+=("$mod")
done
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "setup: pip installing ${py_missing[*]} into $VENV"
  "$VENV/bin/python" -m pip install -q "${py_missing[@]}"
fi
