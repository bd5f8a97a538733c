"""The operator's decisions on a real control plane: what it renders, what it refuses, what it leaves alone.

Jobs here are created suspended where the test is about the objects rather than the training, so no pod runs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster, wait_for
from kubetest.controlplane import free_port

from trainjob.backends.kubernetes.cache import WATCHED
from trainjob.backends.kubernetes.operator import (
    TRAINJOB_WATCHES,
    OperatorState,
    enqueue_trainjob,
    make_watches,
)
from trainjob.backends.kubernetes.pytorchjob import OPERATOR_NAME, OPERATOR_NAME_LABEL
from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOBS,
    JOBSET_NAME_LABEL,
    JOBSETS,
    PODS,
    RUNTIME_SNAPSHOT_ANNOTATION,
    TRAINJOB_NAME_LABEL,
    TRAINJOBS,
    ResourceRef,
)
from trainjob.backends.kubernetes.status import find_condition
from trainjob.constants import LAUNCH_ANNOTATION

TWO_NODES = {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", "train.py"]}


def trainer_container(owner: dict[str, Any]) -> dict[str, Any]:
    """The trainer container of a JobSet or a runtime (its first replicated job)."""
    spec = owner["spec"]
    jobset_spec = spec["template"]["spec"] if "template" in spec else spec
    return jobset_spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


def events(k8s: TrainJobCluster, namespace: str, name: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in k8s.api.list_events(namespace, name)]


def test_the_resolved_launch_values_are_recorded_on_the_jobset(k8s: TrainJobCluster, namespace: str) -> None:
    """``numProcPerNode: auto`` with 4 CPUs per node resolves to 4; the operator records that in the JobSet's
    ``trainjob/launch`` annotation (in the create: no request of its own), which ``trainjob get`` and
    ``logs --rank`` read instead of resolving again."""
    trainer = {"numNodes": 2, "numProcPerNode": "auto", "command": ["torchrun", "train.py"],
               "resourcesPerNode": {"requests": {"cpu": "4"}}}
    k8s.create_job("auto", namespace, suspend=True, trainer=trainer)
    jobset = wait_for(lambda: k8s.jobset("auto", namespace), 30, "the JobSet")
    assert json.loads(jobset["metadata"]["annotations"][LAUNCH_ANNOTATION]) == {
        "numNodes": 2, "numProcPerNode": 4, "masterPort": 29500}
    assert LAUNCH_ANNOTATION not in (k8s.job("auto", namespace)["metadata"].get("annotations") or {})
    shown = k8s.trainjob("get", "auto", "-n", namespace, f"--kubeconfig={k8s.kubeconfig}", "--backend=kubernetes")
    assert "2x4" in shown.stdout.replace(" ", ""), shown.stdout


def test_creates_a_jobset_owned_by_the_trainjob_with_the_torch_environment(
    k8s: TrainJobCluster, namespace: str
) -> None:
    job = k8s.create_job("mnist", namespace, suspend=True, trainer=TWO_NODES)
    jobset = wait_for(lambda: k8s.jobset("mnist", namespace), 30, "the JobSet")

    owner = jobset["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainJob", job["metadata"]["uid"], True)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer_container(jobset)["env"]}
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "1"
    assert env["PET_MASTER_ADDR"] == "mnist-node-0-0.mnist"
    assert env["PET_NODE_RANK"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert ("Normal", "JobSetCreated") in events(k8s, namespace, "mnist")
    wait_for(lambda: find_condition(k8s.job("mnist", namespace).get("status") or {}, "Suspended"), 30, "Suspended")


def test_editing_the_runtime_does_not_change_a_started_job(k8s: TrainJobCluster, namespace: str) -> None:
    """The snapshot decides, also when someone deletes the JobSet and it is built again (with a Warning)."""
    original = trainer_container(k8s.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed"))["image"]
    k8s.create_job("pinned", namespace, trainer=TWO_NODES | {"command": ["sleep", "600"]})
    first = wait_for(lambda: k8s.jobset("pinned", namespace), 30, "the JobSet")
    wait_for(lambda: (k8s.job("pinned", namespace).get("status") or {}).get("jobsStatus"), 60, "jobsStatus")
    runtime = k8s.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")
    trainer_container(runtime)["image"] = "registry.example.com/edited:2"
    k8s.api.patch(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed", {"spec": runtime["spec"]})
    try:
        k8s.api.delete(JOBSETS, namespace, "pinned")  # someone else deletes it
        rebuilt = wait_for(
            lambda: (js := k8s.jobset("pinned", namespace)) and js["metadata"]["uid"] != first["metadata"]["uid"] and js,
            60,
            "the rebuilt JobSet",
        )
    finally:
        trainer_container(runtime)["image"] = original
        k8s.api.patch(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed", {"spec": runtime["spec"]})
    assert trainer_container(rebuilt)["image"] == trainer_container(first)["image"] == original
    assert ("Warning", "JobSetRecreated") in events(k8s, namespace, "pinned")
    assert RUNTIME_SNAPSHOT_ANNOTATION in rebuilt["metadata"]["annotations"]  # carried over from the deleted one
    k8s.api.delete(TRAINJOBS, namespace, "pinned")


def test_jobs_managed_elsewhere_are_left_alone(k8s: TrainJobCluster, namespace: str) -> None:
    k8s.create_job("queued", namespace, suspend=True, trainer=TWO_NODES, managedBy="kueue.x-k8s.io/multikueue")
    k8s.create_job("ours", namespace, suspend=True, trainer=TWO_NODES)
    wait_for(lambda: k8s.jobset("ours", namespace), 30, "our JobSet")
    time.sleep(1)
    assert k8s.jobset("queued", namespace) is None
    assert "status" not in k8s.job("queued", namespace)
    writes = [
        r for r in k8s.cp.audit_requests()
        if r["verb"] not in ("get", "list", "watch") and (r.get("objectRef") or {}).get("name") == "queued"
    ]
    assert not writes, writes


@pytest.mark.parametrize(
    ("spec", "reason", "message_part"),
    [
        ({"runtimeRef": {"name": "no-such-runtime"}}, "RuntimeNotFound", "available: "),
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
def test_invalid_jobs_fail_with_a_message_and_an_event(
    k8s: TrainJobCluster, namespace: str, spec: dict[str, Any], reason: str, message_part: str
) -> None:
    body = {"runtimeRef": {"name": "torch-distributed"}, **spec}
    k8s.api.create(
        {"apiVersion": TRAINJOBS.api_version, "kind": "TrainJob", "metadata": {"name": "bad", "namespace": namespace},
         "spec": body},
        TRAINJOBS,
    )
    job = k8s.wait_for_condition("bad", "Failed", namespace=namespace, timeout=30)
    failed = find_condition(job["status"], "Failed")
    assert failed["reason"] == reason and message_part in failed["message"], failed
    assert k8s.jobset("bad", namespace) is None
    warnings = wait_for(
        lambda: [e for e in k8s.api.list_events(namespace, "bad") if e["type"] == "Warning"], 10, "an event"
    )
    assert warnings[0]["reason"] == reason and message_part in warnings[0]["message"]


def test_a_jobset_the_job_did_not_create_is_not_adopted(k8s: TrainJobCluster, namespace: str) -> None:
    k8s.create_job("other", namespace, suspend=True, trainer=TWO_NODES)
    foreign = wait_for(lambda: k8s.jobset("other", namespace), 30, "a JobSet to copy")
    foreign = {"apiVersion": foreign["apiVersion"], "kind": "JobSet",
               "metadata": {"name": "mnist", "namespace": namespace}, "spec": foreign["spec"]}
    k8s.api.create(foreign)
    k8s.create_job("mnist", namespace, suspend=True, trainer=TWO_NODES)
    failed = find_condition(k8s.wait_for_condition("mnist", "Failed", namespace=namespace, timeout=30)["status"],
                            "Failed")
    assert failed["reason"] == "JobSetConflict" and "delete it or give the TrainJob another name" in failed["message"]
    assert "ownerReferences" not in k8s.jobset("mnist", namespace)["metadata"]


def test_a_missing_podgroup_crd_fails_the_job_with_what_to_install(k8s: TrainJobCluster, namespace: str) -> None:
    import kubernetes.client

    ext = kubernetes.client.ApiextensionsV1Api(k8s.api.client)
    crd = "podgroups.scheduling.volcano.sh"
    try:
        ext.delete_custom_resource_definition(crd)
    except kubernetes.client.ApiException as exc:
        assert exc.status == 404
    wait_for(lambda: crd not in {c.metadata.name for c in ext.list_custom_resource_definition().items}, 60,
             "the Volcano PodGroup CRD to be gone")
    k8s.create_job("gang", namespace, runtime="torch-distributed-volcano", suspend=True, trainer=TWO_NODES)
    failed = find_condition(k8s.wait_for_condition("gang", "Failed", namespace=namespace, timeout=60)["status"],
                            "Failed")
    assert failed["reason"] == "CRDNotInstalled"
    assert "does not serve PodGroup (scheduling.volcano.sh/v1beta1): install Volcano" in failed["message"]
    assert k8s.jobset("gang", namespace) is None


def test_trainjob_operator_command_serves_probes_reconciles_and_stops_on_sigint(
    operator_running: TrainJobCluster, namespace: str
) -> None:
    """The Deployment's command, as a process with the operator's token: liveness answers, SIGINT stops it."""
    k8s = operator_running
    k8s.operator.stop()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainjob.cli.main", "operator", "--kubeconfig", str(k8s.operator_kubeconfig),
         "--liveness", f"http://127.0.0.1:{port}/healthz"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        k8s.create_job("probed", namespace, suspend=True, trainer=TWO_NODES)
        wait_for(lambda: k8s.jobset("probed", namespace), 60, "the JobSet from `trainjob operator`")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200 and "queue" in json.loads(response.read())
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output[-3000:]


@pytest.mark.parametrize(("resource", "selector"), [
    (JOBSETS, TRAINJOB_NAME_LABEL),
    (PODS, f"{OPERATOR_NAME_LABEL}={OPERATOR_NAME}"),
    (TRAINJOBS, ""),
    (JOBS, JOBSET_NAME_LABEL),
], ids=["jobsets-of-trainjobs", "pods-of-pytorchjobs", "every-trainjob", "child-jobs-of-jobsets"])
def test_the_api_server_filters_the_watched_pods_and_jobsets(resource: ResourceRef, selector: str) -> None:
    import asyncio

    state = OperatorState(api=None, reconciler=None, pytorchjobs=object())  # type: ignore[arg-type]
    watches = make_watches(state, asyncio.new_event_loop(), namespaces=["a", "b"])
    selectors = {(w.ref.plural, w.namespace): w.label_selector for w in watches._watches}
    assert selectors[(resource.plural, "a")] == selectors[(resource.plural, "b")] == selector
    assert (resource.plural, None) not in selectors
    assert selectors[(CLUSTER_TRAINING_RUNTIMES.plural, None)] == ""  # cluster-scoped: watched everywhere


def test_the_cache_serves_exactly_the_kinds_the_operator_watches() -> None:
    """A kind read from the cache but not watched would read as absent for ever; one watched but not served would
    be decoded for nothing."""
    assert set(WATCHED) == {ref for ref, _, _ in TRAINJOB_WATCHES}


@pytest.mark.parametrize(("event_type", "version", "queued"), [
    ("MODIFIED", "7", False),
    ("MODIFIED", "8", True),
    ("ADDED", "7", True),
    (None, "7", True),
], ids=["the-echo-of-our-write-is-not-queued", "a-newer-version-is-queued", "an-added-one-is-queued",
        "the-initial-listing-is-queued"])
def test_trainjob_events_queue_the_job_unless_they_echo_our_own_write(event_type: str | None, version: str,
                                                                         queued: bool) -> None:
    import asyncio

    def job(rv: str) -> dict[str, Any]:
        return {"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                "metadata": {"name": "mnist", "namespace": "ml", "resourceVersion": rv, "uid": "u"}}

    async def deliver() -> OperatorState:
        memo = OperatorState(api=None, reconciler=None)  # type: ignore[arg-type]  # the handler uses neither
        memo.cache.store(TRAINJOBS, job("7"))  # the answer to our status write
        enqueue_trainjob(memo, {"type": event_type, "object": job(version)})
        return memo

    memo = asyncio.run(deliver())
    assert len(memo.queue) == (1 if queued else 0)
