"""KubernetesBackend (the SDK/CLI side) against the API stand-in with the real operator running."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from trainjob.backends.kubernetes.testing.harness import Cluster, jobset_condition, wait_for

from trainjob import types
from trainjob.api import TrainJob
from trainjob.backends.kubernetes import KubernetesBackendConfig, create_backend
from trainjob.backends.kubernetes.backend import KubernetesBackend, trainer_spec
from trainjob.backends.kubernetes.resources import TRAINJOBS
from trainjob.errors import AlreadyExistsError, JobFailedError, NotFoundError, ValidationError

READY = [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]


def manifest(name: str = "mnist", **trainer: object) -> TrainJob:
    return TrainJob.from_dict(
        {
            "metadata": {"name": name},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"numNodes": 2, "numProcPerNode": 1, **trainer},
            },
        }
    )


@pytest.fixture
def backend(cluster: Cluster) -> KubernetesBackend:
    return create_backend(namespace="default", config_file=str(cluster.kubeconfig))


def test_apply_then_follow_the_job_to_completion(cluster: Cluster, backend: KubernetesBackend) -> None:
    created = backend.apply(manifest())
    assert (created.name, created.status, created.num_nodes) == ("mnist", types.CREATED, 2)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    cluster.set_jobset_status("mnist", {"replicatedJobsStatus": READY})
    running = backend.wait_for_job_status("mnist", {types.RUNNING}, timeout=10, polling_interval=0.05)
    cluster.set_jobset_status(
        "mnist",
        {"conditions": [jobset_condition("Completed", "AllJobsCompleted", "done")]},
    )
    done = backend.wait_for_job_status("mnist", timeout=10, polling_interval=0.05)

    assert running.start_time is not None and running.runtime_name == "torch-distributed"
    assert (done.status, done.reason, done.message) == (types.COMPLETE, "AllJobsCompleted", "done")
    assert [j.name for j in backend.list_jobs()] == ["mnist"]
    assert "JobSetCreated" in [e.reason for e in backend.get_job_events("mnist")]


def test_waiting_on_a_failed_job_raises_with_its_reason(cluster: Cluster, backend: KubernetesBackend) -> None:
    backend.apply(manifest())
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")
    cluster.set_jobset_status(
        "mnist",
        {"conditions": [jobset_condition("Failed", "FailedJobs", "node 1 crashed")]},
    )

    with pytest.raises(JobFailedError, match="FailedJobs: node 1 crashed"):
        backend.wait_for_job_status("mnist", timeout=10, polling_interval=0.05)


def test_apply_rejects_what_the_operator_would_reject_before_sending(
    cluster: Cluster, backend: KubernetesBackend
) -> None:
    with pytest.raises(ValidationError, match="spec.trainer.numProcPerNode"):
        backend.apply(manifest(numProcPerNode="gpu"))
    with pytest.raises(
        NotFoundError, match="'nope' not found; known: torch-distributed, torch-distributed-volcano"
    ):
        backend.apply(
            TrainJob.from_dict({"metadata": {"name": "x"}, "spec": {"runtimeRef": {"name": "nope"}}})
        )

    assert cluster.api.list(TRAINJOBS, "default") == []


def test_apply_twice_names_the_clash(backend: KubernetesBackend) -> None:
    backend.apply(manifest())
    with pytest.raises(AlreadyExistsError, match="'mnist' exists already in namespace 'default'"):
        backend.apply(manifest())


def test_suspend_resume_and_delete(cluster: Cluster, backend: KubernetesBackend) -> None:
    backend.apply(manifest())
    backend.suspend_job("mnist")
    assert backend.wait_for_job_status("mnist", {types.SUSPENDED}, timeout=10, polling_interval=0.05)
    backend.resume_job("mnist")
    wait_for(
        lambda: cluster.jobset("mnist") and cluster.jobset("mnist")["spec"]["suspend"] is False, what="resume"
    )

    backend.delete_job("mnist")

    with pytest.raises(NotFoundError, match="TrainJob 'mnist' not found in namespace 'default'"):
        backend.get_job("mnist")
    with pytest.raises(NotFoundError):
        backend.delete_job("mnist")


def test_logs_per_node_and_follow_waits_for_the_pod(cluster: Cluster, backend: KubernetesBackend) -> None:
    backend.apply(manifest())
    pods = [cluster.start_pod("mnist", index) for index in range(2)]
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.extend(backend.get_job_logs("mnist", "node-1", follow=True))
    )
    follower.start()

    for index, pod in enumerate(pods):
        cluster.set_pod_phase(pod, "Running")
        cluster.write_log(pod, f"node {index} step 1\n")
    wait_for(lambda: followed, what="the first followed line")
    cluster.write_log(pods[1], "node 1 step 2\n")
    for pod in pods:
        cluster.set_pod_phase(pod, "Succeeded")
    follower.join(10)

    assert not follower.is_alive(), "following did not end when the pod finished"
    assert followed == ["node 1 step 1", "node 1 step 2"]
    assert [str(line) for line in backend.logs("mnist")] == [
        "node-0 | node 0 step 1",
        "node-1 | node 1 step 1",
        "node-1 | node 1 step 2",
    ]
    assert [line.text for line in backend.logs("mnist", rank=0)] == ["node 0 step 1"]
    assert [s.name for s in backend.get_job("mnist").steps] == ["node-0", "node-1"]
    with pytest.raises(NotFoundError, match="nodes 0..1, not 5"):
        list(backend.logs("mnist", node=5))


def record_call(path: str, value: int) -> None:
    with open(path, "w") as fh:
        fh.write(f"called with {value}")


def test_train_ships_the_function_as_a_torchrun_program(
    cluster: Cluster, backend: KubernetesBackend, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    trainer = types.CustomTrainer(
        func=record_call, func_args={"path": str(out), "value": 7}, num_nodes=2, resources_per_node={"cpu": 1}
    )

    name = backend.train(trainer=trainer)

    spec = cluster.job(name)["spec"]["trainer"]
    assert spec["numNodes"] == 2 and spec["resourcesPerNode"]["requests"] == {"cpu": 1}
    script = spec["command"][2]
    assert script.rstrip().endswith("exec torchrun /tmp/trainjob_train.py")
    program = re.search(r"<<'TRAINJOB_PROGRAM'\n(.*)TRAINJOB_PROGRAM", script, re.S).group(1)
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)
    assert out.read_text() == "called with 7"
    assert trainer_spec(trainer) == spec


def test_config_file_and_namespace_come_from_the_config(cluster: Cluster) -> None:
    backend = KubernetesBackend(KubernetesBackendConfig(config_file=str(cluster.kubeconfig)))
    assert backend.namespace == "default"
    assert [r.name for r in backend.list_runtimes()] == ["torch-distributed", "torch-distributed-volcano"]


def test_trainer_client_picks_this_backend_from_the_config(cluster: Cluster) -> None:
    from trainjob.client import TrainerClient

    client = TrainerClient(KubernetesBackendConfig(namespace="team-a", config_file=str(cluster.kubeconfig)))
    name = client.train(
        runtime=client.get_runtime("torch-distributed"),
        trainer=types.CustomTrainer(func=record_call, num_nodes=2),
    )

    wait_for(lambda: cluster.jobset(name, "team-a"), what="the JobSet of the SDK's job")
    assert [job.name for job in client.list_jobs()] == [name]
