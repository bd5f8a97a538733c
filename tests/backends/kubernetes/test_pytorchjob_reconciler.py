"""The PyTorchJob (``kubeflow.org/v1``) reconcile as tables, without a cluster: the job and its pods in; the pods,
services and status one pass leaves, and the requests it made, out (:class:`kubetest.memory_api.MemoryApi`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubetest.memory_api import MemoryApi

from trainjob.backends.kubernetes.pytorchjob import PyTorchJobReconciler
from trainjob.backends.kubernetes.resources import PYTORCHJOBS, SERVICES
from trainjob.backends.kubernetes.status import timestamp

NS, NAME = "ml", "my-training"
START = 1_800_000_000.0
T0 = timestamp(START)
CONTAINER = {"name": "pytorch", "image": "img", "command": ["python", "train.py"]}


def pytorchjob(workers: int = 2, master: bool = True, restart: str = "OnFailure", **spec: Any) -> dict[str, Any]:
    template = {"spec": {"containers": [CONTAINER]}}
    specs: dict[str, Any] = {"Worker": {"replicas": workers, "restartPolicy": restart, "template": template}}
    if master:
        specs["Master"] = {"replicas": 1, "restartPolicy": restart, "template": template}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": NAME, "namespace": NS},
            "spec": {"pytorchReplicaSpecs": specs, **spec}}


Step = Callable[[MemoryApi, PyTorchJobReconciler], None]


def a_pass(api: MemoryApi, reconciler: PyTorchJobReconciler) -> None:
    reconciler.reconcile(NS, NAME)


def pod_is(pod: str, phase: str, exit_code: int | None = None, restarts: int = 0) -> Step:
    def step(api: MemoryApi, _: PyTorchJobReconciler) -> None:
        status: dict[str, Any] = {"phase": phase}
        if exit_code is not None or restarts:
            state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
            status["containerStatuses"] = [{"name": "pytorch", "state": state, "restartCount": restarts}]
        api.set_pod_status(NS, f"{NAME}-{pod}", status)

    return step


def crash_looping(pod: str, restarts: int, exit_code: int, last_words: str) -> Step:
    """The kubelet holds ``pod``'s container in CrashLoopBackOff after ``restarts`` runs; the last one exited
    ``exit_code`` with ``last_words`` as the end of its log (``FallbackToLogsOnError``)."""
    def step(api: MemoryApi, _: PyTorchJobReconciler) -> None:
        stored = api.pods[(NS, f"{NAME}-{pod}")]
        stored["status"] = {"phase": "Running", "containerStatuses": [{
            "name": "pytorch", "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": f"{last_words}\n"}}}]}
    return step


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


@dataclass
class Case:
    id: str
    job: dict[str, Any]
    before: Sequence[Step] = ()
    pods: dict[str, str] | None = None  # pod suffix -> phase after the pass (None: not checked)
    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (type, status, reason), in order
    message: str | None = None  # part of the last condition's message
    replica_statuses: dict[str, dict[str, int]] | None = None
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # pod suffix -> variables it must have
    job_gone: bool = False
    events: list[str] = field(default_factory=list)  # reasons posted in the pass under test


CASES = [
    Case("creates-master-and-workers-with-v1-env", pytorchjob(),
         pods={"master-0": "Pending", "worker-0": "Pending", "worker-1": "Pending"},
         conditions=[("Created", "True", "PyTorchJobCreated")],
         replica_statuses={"Master": {"active": 1}, "Worker": {"active": 2}},
         env={"master-0": {"MASTER_ADDR": f"{NAME}-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3",
                           "RANK": "0", "PET_NNODES": "3", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "auto",
                           "PET_MASTER_ADDR": f"{NAME}-master-0", "PET_MASTER_PORT": "23456"},
              "worker-1": {"RANK": "2", "PET_NODE_RANK": "2", "WORLD_SIZE": "3"}},
         events=["PyTorchJobCreated"]),
    Case("nproc-per-node-multiplies-world-size", pytorchjob(workers=1, nprocPerNode="2"),
         env={"worker-0": {"WORLD_SIZE": "4", "RANK": "1", "PET_NPROC_PER_NODE": "2"}}),
    Case("workers-only-rank-from-zero-without-master-addr", pytorchjob(workers=2, master=False),
         env={"worker-0": {"RANK": "0", "WORLD_SIZE": "2"}}),
    Case("elastic-policy-sets-nnodes-range-and-rendezvous",
         pytorchjob(workers=2, master=False, elasticPolicy={"minReplicas": 1, "maxReplicas": 4,
                                                            "rdzvBackend": "c10d", "maxRestarts": 3}),
         env={"worker-1": {"PET_NNODES": "1:4", "PET_RDZV_BACKEND": "c10d",
                           "PET_RDZV_ENDPOINT": f"{NAME}-worker-0:23456", "PET_MAX_RESTARTS": "3"}}),
    Case("running-once-the-master-runs", pytorchjob(),
         before=[a_pass, pod_is("master-0", "Running"), pod_is("worker-0", "Running")],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Running", "True", "PyTorchJobRunning")],
         replica_statuses={"Master": {"active": 1}, "Worker": {"active": 2}}),
    Case("succeeded-when-the-master-succeeded", pytorchjob(),
         before=[a_pass, pod_is("master-0", "Running"), a_pass, pod_is("master-0", "Succeeded", 0)],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Running", "False", "PyTorchJobRunning"),
                     ("Succeeded", "True", "PyTorchJobSucceeded")],
         replica_statuses={"Master": {"succeeded": 1}, "Worker": {"active": 2}},
         pods={"master-0": "Succeeded", "worker-0": "Pending", "worker-1": "Pending"},  # cleanPodPolicy None
         events=["PyTorchJobSucceeded"]),
    Case("clean-pod-policy-running-deletes-unfinished-pods-and-services",
         pytorchjob(runPolicy={"cleanPodPolicy": "Running"}),
         before=[a_pass, pod_is("master-0", "Succeeded", 0)],
         pods={"master-0": "Succeeded"}),
    Case("failed-pod-fails-the-job-naming-pod-and-exit-code", pytorchjob(restart="Never"),
         before=[a_pass, pod_is("worker-1", "Failed", 3)],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Failed", "True", "PyTorchJobFailed")],
         message=f"pod {NAME}-worker-1 exited with code 3",
         pods={"worker-1": "Failed"}),  # a failed job's unfinished pods are stopped
    Case("exit-code-policy-recreates-a-pod-killed-by-a-signal", pytorchjob(restart="ExitCode"),
         before=[a_pass, pod_is("worker-0", "Failed", 137)],
         pods={"master-0": "Pending", "worker-0": "Pending", "worker-1": "Pending"},
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Restarting", "True", "PyTorchJobRestarting")],
         events=["PyTorchJobRestarting"]),
    Case("exit-code-policy-does-not-retry-a-permanent-code", pytorchjob(restart="ExitCode"),
         before=[a_pass, pod_is("worker-0", "Failed", 1)],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Failed", "True", "PyTorchJobFailed")]),
    Case("a-crash-loop-is-restarting-naming-the-pod-and-its-last-words", pytorchjob(),
         before=[a_pass, pod_is("master-0", "Running"), crash_looping("worker-0", 6, 2,
                                                                     "python: can't open file '/x.py': [Errno 2]")],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Restarting", "True", "PyTorchJobRestarting")],
         message=(f"pod {NAME}-worker-0: container pytorch restarted 6 time(s), in CrashLoopBackOff; its last run "
                  "exited with code 2: python: can't open file '/x.py': [Errno 2]"),
         events=["PyTorchJobRestarting"]),
    Case("a-crash-loop-seen-again-posts-no-second-event", pytorchjob(),
         before=[a_pass, pod_is("master-0", "Running"), crash_looping("worker-0", 6, 2, "bad path"), a_pass],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Restarting", "True", "PyTorchJobRestarting")],
         events=[]),
    Case("past-backoff-limit-fails", pytorchjob(runPolicy={"backoffLimit": 2}),
         before=[a_pass, pod_is("worker-0", "Running", restarts=3)],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Failed", "True", "BackoffLimitExceeded")]),
    Case("past-active-deadline-fails", pytorchjob(runPolicy={"activeDeadlineSeconds": 10}),
         before=[a_pass, lambda api, r: setattr(r, "clock", lambda: START + 11)],
         conditions=[("Created", "True", "PyTorchJobCreated"), ("Failed", "True", "DeadlineExceeded")],
         pods={}),
    Case("ttl-deletes-the-finished-job", pytorchjob(runPolicy={"ttlSecondsAfterFinished": 5}),
         before=[a_pass, pod_is("master-0", "Succeeded", 0), a_pass,
                 lambda api, r: setattr(r, "clock", lambda: START + 6)],
         job_gone=True),
    Case("scheduling-policy-without-podgroup-crd-is-ignored-with-an-event",
         pytorchjob(runPolicy={"schedulingPolicy": {"minAvailable": 3}}),
         events=["PyTorchJobCreated", "PodGroupUnavailable"]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_pytorchjob_reconcile(case: Case) -> None:
    api = MemoryApi(clock=lambda: START, served=() if case.id.startswith("scheduling") else None)
    api.seed(copy.deepcopy(case.job), PYTORCHJOBS)
    reconciler = PyTorchJobReconciler(api, clock=lambda: START)
    for step in case.before:
        step(api, reconciler)
    posted = len(api.events)
    reconciler.reconcile(NS, NAME)

    job = api.stored(PYTORCHJOBS, NS, NAME)
    if case.job_gone:
        assert job is None
        return
    assert job is not None
    status = job.get("status") or {}
    pods = {name.removeprefix(f"{NAME}-"): pod for (_, name), pod in api.pods.items()}
    if case.pods is not None:
        assert {k: p["status"]["phase"] for k, p in pods.items()} == case.pods
    if case.conditions:
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == case.conditions
    if case.message:
        assert case.message in status["conditions"][-1]["message"]
    if case.replica_statuses is not None:
        counts = {k: {f: n for f, n in v.items() if f != "labelSelector"}
                  for k, v in status["replicaStatuses"].items()}
        assert counts == case.replica_statuses
    for suffix, wanted in case.env.items():
        assert env_of(pods[suffix]).items() >= wanted.items()
    if case.events:
        assert [e["reason"] for e in api.events[posted:]] == case.events


def test_pods_carry_v1_labels_host_names_and_a_headless_service_each() -> None:
    api = MemoryApi(clock=lambda: START)
    api.seed(pytorchjob(workers=1), PYTORCHJOBS)
    PyTorchJobReconciler(api, clock=lambda: START).reconcile(NS, NAME)
    master = api.pods[(NS, f"{NAME}-master-0")]
    assert master["metadata"]["labels"] == {
        "training.kubeflow.org/job-name": NAME, "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/replica-index": "0", "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/job-role": "master"}
    assert master["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    assert (master["spec"]["hostname"], master["spec"]["subdomain"]) == (f"{NAME}-master-0", f"{NAME}-master-0")
    service = api.stored(SERVICES, NS, f"{NAME}-worker-0")
    assert service is not None and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"]["training.kubeflow.org/replica-type"] == "worker"


def test_a_second_pass_without_changes_writes_nothing() -> None:
    api = MemoryApi(clock=lambda: START)
    api.seed(pytorchjob(), PYTORCHJOBS)
    reconciler = PyTorchJobReconciler(api, clock=lambda: START)
    reconciler.reconcile(NS, NAME)
    api.requests.clear()
    reconciler.reconcile(NS, NAME)
    assert api.requests == [("get", "pytorchjobs", f"{NS}/{NAME}"), ("list", "pods", NS)]
