"""Which pod ``logs --rank`` reads on Kubernetes: from the resolved processes per node, also for ``auto``.

No cluster needed: the backend talks to a stand-in API that serves one TrainJob and its pods.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainjob.api import TrainJob
from trainjob.backends.kubernetes import views
from trainjob.backends.kubernetes.backend import KubernetesBackend
from trainjob.backends.kubernetes.resources import (
    COMPLETION_INDEX_LABEL,
    REPLICATED_JOB_LABEL,
    RUNTIME_SNAPSHOT_ANNOTATION,
    TRAINJOB_NAME_LABEL,
)
from trainjob.backends.log_selection import node_of_rank, select_nodes
from trainjob.constants import LAUNCH_ANNOTATION
from trainjob.errors import ValidationError
from trainjob.runtime import builtin_runtimes, resolve
from trainjob.runtime.launch import LaunchValues, resolve_launch_values


def trainjob(nproc: Any, snapshot: bool = True) -> dict[str, Any]:
    """A 2-node TrainJob with 4 CPUs per node; with ``snapshot`` as the operator leaves it: the runtime snapshot
    and the launch values it resolved the job to (``trainjob/launch``)."""
    annotations: dict[str, str] = {}
    trainer: dict[str, Any] = {"numNodes": 2, "command": ["torchrun", "train.py"],
                               "resourcesPerNode": {"requests": {"cpu": "4"}}}
    if nproc is not None:
        trainer["numProcPerNode"] = nproc
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "grid", "namespace": "ml", "creationTimestamp": "2025-01-01T00:00:00Z",
                     "annotations": annotations},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer},
    }
    if snapshot:
        runtime = builtin_runtimes()["torch-distributed"]
        annotations[RUNTIME_SNAPSHOT_ANNOTATION] = json.dumps(
            {"kind": "ClusterTrainingRuntime", "name": "torch-distributed", "labels": {},
             "spec": runtime.to_dict()["spec"]})
        plan = resolve(TrainJob.from_dict(job), runtime)
        annotations[LAUNCH_ANNOTATION] = json.dumps(resolve_launch_values(plan).to_dict())
    return job


def pod(index: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": f"grid-node-0-{index}", "creationTimestamp": "2025-01-01T00:00:01Z",
                     "labels": {TRAINJOB_NAME_LABEL: "grid", REPLICATED_JOB_LABEL: "node", COMPLETION_INDEX_LABEL: str(index)}},
        "spec": {"containers": [{"name": "node", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]},
        "status": {"phase": "Running"},
    }


class FakeApi:
    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.job, self.pods = job, pods
        self.read: list[tuple[str, dict[str, Any]]] = []

    def get(self, ref: Any, namespace: str, name: str) -> dict[str, Any] | None:
        return self.job if name == "grid" else None

    def list(self, ref: Any, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        return []  # no JobSet yet: what the view knows comes from the job and its pods

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.pods

    def read_pod_log(self, namespace: str, pod_name: str, **options: Any) -> str:
        self.read.append((pod_name, options))
        node = int(pod_name.rsplit("-", 1)[1])
        ranks = range(node * 4, node * 4 + 4)
        return "".join(f"2025-01-01T00:00:0{r}.000000000Z [rank{r}]: hello from {r}\n" for r in ranks)


def backend(job: dict[str, Any], pods: list[dict[str, Any]]) -> KubernetesBackend:
    made = KubernetesBackend.__new__(KubernetesBackend)
    made.namespace, made.api, made.pod_start_timeout = "ml", FakeApi(job, pods), 1.0  # type: ignore[assignment]
    return made


@pytest.mark.parametrize("nproc", ["auto", "cpu", 4, None])
def test_processes_per_node_are_the_resolved_ones(nproc):
    view = views.trainjob_view(trainjob(nproc), [])  # None: the built-in runtime's auto
    assert (view.num_nodes, view.num_proc_per_node) == (2, 4)


def test_without_a_snapshot_the_pods_environment_tells():
    view = views.trainjob_view(trainjob("auto", snapshot=False), [pod(0, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4"})])
    assert view.num_proc_per_node == 4
    assert views.trainjob_view(trainjob("auto", snapshot=False), []).num_proc_per_node is None


def test_rank_3_of_a_2_by_4_auto_job_reads_node_0_and_rank_5_node_1():
    client = backend(trainjob("auto"), [pod(0), pod(1)])
    assert [line.text for line in client.logs("grid", rank=3)] == ["hello from 3"]
    assert [name for name, _ in client.api.read] == ["grid-node-0-0"]
    assert [(line.node, line.rank) for line in client.logs("grid", rank=5)] == [(1, 5)]
    with pytest.raises(ValidationError, match="rank 5 runs on node-1, not node-0"):
        list(client.logs("grid", node=0, rank=5))
    with pytest.raises(ValidationError, match="must be 0..7"):
        list(client.logs("grid", rank=8))


def test_logs_merge_nodes_by_time_and_pass_tail_since_previous_to_the_api():
    client = backend(trainjob("auto"), [pod(0), pod(1)])
    lines = list(client.logs("grid", tail=3, previous=True, since=0.0))
    assert [line.rank for line in lines] == [5, 6, 7]
    assert lines[0].time == 1735689605.0
    options = client.api.read[0][1]
    assert options["timestamps"] and options["tail_lines"] == 3 and options["previous"] and options["since_seconds"] > 0


def test_the_rank_to_node_table():
    assert [node_of_rank(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert select_nodes("j", 2, 4, None, None) == [0, 1]
    assert select_nodes("j", 2, None, None, 3) == [0, 1]  # not known yet: look everywhere


class CreatingApi(FakeApi):
    """Serves the built-in runtimes and keeps the TrainJob ``apply`` creates (no operator: no snapshot, no env)."""

    def get(self, ref: Any, namespace: str, name: str) -> dict[str, Any] | None:
        if ref.kind == "ClusterTrainingRuntime" and name in builtin_runtimes():
            return builtin_runtimes()[name].to_dict()
        if ref.kind == "TrainJob":
            return self.job if self.job and name == self.job["metadata"]["name"] else None
        return None

    def create(self, body: dict[str, Any], ref: Any) -> dict[str, Any]:
        self.job = {**body, "metadata": {**body["metadata"], "creationTimestamp": "2025-01-01T00:00:00Z"}}
        return self.job


def test_a_job_just_created_knows_its_ranks_before_the_operator_wrote_anything():
    """``numProcPerNode: auto`` on 4 CPUs: rank 3 is node 0's, rank 5 node 1's, as soon as ``apply`` returns."""
    client = backend({}, [pod(0), pod(1)])  # pods without PET_* (their env is not read back here)
    client.api = CreatingApi({}, [pod(0), pod(1)])  # type: ignore[assignment]
    job = trainjob("auto", snapshot=False)
    created = client.apply(TrainJob.from_dict(job))
    assert (created.num_nodes, created.num_proc_per_node) == (2, 4)
    assert [(line.node, line.rank) for line in client.logs("grid", rank=3)] == [(0, 3)]
    assert [name for name, _ in client.api.read] == ["grid-node-0-0"]
    assert [(line.node, line.rank) for line in client.logs("grid", rank=5)] == [(1, 5)]
    assert [name for name, _ in client.api.read] == ["grid-node-0-0", "grid-node-0-1"]
    with pytest.raises(ValidationError, match="must be 0..7"):
        list(client.logs("grid", rank=8))


def test_launch_values_come_from_the_annotation_else_the_pods_torchrun_environment():
    job = trainjob("auto", snapshot=False)
    job["metadata"]["annotations"][LAUNCH_ANNOTATION] = json.dumps(LaunchValues(2, 4).to_dict())
    assert views.launch_values(job, []) == LaunchValues(2, 4)
    job["metadata"]["annotations"][LAUNCH_ANNOTATION] = "{not json"  # unreadable: the pods tell
    elastic = pod(0, {"PET_NNODES": "1:3", "PET_NPROC_PER_NODE": "2", "PET_MASTER_PORT": "29400"})
    assert views.launch_values(job, [elastic]) == LaunchValues(3, 2, 29400, min_nodes=1, max_nodes=3)
    assert views.launch_values(job, [pod(0, {"PET_NPROC_PER_NODE": "auto"})]) is None
