"""TrainJobs on simulated nodes (KWOK, :mod:`kubetest.kwok`) on the shared test cluster: the operator, JobSet, the
Job controller and the scheduler handle them as on real nodes, and the cluster is left as it was.

The scale figures (a thousand jobs, a thousand nodes) are ``benchmarks/reconcile.py --kwok``'s, not a test's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import kubernetes.client
import pytest
from kubetest.cluster import TrainJobCluster, wait_for
from kubetest.controlplane import NODE_NAME, SECOND_NODE
from kubetest.kwok import SimulatedNodes, on_simulated_nodes

from trainjob.backends.kubernetes.resources import TRAINJOBS
from trainjob.backends.kubernetes.status import is_true

JOBS = 20
NODES_PER_JOB = 4
SIMULATED_NODES = 4


@pytest.fixture
def kwok(k8s: TrainJobCluster) -> Iterator[SimulatedNodes]:
    """kwok with four simulated nodes; afterwards the nodes, kwok and its RBAC are gone again."""
    with SimulatedNodes.start(k8s.cp, run_seconds=1.0) as nodes:
        nodes.add_nodes(SIMULATED_NODES)
        yield nodes


@pytest.fixture
def simulated_namespace(k8s: TrainJobCluster, kwok: SimulatedNodes, namespace: str) -> Iterator[str]:
    """The test's namespace, deleted (and waited for) before the simulated nodes go."""
    yield namespace
    delete_namespace(k8s, namespace)


def delete_namespace(k8s: TrainJobCluster, namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(k8s.api.client)
    try:
        core.delete_namespace(namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            core.read_namespace(namespace)
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 60, f"namespace {namespace} to be deleted")


def test_twenty_trainjobs_complete_on_simulated_nodes_and_leave_the_cluster_as_it_was(
    k8s: TrainJobCluster, kwok: SimulatedNodes, simulated_namespace: str
) -> None:
    namespace = simulated_namespace
    runtime = k8s.namespaced_runtime(namespace, "simulated", on_simulated_nodes)
    start = time.monotonic()
    for i in range(JOBS):
        k8s.create_job(f"sim-{i}", namespace=namespace, runtime=runtime, runtime_kind="TrainingRuntime",
                       trainer={"numNodes": NODES_PER_JOB, "command": ["torchrun", "train.py"]})

    def all_complete() -> bool:
        jobs = k8s.api.list(TRAINJOBS, namespace)
        failed = [j["metadata"]["name"] for j in jobs if is_true(j.get("status") or {}, "Failed")]
        assert not failed, f"failed: {failed}\n{k8s.diagnostics(failed[0], namespace)}"
        return len(jobs) == JOBS and all(is_true(j.get("status") or {}, "Complete") for j in jobs)

    try:
        wait_for(all_complete, 90, f"{JOBS} TrainJobs on simulated nodes to complete", every=0.5)
    except AssertionError as exc:
        incomplete = [j["metadata"]["name"] for j in k8s.api.list(TRAINJOBS, namespace) if not is_true(j.get("status") or {}, "Complete")]
        raise AssertionError(f"{exc}\n{k8s.diagnostics(incomplete[0], namespace) if incomplete else ''}\n"
                             f"kwok log:\n{kwok.tail()}") from None
    elapsed = time.monotonic() - start

    pods = k8s.api.list_pods(namespace, "jobset.sigs.k8s.io/jobset-name")
    assert len(pods) == JOBS * NODES_PER_JOB, [p["metadata"]["name"] for p in pods]
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert {p["spec"]["nodeName"] for p in pods} == set(kwok.nodes), "the scheduler spreads them over every node"
    exits = {s["state"]["terminated"]["exitCode"] for p in pods for s in p["status"]["containerStatuses"]}
    assert exits == {0}
    assert elapsed < 60, f"{JOBS} jobs took {elapsed:.0f} s"

    delete_namespace(k8s, namespace)
    kwok.stop()
    nodes = kubernetes.client.CoreV1Api(k8s.api.client).list_node().items
    assert sorted(n.metadata.name for n in nodes) == sorted([NODE_NAME, SECOND_NODE]), "the real nodes are left"
    assert not kwok.alive()
