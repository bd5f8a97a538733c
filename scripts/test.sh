#!/usr/bin/env bash
# Sets up the environment and runs the whole test suite; exits non-zero when a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests examples benchmarks
exec .venv/bin/python -m pytest -q "$@"
