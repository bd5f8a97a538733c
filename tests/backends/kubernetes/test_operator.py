"""The real kopf operator against the API stand-in: create, status, suspend, deadline, snapshot, managedBy, restart.

The stand-in validates every object written to it (JobSets against the JobSet CRD and Kubernetes' Job schema,
TrainJob status against our CRD, Events against Kubernetes' schema), so a passing test also means the operator sent
only valid objects.
"""

from __future__ import annotations

import time

import pytest

from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOBSETS,
    RUNTIME_SNAPSHOT_ANNOTATION,
    TRAINING_RUNTIMES,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.testing.harness import (
    Cluster,
    condition,
    has_condition,
    wait_for,
    wait_for_condition,
)
from trainjob.errors import BackendError

TWO_NODES = {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", "train.py"]}


def trainer_env(jobset: dict) -> dict:
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def events(cluster: Cluster, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in cluster.api.list_events("default", name)]


def test_creates_a_jobset_owned_by_the_trainjob(cluster: Cluster) -> None:
    job = cluster.create_job("mnist", trainer=TWO_NODES)

    jobset = wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    assert jobset["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "mnist",
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert jobset["spec"]["suspend"] is False
    env = trainer_env(jobset)
    assert env["PET_NNODES"] == "2" and env["PET_MASTER_ADDR"] == "mnist-node-0-0.mnist"
    wait_for(lambda: ("Normal", "JobSetCreated") in events(cluster, "mnist"), what="the JobSetCreated event")


def test_deleting_the_trainjob_deletes_its_jobset(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    cluster.api.delete(TRAINJOBS, "default", "mnist")

    wait_for(lambda: cluster.jobset("mnist") is None, what="the JobSet to be garbage-collected")


READY = [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]
STARTING = [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]


@pytest.mark.parametrize(
    ("jobset_status", "expected_type", "expected_reason", "expected_message"),
    [
        ({"replicatedJobsStatus": READY}, "Running", "AllTrainerPodsRunning", "all 2 trainer pods run"),
        (
            {
                "replicatedJobsStatus": READY,
                "conditions": [
                    {
                        "type": "Completed",
                        "status": "True",
                        "reason": "AllJobsCompleted",
                        "message": "jobset completed successfully",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            },
            "Complete",
            "AllJobsCompleted",
            "jobset completed successfully",
        ),
        (
            {
                "replicatedJobsStatus": READY,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "FailedJobs",
                        "message": "jobset failed due to reaching max restarts",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            },
            "Failed",
            "FailedJobs",
            "jobset failed due to reaching max restarts",
        ),
    ],
    ids=["running", "complete", "failed"],
)
def test_status_follows_the_jobset(
    cluster: Cluster, jobset_status: dict, expected_type: str, expected_reason: str, expected_message: str
) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    cluster.set_jobset_status("mnist", jobset_status)

    job = wait_for_condition(cluster, "mnist", expected_type)
    cond = condition(job, expected_type)
    assert (cond["reason"], cond["message"]) == (expected_reason, expected_message)
    assert job["status"]["jobsStatus"] == READY


def test_running_needs_every_trainer_pod(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    cluster.set_jobset_status("mnist", {"replicatedJobsStatus": STARTING})
    wait_for(lambda: cluster.job("mnist").get("status", {}).get("jobsStatus") == STARTING, what="jobsStatus")

    assert condition(cluster.job("mnist"), "Running") is None


def test_suspend_is_mirrored_and_resume_keeps_the_template(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES, suspend=True)
    created = wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")
    assert created["spec"]["suspend"] is True
    wait_for(lambda: has_condition(cluster.job("mnist"), "Suspended"), what="Suspended")

    cluster.api.patch(TRAINJOBS, "default", "mnist", {"spec": {"suspend": False}})

    job = wait_for_condition(cluster, "mnist", "Suspended", "False")
    assert condition(job, "Suspended")["reason"] == "Resumed"
    resumed = cluster.jobset("mnist")
    assert resumed["spec"]["suspend"] is False
    assert resumed["spec"]["replicatedJobs"] == created["spec"]["replicatedJobs"]
    jobset_writes = [r for r in cluster.operator_requests() if r.method == "PATCH" and "jobsets" in str(r.url)]
    assert [r.data["spec"] for r in jobset_writes] == [{"suspend": False}]


def test_deadline_fails_the_job_and_deletes_the_jobset(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES, activeDeadlineSeconds=1)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    job = wait_for_condition(cluster, "mnist", "Failed", timeout=6)

    assert condition(job, "Failed")["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds=1" in condition(job, "Failed")["message"]
    wait_for(lambda: cluster.jobset("mnist") is None, what="the JobSet to be deleted")
    assert ("Warning", "DeadlineExceeded") in events(cluster, "mnist")


def test_editing_the_runtime_does_not_change_a_started_job(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer={"numNodes": 2, "numProcPerNode": 1})
    first = wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")
    runtime = cluster.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "image"
    ] = "registry.example.com/edited:2"
    cluster.api.patch(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed", {"spec": runtime["spec"]})

    cluster.api.delete(JOBSETS, "default", "mnist")  # the JobSet must be built again, from the snapshot
    rebuilt = wait_for(
        lambda: (js := cluster.jobset("mnist")) and js["metadata"]["uid"] != first["metadata"]["uid"] and js,
        what="the rebuilt JobSet",
    )

    image = lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"]  # noqa: E731
    assert image(rebuilt) == image(first) == "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"
    assert RUNTIME_SNAPSHOT_ANNOTATION in cluster.job("mnist")["metadata"]["annotations"]


def test_namespaced_runtime_is_found_only_in_the_jobs_namespace(cluster: Cluster) -> None:
    runtime = cluster.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")
    cluster.api.create(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainingRuntime",
            "metadata": {"name": "team-torch", "namespace": "team-a"},
            "spec": runtime["spec"],
        },
        TRAINING_RUNTIMES,
    )
    ref = {"name": "team-torch", "kind": "TrainingRuntime"}
    cluster.create_job("ours", namespace="team-a", runtimeRef=ref)
    cluster.create_job("theirs", namespace="team-b", runtimeRef=ref)

    wait_for(lambda: cluster.jobset("ours", "team-a"), what="the JobSet in team-a")
    job = wait_for_condition(cluster, "theirs", "Failed", namespace="team-b")
    assert condition(job, "Failed")["reason"] == "RuntimeNotFound"
    assert "in namespace 'team-b'" in condition(job, "Failed")["message"]
    assert cluster.jobset("theirs", "team-b") is None


def test_jobs_managed_elsewhere_are_left_alone(cluster: Cluster) -> None:
    cluster.create_job("queued", trainer=TWO_NODES, managedBy="kueue.x-k8s.io/multikueue")
    cluster.create_job("ours", trainer=TWO_NODES)
    wait_for(lambda: cluster.jobset("ours"), what="our JobSet")
    wait_for(
        lambda: any(r.method == "GET" and str(r.url).endswith("/trainjobs/queued") for r in cluster.operator_requests()),
        what="the operator to look at the job",
    )
    time.sleep(0.3)

    assert cluster.jobset("queued") is None
    assert "status" not in cluster.job("queued")
    assert not [r for r in cluster.operator_requests() if r.method != "GET" and "queued" in str(r.url)]


@pytest.mark.parametrize(
    ("spec", "reason", "message_part"),
    [
        ({"runtimeRef": {"name": "no-such-runtime"}}, "RuntimeNotFound", "available: torch-distributed, torch-distributed-volcano"),
        ({"runtimeRef": {"name": "x", "apiGroup": "example.com"}}, "InvalidRuntimeRef", "apiGroup='example.com'"),
        ({"trainer": {"numProcPerNode": "gpu"}}, "InvalidTrainJob", "spec.trainer.numProcPerNode"),
        (
            {"podTemplateOverrides": [{"targetJobs": [{"name": "launcher"}]}]},
            "InvalidTrainJob",
            "spec.podTemplateOverrides[0].targetJobs[0].name",
        ),
    ],
    ids=["unknown-runtime", "foreign-api-group", "gpu-without-gpus", "override-unknown-job"],
)
def test_invalid_jobs_fail_with_a_message_and_an_event(cluster: Cluster, spec: dict, reason: str, message_part: str) -> None:
    cluster.create_job("bad", **spec)

    job = wait_for_condition(cluster, "bad", "Failed")

    failed = condition(job, "Failed")
    assert failed["reason"] == reason
    assert message_part in failed["message"]
    assert cluster.jobset("bad") is None
    warnings = wait_for(lambda: [e for e in cluster.api.list_events("default", "bad") if e["type"] == "Warning"], what="event")
    assert warnings[0]["reason"] == reason and message_part in warnings[0]["message"]


def test_operator_restart_mid_job_picks_up_where_it_left(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")
    cluster.operator.stop()

    cluster.set_jobset_status("mnist", {"replicatedJobsStatus": READY})
    cluster.create_job("later", trainer=TWO_NODES)
    time.sleep(0.2)
    assert condition(cluster.job("mnist"), "Running") is None and cluster.jobset("later") is None
    cluster.operator.start()

    wait_for(lambda: has_condition(cluster.job("mnist"), "Running"), what="Running after the restart")
    wait_for(lambda: cluster.jobset("later"), what="the JobSet of the job created while the operator was down")
    creates = [r for r in cluster.operator_requests() if r.method == "POST" and "jobsets" in str(r.url)]
    assert sorted(r.data["metadata"]["name"] for r in creates) == ["later", "mnist"]


def test_standin_rejects_a_jobset_the_jobset_schema_rejects(cluster: Cluster) -> None:
    bad = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "broken", "namespace": "default"},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": "two", "template": {"spec": {"template": {}}}}]},
    }
    with pytest.raises(BackendError, match="422.*replicas"):
        cluster.api.create(bad)
