#!/usr/bin/env bash
# Creates .venv (if missing) and installs trainjob with its dev and example dependencies.
# torch is pinned by constraints.txt to the CPU build so no CUDA packages are pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
