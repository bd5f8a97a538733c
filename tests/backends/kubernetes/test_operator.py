"""The real kopf operator against the API stand-in: create, status, suspend, deadline, snapshot, managedBy, restart.

The stand-in validates every object written to it (JobSets against the JobSet CRD and Kubernetes' Job schema,
TrainJob status against our CRD, Events against Kubernetes' schema), so a passing test also means the operator sent
only valid objects.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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
    jobset_condition,
    wait_for,
    wait_for_condition,
    write_kubeconfig,
)
from trainjob.backends.kubernetes.testing.server import StandInServer
from trainjob.errors import BackendError

TWO_NODES = {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", "train.py"]}


def trainer_container(template_owner: dict) -> dict:
    """The trainer container of a JobSet or a runtime (its first replicated job)."""
    spec = template_owner["spec"]
    jobset_spec = spec["template"]["spec"] if "template" in spec else spec
    return jobset_spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


def trainer_env(jobset: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer_container(jobset)["env"]}


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
                    jobset_condition("Completed", "AllJobsCompleted", "jobset completed successfully")
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
                    jobset_condition("Failed", "FailedJobs", "jobset failed due to reaching max restarts")
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
    jobset_writes = [
        r for r in cluster.operator_requests() if r.method == "PATCH" and "jobsets" in str(r.url)
    ]
    assert [r.data["spec"] for r in jobset_writes] == [{"suspend": False}]


def test_deadline_fails_the_job_and_deletes_the_jobset(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer=TWO_NODES, activeDeadlineSeconds=1)
    wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")

    job = wait_for_condition(cluster, "mnist", "Failed", timeout=6)

    assert condition(job, "Failed")["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds=1" in condition(job, "Failed")["message"]
    wait_for(lambda: cluster.jobset("mnist") is None, what="the JobSet to be deleted")
    wait_for(lambda: ("Warning", "DeadlineExceeded") in events(cluster, "mnist"), what="the DeadlineExceeded event")


def test_editing_the_runtime_does_not_change_a_started_job(cluster: Cluster) -> None:
    cluster.create_job("mnist", trainer={"numNodes": 2, "numProcPerNode": 1})
    first = wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")
    runtime = cluster.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")
    trainer_container(runtime)["image"] = "registry.example.com/edited:2"
    cluster.api.patch(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed", {"spec": runtime["spec"]})

    cluster.api.delete(JOBSETS, "default", "mnist")  # the JobSet must be built again, from the snapshot
    rebuilt = wait_for(
        lambda: (js := cluster.jobset("mnist")) and js["metadata"]["uid"] != first["metadata"]["uid"] and js,
        what="the rebuilt JobSet",
    )

    images = {trainer_container(js)["image"] for js in (first, rebuilt)}
    assert images == {"pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"}
    edited = cluster.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")
    assert trainer_container(edited)["image"] == "registry.example.com/edited:2"  # the edit did land
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
        lambda: any(
            r.method == "GET" and str(r.url).endswith("/trainjobs/queued")
            for r in cluster.operator_requests()
        ),
        what="the operator to look at the job",
    )
    time.sleep(0.3)

    assert cluster.jobset("queued") is None
    assert "status" not in cluster.job("queued")
    assert not [r for r in cluster.operator_requests() if r.method != "GET" and "queued" in str(r.url)]


@pytest.mark.parametrize(
    ("spec", "reason", "message_part"),
    [
        (
            {"runtimeRef": {"name": "no-such-runtime"}},
            "RuntimeNotFound",
            "available: torch-distributed, torch-distributed-volcano",
        ),
        (
            {"runtimeRef": {"name": "x", "apiGroup": "example.com"}},
            "InvalidRuntimeRef",
            "apiGroup='example.com'",
        ),
        ({"trainer": {"numProcPerNode": "gpu"}}, "InvalidTrainJob", "spec.trainer.numProcPerNode"),
        (
            {"podTemplateOverrides": [{"targetJobs": [{"name": "launcher"}]}]},
            "InvalidTrainJob",
            "spec.podTemplateOverrides[0].targetJobs[0].name",
        ),
    ],
    ids=["unknown-runtime", "foreign-api-group", "gpu-without-gpus", "override-unknown-job"],
)
def test_invalid_jobs_fail_with_a_message_and_an_event(
    cluster: Cluster, spec: dict, reason: str, message_part: str
) -> None:
    cluster.create_job("bad", **spec)

    job = wait_for_condition(cluster, "bad", "Failed")

    failed = condition(job, "Failed")
    assert failed["reason"] == reason
    assert message_part in failed["message"]
    assert cluster.jobset("bad") is None
    warnings = wait_for(
        lambda: [e for e in cluster.api.list_events("default", "bad") if e["type"] == "Warning"], what="event"
    )
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
    wait_for(
        lambda: cluster.jobset("later"), what="the JobSet of the job created while the operator was down"
    )
    creates = [r for r in cluster.operator_requests() if r.method == "POST" and "jobsets" in str(r.url)]
    assert sorted(r.data["metadata"]["name"] for r in creates) == ["later", "mnist"]


def test_standin_rejects_a_jobset_the_jobset_schema_rejects(cluster: Cluster) -> None:
    bad = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "broken", "namespace": "default"},
        "spec": {
            "replicatedJobs": [{"name": "node", "replicas": "two", "template": {"spec": {"template": {}}}}]
        },
    }
    with pytest.raises(BackendError, match="422.*replicas"):
        cluster.api.create(bad)


def test_trainjob_operator_command_serves_probes_reconciles_and_stops_on_sigint(
    standin: StandInServer, tmp_path: Path
) -> None:
    """The Deployment's command, as a process: liveness probe answers, jobs get JobSets, SIGINT stops it."""
    cluster = Cluster(standin, write_kubeconfig(tmp_path / "kubeconfig", standin.url))
    cluster.install_builtin_runtimes()
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "trainjob.cli.main",
        "operator",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--liveness",
        f"http://127.0.0.1:{port}/healthz",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cluster.create_job("mnist", trainer=TWO_NODES)
        wait_for(lambda: cluster.jobset("mnist"), 30, "the JobSet from `trainjob operator`")

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200 and "queue" in json.loads(response.read())
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output


def test_a_missing_podgroup_crd_fails_the_job_with_what_to_install(cluster: Cluster) -> None:
    cluster.server.remove_resource("scheduling.volcano.sh/v1beta1/podgroups")

    cluster.create_job("gang", runtimeRef={"name": "torch-distributed-volcano"}, trainer=TWO_NODES)

    failed = condition(wait_for_condition(cluster, "gang", "Failed"), "Failed")
    assert failed["reason"] == "CRDNotInstalled"
    assert "does not serve PodGroup (scheduling.volcano.sh/v1beta1): install Volcano" in failed["message"]
    assert cluster.jobset("gang") is None


def test_a_jobset_the_job_did_not_create_is_not_adopted(cluster: Cluster) -> None:
    cluster.create_job("other", trainer=TWO_NODES)
    foreign = wait_for(lambda: cluster.jobset("other"), what="a JobSet to copy")
    foreign["metadata"] = {"name": "mnist", "namespace": "default"}
    cluster.api.create(foreign)

    cluster.create_job("mnist", trainer=TWO_NODES)

    failed = condition(wait_for_condition(cluster, "mnist", "Failed"), "Failed")
    assert (
        failed["reason"] == "JobSetConflict"
        and "delete it or give the TrainJob another name" in failed["message"]
    )
    assert "ownerReferences" not in cluster.jobset("mnist")["metadata"]
