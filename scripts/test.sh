#!/usr/bin/env bash
# Sets up the environment and runs the tests; exits non-zero when a test fails. Arguments go to pytest.
#   bash scripts/test.sh            every tier: the cluster, browser and multi-process tests included (CI runs this)
#   bash scripts/test.sh --fast     only the tests that start nothing: no cluster, browser or process (~1 minute)
#   bash scripts/test.sh -m procs   one tier (markers: cluster, netns, browser, procs; tests/harness/jobtest/tiers.py)
# The Kubernetes tests run on a real control plane built from Go modules (scripts/cluster/build.sh: about 15 min
# on 2 cores the first time, seconds once cached under ~/.cache/trainjob/cluster); they need Go and root.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
for arg in "$@"; do [ "$arg" = "--fast" ] && fast=1; done
bash scripts/setup.sh
.venv/bin/ruff check src tests examples benchmarks
if [ "$fast" = 0 ]; then
  if command -v go >/dev/null; then
    start=$SECONDS
    bash scripts/cluster/build.sh >/dev/null
    echo "test.sh: test cluster components ready in $((SECONDS - start)) s"
  else
    echo "test.sh: Go not found: the Kubernetes tests will be skipped (set TRAINJOB_REQUIRE_CLUSTER=1 to fail instead)"
  fi
fi
if [ "$fast" = 1 ] || [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
# Every tier, in two lanes at once: the cluster and browser tests spend most of their time waiting on pods, the
# API server and Chromium, the rest on the CPU; side by side they take little more than the longer lane alone.
# Each lane has its own temp dirs; the cluster lane's report is printed after the other's, and either failing
# fails the run.
artifacts="${TRAINJOB_ARTIFACTS:-tests-artifacts}"
mkdir -p "$artifacts"
lane_log="$artifacts/cluster-lane.log"
# Per checkout, emptied by pytest at the start of the next run (pytest's own numbered dirs would be shared).
base="${TMPDIR:-/tmp}/trainjob-tests-$(pwd | sha256sum | cut -c1-8)"
mkdir -p "$base"
start=$SECONDS
.venv/bin/python -m pytest -q -m "cluster or browser" --durations=15 -p no:cacheprovider \
  --basetemp="$base/cluster-lane" >"$lane_log" 2>&1 &
lane=$!
trap 'kill "$lane" 2>/dev/null || true' INT TERM
status=0
.venv/bin/python -m pytest -q -m "not (cluster or browser)" --durations=15 -p no:cacheprovider \
  --basetemp="$base/local-lane" || status=$?
echo "test.sh: the local lane ended (exit $status) after $((SECONDS - start)) s; the cluster and browser lane:"
cluster_status=0
wait "$lane" || cluster_status=$?
cat "$lane_log"
echo "test.sh: the cluster and browser lane ended (exit $cluster_status) after $((SECONDS - start)) s"
[ "$status" = 0 ] && [ "$cluster_status" = 0 ]
