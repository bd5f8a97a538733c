"""Fixtures: a real Kubernetes cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, JobSet; two
nodes, each a kubelet with its own containerd, kube-proxy and CoreDNS) built from Go modules by
``scripts/cluster/build.sh``, with trainjob installed and its operator running as its ServiceAccount. Pods run from
images built here (``tests/harness/kubetest/images.py``).

The cluster starts once per test session; every test gets its own namespace.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobtest.tiers import starts
from kubetest.cluster import TrainJobCluster
from kubetest.controlplane import ControlPlane

_NAMESPACES = itertools.count()
#: What the nodes run on (Debian's packages, from scripts/setup.sh).
NODE_TOOLS = ("containerd", "runc", "buildah", "docker-registry", "debootstrap", "iptables", "ip")


def _unavailable() -> str | None:
    if shutil.which("go") is None:
        return "the test cluster is built from Go modules and needs Go (https://go.dev/dl/)"
    if os.geteuid() != 0:
        return "the test cluster's nodes (kubelet, containerd) need root"
    missing = [tool for tool in NODE_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"the test cluster's nodes need {', '.join(missing)} (bash scripts/setup.sh installs them as root)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The least-privilege check reads what every cluster test made the operator do: it runs last."""
    last = [item for item in items if item.name == "test_the_operator_role_grants_exactly_what_the_operator_used"]
    items[:] = [item for item in items if item not in last] + last


@pytest.fixture(scope="session")
@starts("cluster", "nodes")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("TRAINJOB_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"TRAINJOB_REQUIRE_CLUSTER=1 but {reason}")
        pytest.skip(reason)
    with ControlPlane.start(tmp_path_factory.mktemp("cluster")) as cp:
        yield cp
    # What a node leaves when it goes: shims, mounts, cgroups, bridges, kube-proxy's rules; none may stay.
    left = cp.nodes.check_clean() if cp.nodes is not None else []
    assert not left, f"the test cluster left {left}"


@pytest.fixture(scope="session")
def k8s(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainJobCluster]:
    """trainjob installed on the control plane, its operator running (tests that stop it start it again)."""
    cluster = TrainJobCluster(control_plane, tmp_path_factory.mktemp("trainjob"))
    cluster.install()
    cluster.operator.start()
    try:
        yield cluster
    finally:
        cluster.operator.stop()


@pytest.fixture
def namespace(k8s: TrainJobCluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted with everything in it afterwards (the nodes are real: a job a test
    leaves running holds their CPUs from the tests after it)."""
    import kubernetes.client

    name = f"t{next(_NAMESPACES)}-{os.getpid() % 10000}"
    k8s.cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
    yield name
    with contextlib.suppress(kubernetes.client.ApiException):
        k8s.api.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def operator_running(k8s: TrainJobCluster) -> Iterator[TrainJobCluster]:
    """For tests that kill the operator: it runs again afterwards."""
    yield k8s
    if not k8s.operator.alive():
        k8s.operator.start()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    return tmp_path
