#!/usr/bin/env bash
# Refreshes requirements/dev.lock, the one list of every package (transitive ones included) and version that
# scripts/setup.sh installs for development and CI. Run it on purpose, to take new releases within the ranges of
# pyproject.toml's `dev` extra (torch stays at constraints.txt's pin), then run the tests and commit the lock.
#   bash scripts/lock.sh                 # re-resolve, keeping every pin that still satisfies the ranges
#   bash scripts/lock.sh --upgrade       # newest versions the ranges allow
#   bash scripts/lock.sh --upgrade-package pyyaml
# The lock is made with uv (pinned below) for this interpreter's platform (Linux x86_64, CPython 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
[ -x .venv/bin/python ] || bash scripts/setup.sh
.venv/bin/python -m pip install -q "uv==$UV_VERSION"
mkdir -p requirements
# DeepSpeed publishes only a source release whose build imports torch: it is read inside this environment.
UV_CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" .venv/bin/uv pip compile pyproject.toml requirements/build.in --extra dev \
  -c constraints.txt --python .venv/bin/python --no-build-isolation-package deepspeed \
  -o requirements/dev.lock "$@"
echo "lock.sh: wrote requirements/dev.lock ($(grep -c '==' requirements/dev.lock) packages)"
