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
# Real DeepSpeed for examples/deepspeed and its tests: only a source release exists; DS_BUILD_OPS=0 builds it
# without compiling (its CPU ops compile on first use) and without a second torch (no build isolation).
DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --no-build-isolation -c constraints.txt "deepspeed>=0.16"
# The dashboard's browser tests drive Debian's chromium headless (Playwright never downloads a browser here).
# Installed when missing and we are root; otherwise those tests skip with the reason (CI requires them).
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup.sh: installing Debian's chromium for the browser tests"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; then
    echo "setup.sh: could not install chromium; the browser tests will be skipped (or fail under TRAINJOB_REQUIRE_BROWSER=1)"
  fi
fi
# Local MPI jobs run OpenMPI's mpirun (Debian's openmpi-bin); installed the same way (CI requires the MPI tests).
if ! command -v mpirun >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup.sh: installing Debian's openmpi-bin for local MPI jobs"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin >/dev/null; }; then
    echo "setup.sh: could not install openmpi-bin; the MPI tests will be skipped (or fail under TRAINJOB_REQUIRE_MPI=1)"
  fi
fi
