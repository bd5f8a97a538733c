#!/usr/bin/env bash
# Sets up the environment and runs the whole test suite; exits non-zero when a test fails.
# The Kubernetes tests run on a real control plane built from Go modules (scripts/cluster/build.sh: about 15 min
# on 2 cores the first time, seconds once cached under ~/.cache/trainjob/cluster); they need Go and root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests examples benchmarks
if command -v go >/dev/null; then
  start=$SECONDS
  bash scripts/cluster/build.sh >/dev/null
  echo "test.sh: test cluster components ready in $((SECONDS - start)) s"
else
  echo "test.sh: Go not found: the Kubernetes tests will be skipped (set TRAINJOB_REQUIRE_CLUSTER=1 to fail instead)"
fi
exec .venv/bin/python -m pytest -q "$@"
