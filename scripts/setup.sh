#!/usr/bin/env bash
# Creates .venv (if missing) and installs trainjob with its dev and example dependencies, every package at the
# version requirements/dev.lock pins (transitive ones included; `bash scripts/lock.sh` refreshes the lock).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
lock=requirements/dev.lock
pin() { sed -n "s/^$1==//p" "$lock"; }
# The build tools first, at their pinned versions; nothing below builds in an isolated (unpinned) environment.
.venv/bin/python -m pip install -q --disable-pip-version-check "pip==$(pin pip)" "setuptools==$(pin setuptools)" \
  "wheel==$(pin wheel)"
# Everything but DeepSpeed, whose only release is a source one that imports torch while it builds.
grep -v '^deepspeed==' "$lock" > .venv/dev-lock-wheels.txt
.venv/bin/python -m pip install -q --disable-pip-version-check -r .venv/dev-lock-wheels.txt
# trainjob itself, editable; its dependencies are all in the lock already.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
# An editable install leaves trainjob's bytecode to be written on first import, which never happens where
# PYTHONDONTWRITEBYTECODE is set (CI runners and container images often set it): then every CLI command,
# supervisor and node keeper compiles its modules from source at each start (~0.1 s of `trainjob run`'s launch).
# Compiled here once; a module edited later is recompiled in memory until the next setup.
.venv/bin/python -m compileall -q -j 0 src/trainjob >/dev/null
# Real DeepSpeed for examples/deepspeed and its tests: DS_BUILD_OPS=0 builds it without compiling (its CPU ops
# compile on first use) and against the torch installed above (no build isolation).
DS_BUILD_OPS=0 .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  "deepspeed==$(pin deepspeed)"
.venv/bin/python -m pip check >/dev/null || { .venv/bin/python -m pip check; exit 1; }
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
# The test cluster's real nodes: containerd, runc and the CNI plugins run the pods; buildah builds their images,
# Debian's docker-registry serves them on loopback, debootstrap makes the Debian base; kube-proxy programs iptables,
# conntrack cleans its entries. Podman (with netavark, aardvark-dns for names on a job's network, catatonit for
# --init) runs local jobs' nodes as containers of their image. Installed the same way (CI requires these tests).
node_packages=(containerd runc containernetworking-plugins buildah docker-registry debootstrap iptables conntrack
               podman netavark aardvark-dns catatonit)
missing=()
for package in "${node_packages[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup.sh: installing Debian's ${missing[*]} for the test cluster's nodes"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "setup.sh: could not install ${missing[*]}; the cluster tests will be skipped (or fail under TRAINJOB_REQUIRE_CLUSTER=1)"
  fi
fi
