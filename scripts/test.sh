#!/usr/bin/env bash
# Sets up the environment and runs the tests; exits non-zero when a test fails. Arguments go to pytest.
#   bash scripts/test.sh            every tier: the cluster, browser and multi-process tests included (CI runs this)
#   bash scripts/test.sh --fast     only the tests that start nothing: no cluster, browser or process (~1 minute)
#   bash scripts/test.sh -m procs   one tier (markers: cluster, nodes, browser, procs; tests/harness/jobtest/tiers.py)
# The Kubernetes tests run on a real cluster built from Go modules with two real nodes (kubelet, Debian's containerd
# and runc) whose pods run images built here (python -m kubetest.images); they need Go and root.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
for arg in "$@"; do [ "$arg" = "--fast" ] && fast=1; done
bash scripts/setup.sh
.venv/bin/ruff check src tests examples benchmarks
# The test cluster's components (scripts/cluster/build.sh: about 25 min on 2 cores the first time, seconds once
# cached under ~/.cache/trainjob/cluster) and the nodes' images (pause, CoreDNS, the training image of
# deploy/training.Dockerfile), built with buildah and pushed to the loopback registry's storage: about 8 min the
# first time, seconds once cached under ~/.cache/trainjob/images (the training image again only when src/,
# examples/ or the lock change).
prepare_cluster() {
  if command -v go >/dev/null; then
    local start=$SECONDS
    bash scripts/cluster/build.sh >/dev/null
    echo "test.sh: test cluster components ready in $((SECONDS - start)) s"
    if [ "$(id -u)" = 0 ] && command -v buildah >/dev/null && command -v docker-registry >/dev/null; then
      start=$SECONDS
      PYTHONPATH=tests/harness .venv/bin/python -m kubetest.images >/dev/null
      echo "test.sh: test cluster images ready in $((SECONDS - start)) s"
    else
      echo "test.sh: no root, buildah or docker-registry: the Kubernetes tests will be skipped (set TRAINJOB_REQUIRE_CLUSTER=1 to fail instead)"
    fi
  else
    echo "test.sh: Go not found: the Kubernetes tests will be skipped (set TRAINJOB_REQUIRE_CLUSTER=1 to fail instead)"
  fi
}
# DeepSpeed with its CPU ops compiled in, rather than compiled on first use inside the DeepSpeed tests, beside their
# jobs, in every fresh .venv: a wheel built once per machine under ~/.cache/trainjob/deepspeed-wheels (minutes),
# installed over setup.sh's plain DeepSpeed in seconds afterwards (tests/harness/jobtest/deepspeed_ops.py).
prepare_deepspeed() {
  local start=$SECONDS
  PYTHONPATH=tests/harness .venv/bin/python -m jobtest.deepspeed_ops || return 1
  echo "test.sh: DeepSpeed's CPU ops ready in $((SECONDS - start)) s"
}
# The slowest tests close the report, so what a change costs shows in every run.
if [ "$#" -gt 0 ]; then
  if [ "$fast" = 0 ]; then
    prepare_cluster
    prepare_deepspeed
  fi
  exec .venv/bin/python -m pytest -q --durations=25 "$@"
fi
# Every tier, in three pytest sessions side by side: the cluster's components and images, then the cluster tier, which
# spends much of its time waiting on controllers and pods; the local backend's tests (and Ray's, the dashboard's),
# which spend much of theirs waiting on jobs that stall, lose nodes or restart on purpose; the rest (the training
# library's, the CLI's), which keep the cores busy. Together they take about the time of the longest. DeepSpeed with
# its ops is installed first, beside the cluster chain alone (seconds; the first time on a machine, its wheel's build
# takes minutes, which beside all three sessions took 19 on 2 cores). The cores are the limit (the three kept 2 cores busy; beside the two others, the cluster
# tier took 2,946 s where it took 2,490 s beside one), so the two others run at a lower priority (nice 10): the
# cluster tier, whose pods and controllers take turns with its waits, gets the cores when it needs them (at one
# priority its Kubeflow conformance fixture ran past its waits), and the others fill the rest. Their multi-process
# tests then wait for a CPU at times: their limits count the time the processes could run, not that wait
# (trainjob.runnable.RunnableClock), and the fuzz tests' limits are CPU time. (The local container tests use
# the training image too: they wait on the image
# cache's lock while the cluster chain builds it.) Each session's report follows. Each test counts only its own
# processes: the local jobs' (by their job directory) or the pods' (by their network namespace), so the sessions do
# not see each other's.
LOCAL_TESTS=(tests/backends tests/ray tests/ui tests/fuzz tests/test_client.py)
# The two local sessions each run in a control group of their own where one can be made (root, cgroup v2 or v1's
# cpuacct): their reports then say how many CPU seconds their tests used, every process they started included
# (tests/harness/jobtest/cpu.py), which wall-clock durations of sessions sharing the cores do not. (The cluster
# tier's nodes place their pods in cgroups of their own, so it runs where it is.)
groups=()
session_group() {  # $1: the session's name; sets $group to the new group's folder, or to nothing
  group=
  local base=/sys/fs/cgroup
  [ -f "$base/cgroup.controllers" ] || base=/sys/fs/cgroup/cpuacct
  if [ "$(id -u)" = 0 ] && [ -d "$base" ] && mkdir "$base/trainjob-test-$1-$$" 2>/dev/null; then
    group="$base/trainjob-test-$1-$$"
    groups+=("$group")
  fi
}
in_group() {  # $1: a group's folder (or nothing); the rest: the command, exec'd in that group
  local into=$1
  shift
  if [ -n "$into" ] && echo "$BASHPID" >"$into/cgroup.procs" 2>/dev/null; then
    export TRAINJOB_TEST_CGROUP=$into
  fi
  exec "$@"
}
remove_groups() {  # a group still holding processes after 10 s is not removed: the session left them running
  local g i
  for g in "${groups[@]}"; do
    for i in $(seq 20); do rmdir "$g" 2>/dev/null && break || sleep 0.5; done  # the last exits being reaped
    if [ -d "$g" ]; then echo "test.sh: processes left in $g: $(tr '\n' ' ' <"$g/cgroup.procs")"; fi
  done
  groups=()
  return 0
}
report=$(mktemp -d)
cluster=
local_tier=
stop_chains() {  # an interrupted run: each pytest session (exec'd by its chain) tears its fixtures down on SIGINT
  for pid in $cluster $local_tier; do kill -INT "$pid" 2>/dev/null; done
  for pid in $cluster $local_tier; do wait "$pid" 2>/dev/null; done
  cat "$report/local.txt" "$report/cluster.txt" 2>/dev/null
  rm -rf "$report"
  remove_groups
}
trap 'stop_chains; exit 130' INT TERM
(
  prepare_cluster
  exec .venv/bin/python -m pytest -q --durations=15 -p no:cacheprovider -m cluster
) >"$report/cluster.txt" 2>&1 &
cluster=$!
deepspeed=0
prepare_deepspeed || deepspeed=$?
session_group local
(in_group "$group" nice -n 10 .venv/bin/python -m pytest -q --durations=15 -p no:cacheprovider -m "not cluster" "${LOCAL_TESTS[@]}") \
  >"$report/local.txt" 2>&1 &
local_tier=$!
others=0
if [ "$deepspeed" = 0 ]; then  # a failure here still waits for the other chains, which end on their own
  session_group others
  (in_group "$group" nice -n 10 .venv/bin/python -m pytest -q --durations=15 -m "not cluster" "${LOCAL_TESTS[@]/#/--ignore=}") ||
    others=$?
else
  echo "test.sh: building DeepSpeed's CPU ops failed; the training library's and the CLI's tests did not run"
  others=1
fi
local_rc=0
wait "$local_tier" || local_rc=$?
cluster_rc=0
wait "$cluster" || cluster_rc=$?
cluster=
local_tier=
trap - INT TERM
echo
echo "==================== the local backend's tiers (run beside the tests above) ===================="
cat "$report/local.txt"
echo
echo "==================== the cluster tier (run beside the tests above) ===================="
cat "$report/cluster.txt"
rm -rf "$report"
remove_groups
echo "test.sh: cluster tier exit $cluster_rc, the local backend's tiers exit $local_rc, the other tiers exit $others"
[ "$others" = 0 ] && [ "$local_rc" = 0 ] && [ "$cluster_rc" = 0 ]
