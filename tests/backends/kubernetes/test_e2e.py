"""End to end on a real control plane: TrainJob -> operator -> JobSet -> Jobs -> pods -> real DDP training.

Everything here is upstream and real: API server admission and validation, RBAC, the JobSet and Job controllers,
the garbage collector, the scheduler, and the nodes (kubelets with containerd) that run the pods from the training
image.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetest.cluster import TrainJobCluster, mount_shared_folders, no_retries, wait_for

from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOBSETS,
    PODS,
    RUNTIME_SNAPSHOT_ANNOTATION,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.status import find_condition

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "ddp_script.py")
SEEDS = HERE.parents[1] / "api" / "seed_manifests"


def torchrun(*args: str) -> list[str]:
    return ["torchrun", SCRIPT, *args]


def cpu_trainer(num_nodes: int = 2, *args: str, **extra: Any) -> dict[str, Any]:
    return {
        "numNodes": num_nodes,
        "command": torchrun(*args),
        "resourcesPerNode": {"requests": {"cpu": "1"}},
        **extra,
    }


def seed(name: str) -> dict[str, Any]:
    return yaml.safe_load((SEEDS / name).read_text())


def pod_logs(k8s: TrainJobCluster, job: str, namespace: str) -> dict[str, str]:
    """Every pod's log, read through the API server (which proxies to the node's kubelet endpoint)."""
    return {
        pod["metadata"]["name"]: k8s.api.core.read_namespaced_pod_log(pod["metadata"]["name"], namespace)
        for pod in k8s.pods(job, namespace)
    }


# -- training ----------------------------------------------------------------------------------------------------


def test_seed_runtime_and_trainjob_train_ddp_to_complete(k8s: TrainJobCluster) -> None:
    """Seed 000's ClusterTrainingRuntime and TrainJob as written, but for a runnable command and image (the seed's
    ``my-registry/mnist-training:v1.0`` is not in any registry here), GPUs scaled to CPU, and the shared folders
    every runtime here mounts.

    Its Volcano PodGroup is created against Volcano's real CRD (see ``scheduler_config`` for its pods)."""
    k8s.cp.install_podgroup_crds()
    runtime = seed("000-2.yaml")
    pod_spec = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
    k8s.cp.apply([mount_shared_folders(runtime, k8s.shared_folders)])
    job = seed("000-3.yaml")
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    k8s.cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    job["spec"]["trainer"].update(
        numNodes=2, command=torchrun("--steps", "5"), resourcesPerNode={"requests": {"cpu": "1"}},
        image=k8s.cp.training_image,
    )
    job["spec"]["trainer"].pop("args", None)
    k8s.api.create(job, TRAINJOBS)

    done = k8s.wait_for_condition(name, "Complete", namespace=namespace, timeout=240)
    assert done["status"]["jobsStatus"], "jobsStatus is reported"
    jobset = k8s.jobset(name, namespace)
    assert jobset is not None and jobset["metadata"]["ownerReferences"][0]["uid"] == done["metadata"]["uid"]
    assert find_condition(jobset["status"], "Completed")["status"] == "True"
    pods = k8s.pods(name, namespace)
    assert sorted(p["status"]["phase"] for p in pods) == ["Succeeded", "Succeeded"]
    podgroup = k8s.api.custom.get_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", name
    )
    assert podgroup["spec"]["minMember"] == 2
    logs = "\n".join(pod_logs(k8s, name, namespace).values())
    assert {line.split(" node ")[0] for line in logs.splitlines() if line.startswith("rank ")} >= {
        "rank 0/2",
        "rank 1/2",
    }
    assert "final loss" in logs
    # Each pod resolved the master by its JobSet host name through the cluster's DNS, in a container of its own.
    hosts = {line.rsplit(" host ", 1)[1] for line in logs.splitlines() if " host " in line}
    assert hosts == {f"{name}-node-0-0", f"{name}-node-0-1"}


def test_a_rank_that_raises_fails_the_job_with_its_exception(k8s: TrainJobCluster, namespace: str) -> None:
    runtime = k8s.namespaced_runtime(namespace, "no-retries", no_retries)
    k8s.create_job("broken", namespace, runtime=runtime, runtime_kind="TrainingRuntime",
                   trainer=cpu_trainer(2, "--fail-rank", "1", "--noise-lines", "150"))
    failed = k8s.wait_for_condition("broken", "Failed", namespace=namespace, timeout=180)
    message = find_condition(failed["status"], "Failed")["message"]
    assert message.startswith("node-1 rank 1: NameError: name 'undefined_learning_rate' is not defined"), message


#: A finalizer of the tests': a pod the suspension stopped stays in the API, Failed with its exit code, until the
#: test lets it go, as the Job controller sees it under load (the kubelet's final delete comes late).
HOLD = "trainjob.test/hold"


def _step(checkpoint: Path) -> int:
    """The step the job's rank 0 last checkpointed (``ddp_script.py --checkpoint``)."""
    path = checkpoint / "step"
    for _ in range(50):  # rank 0 rewrites the file after each step: a read may fall between truncate and write
        text = path.read_text().strip() if path.exists() else "0"
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path} stayed empty")


def _running_pods(k8s: TrainJobCluster, job: str, namespace: str) -> list[dict[str, Any]]:
    return [p for p in k8s.pods(job, namespace) if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def _exit_code(pod: dict[str, Any]) -> int | None:
    for status in pod["status"].get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return int(terminated["exitCode"])
    return None


def _resumed_at(k8s: TrainJobCluster, job: str, namespace: str) -> int | None:
    """The step rank 0 of the job's running pods said it resumes at, if it did."""
    for text in pod_logs(k8s, job, namespace).values():
        for line in text.splitlines():
            if "rank 0 resumes at step" in line:
                return int(line.rsplit(" ", 1)[1])
    return None


def _release(k8s: TrainJobCluster, job: str, namespace: str) -> None:
    for pod in k8s.pods(job, namespace):
        if HOLD in (pod["metadata"].get("finalizers") or []):
            k8s.api.patch(PODS, namespace, pod["metadata"]["name"], {"metadata": {"finalizers": None}})


def test_suspending_torchrun_never_fails_the_job_and_each_resume_continues_from_the_checkpoint(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    """torchrun on the built-in runtime (whose podFailurePolicy fails the Job on exit code 1), suspended and resumed
    ``TRAINJOB_SUSPEND_ROUNDS`` times (default 2). torchrun exits 1 on the SIGTERM a suspension sends; each pod is
    held by a finalizer once stopped, so the Job controller sees it Failed with that code, as it did under load
    when the job failed. The operator marks the pods ``DisruptionTarget`` before it suspends the JobSet, so the
    runtime's policy ignores them: Suspended each round, never Failed, and each resume goes on past its step."""
    rounds = int(os.environ.get("TRAINJOB_SUSPEND_ROUNDS", "2"))
    checkpoint = workdir / "ckpt"
    k8s.create_job("pausing", namespace, trainer=cpu_trainer(
        2, "--steps", "100000", "--step-seconds", "0.2", "--checkpoint", str(checkpoint)))
    seen: list[dict[str, Any]] = []
    try:
        for round_ in range(1, rounds + 1):
            previous = _step(checkpoint)
            wait_for(lambda: len(_running_pods(k8s, "pausing", namespace)) == 2, 180, f"round {round_}: two "
                     "running pods", every=0.5)
            wait_for(lambda since=previous: _step(checkpoint) >= since + 3, 120,  # type: ignore[misc]
                     f"round {round_}: 3 steps past {previous}", every=0.5)
            resumed_at = _resumed_at(k8s, "pausing", namespace) or 0
            for pod in k8s.pods("pausing", namespace):
                k8s.api.patch(PODS, namespace, pod["metadata"]["name"], {"metadata": {"finalizers": [HOLD]}})
            before = _step(checkpoint)
            k8s.api.patch(TRAINJOBS, namespace, "pausing", {"spec": {"suspend": True}})
            k8s.wait_for_condition("pausing", "Suspended", namespace=namespace, timeout=90)
            stopped = wait_for(lambda: (pods := k8s.pods("pausing", namespace)) and all(
                p["status"].get("phase") in ("Failed", "Succeeded") for p in pods) and pods, 90,
                f"round {round_}: the stopped pods held, finished")
            codes = sorted(code for p in stopped if (code := _exit_code(p)) is not None)
            marks = sorted({c.get("reason") for p in stopped for c in p["status"].get("conditions") or []
                            if c["type"] == "DisruptionTarget"})
            time.sleep(3)  # the Job controller syncs a finished pod within its 1 s batch period
            job, jobset = k8s.job("pausing", namespace), k8s.jobset("pausing", namespace) or {}
            failed = [c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == "Failed"]
            jobset_failed = [c for c in (jobset.get("status") or {}).get("conditions") or []
                             if c["type"] == "Failed" and c["status"] == "True"]
            seen.append({"round": round_, "exit_codes": codes, "marks": marks, "step_before": before,
                         "resumed_from": resumed_at, "trainjob_failed": failed, "jobset_failed": jobset_failed})
            assert not failed and not jobset_failed, f"suspending failed the job: {seen}"
            _release(k8s, "pausing", namespace)
            wait_for(lambda: not k8s.pods("pausing", namespace), 90, f"round {round_}: the pods gone")
            k8s.api.patch(TRAINJOBS, namespace, "pausing", {"spec": {"suspend": False}})
            # resumed, the job carries no condition again: what the Kubeflow SDK needs to report it Running
            wait_for(lambda: not (k8s.job("pausing", namespace).get("status") or {}).get("conditions"), 90,
                     f"round {round_}: the Suspended condition removed (job status: "
                     f"{k8s.job('pausing', namespace).get('status')})")
        wait_for(lambda: len(_running_pods(k8s, "pausing", namespace)) == 2, 180, "the last resume running",
                 every=0.5)
        last = wait_for(lambda: _resumed_at(k8s, "pausing", namespace), 120, "the last resume's first line",
                        every=1.0)
        seen.append({"round": "after", "resumed_from": last, "step_before": last})
    finally:
        _release(k8s, "pausing", namespace)
        print("suspend rounds:", json.dumps(seen))
    rounds_seen = [r for r in seen if r["round"] != "after"]
    assert all(1 in r["exit_codes"] for r in rounds_seen), f"torchrun no longer exits 1 on SIGTERM: {seen}"
    assert all(r["marks"] == ["TrainJobSuspended"] for r in rounds_seen), seen
    # each resume went on from the checkpoint the round before left (never from the start)
    assert all(later["resumed_from"] >= earlier["step_before"] > 0
               for earlier, later in zip(seen, seen[1:], strict=False)), seen
    k8s.api.delete(TRAINJOBS, namespace, "pausing")


def test_an_evicted_pod_restarts_its_group_from_the_checkpoint_without_spending_a_restart(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    """One pod of a 2-node torchrun group evicted through the Eviction API (what ``kubectl drain`` does): its peer's
    collectives would fail (exit 1, the code's failure) and fail the job; the operator stops the peer with it,
    marked, so the group restarts together from its checkpoint, the JobSet's restarts untouched, and completes."""
    checkpoint = workdir / "ckpt"
    k8s.create_job("evicted", namespace, trainer=cpu_trainer(
        2, "--steps", "40", "--step-seconds", "0.25", "--checkpoint", str(checkpoint)))
    wait_for(lambda: len(_running_pods(k8s, "evicted", namespace)) == 2, 180, "two running pods", every=0.5)
    wait_for(lambda: _step(checkpoint) >= 5, 120, "5 steps trained", every=0.5)
    first = {p["metadata"]["uid"] for p in k8s.pods("evicted", namespace)}
    victim = next(p for p in k8s.pods("evicted", namespace)
                  if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "1")
    evicted_at = _step(checkpoint)
    assert k8s.api.evict(namespace, victim["metadata"]["name"])
    k8s.wait_for_condition("evicted", "Complete", namespace=namespace, timeout=300)
    events = [(e.get("reason"), e.get("message")) for e in k8s.api.list_events(namespace, "evicted")]
    disrupted = [m for r, m in events if r == "Disrupted"]
    assert disrupted and f"pod {victim['metadata']['name']} was evicted" in disrupted[0], events
    jobset = k8s.jobset("evicted", namespace)
    if jobset is not None:
        assert int((jobset.get("status") or {}).get("restarts") or 0) == 0, jobset.get("status")
    logs = "\n".join(pod_logs(k8s, "evicted", namespace).values())
    assert not first & {p["metadata"]["uid"] for p in k8s.pods("evicted", namespace)}, "both pods were replaced"
    resumed = [int(line.rsplit(" ", 1)[1]) for line in logs.splitlines() if "rank 0 resumes at step" in line]
    assert resumed and resumed[0] >= evicted_at, (evicted_at, logs[-2000:])
    print("eviction:", json.dumps({"evicted_at_step": evicted_at, "resumed_at_step": resumed[0],
                                   "disrupted_event": disrupted[0]}))


def test_pods_no_node_can_hold_are_named_in_the_status_and_the_job_waits(k8s: TrainJobCluster,
                                                                        namespace: str) -> None:
    """More CPU per node than any node has (seed 000 asks ``cpu: "2"`` of 2-CPU nodes): the pods stay Pending and
    the job says why, in a condition ``kubectl get trainjobs`` shows and in an event, without failing."""
    k8s.create_job("too-big", namespace, annotations={"trainjob/unschedulable-grace-seconds": "0"},
                   trainer=cpu_trainer(2, "--steps", "1", resourcesPerNode={"requests": {"cpu": "64"}}))
    job = k8s.wait_for_condition("too-big", "Unschedulable", namespace=namespace, timeout=60)
    condition = find_condition(job["status"], "Unschedulable")
    assert condition["reason"] == "PodsUnschedulable" and "Insufficient cpu" in condition["message"], condition
    assert "the job waits for capacity, it is not failed" in condition["message"]
    shown = k8s.kubectl("get", "trainjobs", "too-big", "-n", namespace).stdout
    assert "Unschedulable" in shown, shown
    events = [e.get("reason") for e in k8s.api.list_events(namespace, "too-big")]
    assert "PodsUnschedulable" in events, events
    k8s.api.delete(TRAINJOBS, namespace, "too-big")


def test_active_deadline_fails_the_job_and_stops_its_pods(k8s: TrainJobCluster, namespace: str) -> None:
    k8s.create_job(
        "slow", namespace, activeDeadlineSeconds=8, trainer=cpu_trainer(1, "--steps", "400", "--step-seconds", "1")
    )
    failed = k8s.wait_for_condition("slow", "Failed", namespace=namespace, timeout=90)
    assert find_condition(failed["status"], "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: k8s.jobset("slow", namespace) is None, 60, "the JobSet to be deleted")
    wait_for(lambda: not k8s.pods("slow", namespace), 60, "the pods to be gone")


def test_elastic_runtime_restarts_after_a_failure_and_resumes(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    """An elastic runtime: torchrun restarts the failed workers in place (``maxRestarts``), and where that cannot
    recover (a node's torchrun gives up), JobSet's failurePolicy restarts the node group, as the runtime asks.
    Either way the job resumes from its checkpoint and completes."""

    def elastic(spec: dict[str, Any]) -> None:
        spec["mlPolicy"].pop("numNodes", None)  # elasticPolicy decides the node count
        spec["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 1, "maxNodes": 2, "maxRestarts": 3}
        spec["template"]["spec"]["failurePolicy"] = {"maxRestarts": 3}
        no_retries(spec)

    k8s.namespaced_runtime(namespace, "elastic", elastic)
    checkpoint = workdir / "ckpt"
    command = torchrun("--steps", "6", "--fail-rank", "1", "--fail-once", str(workdir / "failed-once"),
                       "--checkpoint", str(checkpoint))
    k8s.create_job(
        "elastic-job",
        namespace,
        runtime="elastic",
        runtime_kind="TrainingRuntime",
        trainer={"command": command, "resourcesPerNode": {"requests": {"cpu": "1"}}},
    )
    k8s.wait_for_condition("elastic-job", "Complete", namespace=namespace, timeout=300)
    assert (workdir / "failed-once").exists(), "the first attempt failed as planned"
    logs = "\n".join(pod_logs(k8s, "elastic-job", namespace).values())
    assert "resumes at step" in logs, logs[-3000:]


def test_progress_reported_in_the_job_reaches_its_trainer_status(k8s: TrainJobCluster, namespace: str) -> None:
    """``update_trainjob_status`` on rank 0 becomes ``status.trainerStatus`` (Kubeflow v2.2 shape) while the job
    runs, and the SDK's view and ``trainjob get`` read it from there."""
    from trainjob.backends.kubernetes.backend import KubernetesBackend
    from trainjob.backends.kubernetes.config import KubernetesBackendConfig

    k8s.create_job("reporting", namespace,
                   trainer=cpu_trainer(2, "--steps", "20", "--step-seconds", "0.5", "--progress"))

    def running_status() -> dict[str, Any] | None:
        job = k8s.api.get(TRAINJOBS, namespace, "reporting") or {}
        status = (job.get("status") or {}).get("trainerStatus")
        running = not find_condition(job.get("status") or {}, "Complete")
        return status if status and running and 0 < status.get("progressPercentage", 0) < 100 else None

    wait_for(running_status, 120, "a trainerStatus while the job runs")
    status = running_status() or {}
    names = {m["name"] for m in status["metrics"]}
    assert {"loss", "step"} <= names and status["lastUpdatedTime"].endswith("Z"), status
    assert status["estimatedRemainingSeconds"] <= 30
    done = k8s.wait_for_condition("reporting", "Complete", namespace=namespace, timeout=240)
    final = done["status"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0, final
    config = KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig))
    view = KubernetesBackend(config).get_job("reporting")
    assert view.progress is not None and view.progress.percent == 100


def test_a_finished_job_past_its_ttl_is_deleted_with_everything_it_made(
    k8s: TrainJobCluster, namespace: str
) -> None:
    k8s.create_job("shortlived", namespace, trainer=cpu_trainer(1, "--steps", "2"),
                   annotations={"trainjob/ttl-seconds-after-finished": "3"})
    k8s.create_job("kept", namespace, trainer=cpu_trainer(1, "--steps", "2"))
    k8s.wait_for_condition("kept", "Complete", namespace=namespace, timeout=180)
    wait_for(lambda: k8s.api.get(TRAINJOBS, namespace, "shortlived") is None, 120, "the TTL to delete the job")
    wait_for(lambda: k8s.jobset("shortlived", namespace) is None and not k8s.pods("shortlived", namespace), 90,
             "its JobSet and pods to be gone")
    time.sleep(4)
    assert k8s.api.get(TRAINJOBS, namespace, "kept") is not None, "a job without a TTL stays"


def test_an_mpi_job_gets_its_key_secret_hostfile_and_launcher(k8s: TrainJobCluster, namespace: str) -> None:
    """The operator creates what an MPI runtime renders: the SSH key Secret, the hostfile ConfigMap (both owned by
    the TrainJob) and a JobSet with a launcher and the nodes. Created suspended: the training image has no sshd."""
    k8s.create_job("mpi-pi", namespace, runtime="mpi-distributed", suspend=True,
                   trainer={"numNodes": 2, "command": ["mpirun", "-n", "2", "python", "pi.py"]})
    wait_for(lambda: k8s.jobset("mpi-pi", namespace), 60, "the JobSet")
    job = k8s.api.get(TRAINJOBS, namespace, "mpi-pi")
    secret = k8s.api.core.read_namespaced_secret("mpi-pi-mpi-ssh-auth", namespace)
    hostfile = k8s.api.core.read_namespaced_config_map("mpi-pi-mpi-hostfile", namespace)
    for obj in (secret, hostfile):
        assert [ref.uid for ref in obj.metadata.owner_references] == [job["metadata"]["uid"]]
    assert secret.type == "kubernetes.io/ssh-auth" and "ssh-privatekey" in secret.data
    assert hostfile.data["hostfile"].split("\n")[:2] == [
        "mpi-pi-node-0-0.mpi-pi slots=1", "mpi-pi-node-0-1.mpi-pi slots=1"
    ], hostfile.data
    jobset = k8s.jobset("mpi-pi", namespace)
    assert [rj["name"] for rj in jobset["spec"]["replicatedJobs"]] == ["launcher", "node"]
    k8s.api.delete(TRAINJOBS, namespace, "mpi-pi")


# -- life cycle ---------------------------------------------------------------------------------------------------


def test_deleting_the_trainjob_lets_the_garbage_collector_remove_everything(
    k8s: TrainJobCluster, namespace: str
) -> None:
    k8s.create_job("doomed", namespace, trainer=cpu_trainer(2, "--steps", "400", "--step-seconds", "0.5"))
    wait_for(lambda: len(k8s.pods("doomed", namespace)) == 2, 120, "the pods")
    assert k8s.batch_jobs("doomed", namespace)
    k8s.api.delete(TRAINJOBS, namespace, "doomed")
    wait_for(
        lambda: k8s.jobset("doomed", namespace) is None
        and not k8s.batch_jobs("doomed", namespace)
        and not k8s.pods("doomed", namespace),
        90,
        "the garbage collector to remove the JobSet, its Jobs and pods",
    )


def test_operator_killed_mid_job_resumes_and_creates_nothing_twice(
    operator_running: TrainJobCluster, namespace: str
) -> None:
    k8s = operator_running
    k8s.create_job("survivor", namespace, trainer=cpu_trainer(2, "--steps", "30", "--step-seconds", "0.3"))
    wait_for(lambda: len(k8s.pods("survivor", namespace)) == 2, 120, "the pods")
    jobset_uid = k8s.jobset("survivor", namespace)["metadata"]["uid"]
    k8s.operator.kill()
    time.sleep(2)
    k8s.operator.start()
    k8s.wait_for_condition("survivor", "Complete", namespace=namespace, timeout=240)
    assert k8s.jobset("survivor", namespace)["metadata"]["uid"] == jobset_uid, "the JobSet was recreated"
    created = [
        e
        for e in k8s.api.list_events(namespace, "survivor")
        if e["reason"] == "JobSetCreated"
    ]
    assert len(created) == 1, created


def test_a_namespaced_runtime_is_invisible_from_other_namespaces(
    k8s: TrainJobCluster, namespace: str
) -> None:
    k8s.namespaced_runtime(namespace, "team-only")
    other = f"{namespace}-other"
    k8s.cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}}])
    k8s.create_job(
        "outsider", other, runtime="team-only", runtime_kind="TrainingRuntime", suspend=True, trainer=cpu_trainer(1)
    )
    failed = k8s.wait_for_condition("outsider", "Failed", namespace=other, timeout=30)
    cond = find_condition(failed["status"], "Failed")
    assert cond["reason"] == "RuntimeNotFound" and other in cond["message"]
    assert k8s.jobset("outsider", other) is None

    k8s.create_job("insider", namespace, runtime="team-only", runtime_kind="TrainingRuntime", suspend=True,
                   trainer=cpu_trainer(1))
    wait_for(lambda: k8s.jobset("insider", namespace), 30, "the JobSet of the job in the runtime's namespace")

    k8s.create_job("lost", namespace, runtime="no-such-runtime", suspend=True, trainer=cpu_trainer(1))
    failed = k8s.wait_for_condition("lost", "Failed", namespace=namespace, timeout=30)
    message = find_condition(failed["status"], "Failed")["message"]
    assert "no-such-runtime" in message and "torch-distributed" in message, message


@pytest.mark.parametrize("policy", ["coscheduling", "volcano"])
def test_podgroups_are_accepted_by_their_real_crds(k8s: TrainJobCluster, namespace: str, policy: str) -> None:
    k8s.cp.install_podgroup_crds()
    def gang(spec: dict[str, Any]) -> None:
        spec["podGroupPolicy"] = {policy: {"scheduleTimeoutSeconds": 60} if policy == "coscheduling" else {}}

    k8s.namespaced_runtime(namespace, f"gang-{policy}", gang)
    k8s.create_job("gang", namespace, runtime=f"gang-{policy}", runtime_kind="TrainingRuntime", suspend=True,
                   trainer=cpu_trainer(2))
    wait_for(lambda: k8s.jobset("gang", namespace), 30, "the JobSet")
    group = "scheduling.x-k8s.io" if policy == "coscheduling" else "scheduling.volcano.sh"
    version = "v1alpha1" if policy == "coscheduling" else "v1beta1"
    podgroup = k8s.api.custom.get_namespaced_custom_object(group, version, namespace, "podgroups", "gang")
    assert podgroup["spec"]["minMember"] == 2
    assert find_condition(k8s.job("gang", namespace).get("status") or {}, "Failed") is None


def test_seed_gpu_trainjob_as_written_is_accepted_by_the_api_server(k8s: TrainJobCluster, namespace: str) -> None:
    """Seed 000's TrainJob requests nvidia.com/gpu without a limit; the API server needs limits == requests."""
    job = seed("000-0.yaml")
    job["metadata"]["namespace"] = namespace
    job["spec"]["suspend"] = True  # accepted is what is checked; there are no GPUs to run it on
    k8s.api.create(job, TRAINJOBS)
    jobset = wait_for(lambda: k8s.jobset(job["metadata"]["name"], namespace), 30, "the JobSet")
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == container["resources"]["requests"]["nvidia.com/gpu"]
    reasons = [e["reason"] for e in k8s.api.list_events(namespace, job["metadata"]["name"])]
    assert "ExtendedResourceLimitsSet" in reasons


# -- security -----------------------------------------------------------------------------------------------------


def test_a_forged_runtime_snapshot_is_ignored(k8s: TrainJobCluster, namespace: str) -> None:
    """A user-written snapshot annotation must not decide what the operator creates (privilege through it)."""
    forged_spec = copy.deepcopy(k8s.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")["spec"])
    pod = forged_spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod.update(hostPID=True, hostNetwork=True, serviceAccountName="trainjob-operator")
    pod["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    forged = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed", "spec": forged_spec}

    k8s.api.create(
        {
            "apiVersion": TRAINJOBS.api_version,
            "kind": "TrainJob",
            "metadata": {
                "name": "forger",
                "namespace": namespace,
                "annotations": {RUNTIME_SNAPSHOT_ANNOTATION: json.dumps(forged)},
            },
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True, "trainer": cpu_trainer(1)},
        },
        TRAINJOBS,
    )
    jobset = wait_for(lambda: k8s.jobset("forger", namespace), 30, "the JobSet")
    pod_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert not pod_spec.get("hostPID") and not pod_spec.get("hostNetwork")
    assert pod_spec.get("serviceAccountName") != "trainjob-operator"
    assert not any((v.get("hostPath") or {}).get("path") == "/" for v in pod_spec.get("volumes") or [])
    annotations = k8s.job("forger", namespace)["metadata"].get("annotations") or {}
    assert json.dumps(forged) != annotations.get(RUNTIME_SNAPSHOT_ANNOTATION)


def test_the_jobset_webhook_and_schemas_are_real(k8s: TrainJobCluster, namespace: str) -> None:
    """JobSet's own validating webhook refuses what its schema allows but its rules do not."""
    from trainjob.errors import TrainJobError

    bad = {
        "apiVersion": JOBSETS.api_version,
        "kind": "JobSet",
        "metadata": {"name": "Bad_Name", "namespace": namespace},
        "spec": {"replicatedJobs": []},
    }
    with pytest.raises(TrainJobError):
        k8s.api.create(bad)


# -- least privilege (keep last: it reads what the tests above made the operator do) ---------------------------------


def _granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_operator_role_grants_exactly_what_the_operator_used(k8s: TrainJobCluster) -> None:
    """Every verb of the operator's ClusterRole and Role, against the audit log of the real API server."""
    from trainjob.backends.kubernetes.manifests import rbac

    requests = k8s.cp.audit_requests()
    if len(requests) < 50:
        pytest.skip("run the whole module: this test checks what the tests above made the operator do")
    if not any(r.get("objectRef", {}).get("resource") == "pytorchjobs" and r["verb"] == "delete" for r in requests):
        pytest.skip("run test_pytorchjob_v1.py in the same session: the operator's PyTorchJob rights are checked "
                    "against what it did there")
    if not any(r.get("objectRef", {}).get("resource") == "leases" for r in requests):
        pytest.skip("run test_operator_replicas.py in the same session: the operator's Lease rights are checked "
                    "against what its replicas did there")
    used = {
        (r["objectRef"].get("apiGroup", ""), "/".join(filter(None, [r["objectRef"]["resource"],
                                                                   r["objectRef"].get("subresource")])), r["verb"])
        for r in requests
        if r.get("objectRef") and r["responseStatus"]["code"] != 403
    }
    # Refusals by RBAC only: a namespace a test deletes also answers 403 to new objects (an event posted a moment
    # late, "being terminated") after RBAC allowed the request. A restarted kube-apiserver refuses the operator
    # until its RBAC caches have loaded, naming roles that exist "not found"; the operator retries those.
    restarts = [when for name, when in k8s.cp.restarts if name == "kube-apiserver"]
    forbidden = [
        (r["verb"], r["requestURI"]) for r in requests if r["responseStatus"]["code"] == 403
        and _authorization(r, "decision") != "allow" and not _refused_while_rbac_loads(r, restarts)
    ]
    granted = set()
    for obj in rbac():
        if obj["kind"] in ("ClusterRole", "Role"):
            granted |= _granted(obj["rules"])
    print("verbs the operator exercised:", *sorted(used), sep="\n  ")
    assert not forbidden, f"the API server refused the operator: {forbidden}"
    assert used <= granted, f"used but not granted: {sorted(used - granted)}"
    assert granted - RARELY_USED == used - RARELY_USED, f"granted but never used: {sorted(granted - used - RARELY_USED)}"


def _authorization(request: dict[str, Any], key: str) -> str:
    return (request.get("annotations") or {}).get(f"authorization.k8s.io/{key}") or ""


def _refused_while_rbac_loads(request: dict[str, Any], restarts: list[float], within: float = 60.0) -> bool:
    """A refusal by a kube-apiserver restarted less than ``within`` seconds before, whose RBAC caches were still
    loading: no reason given, or roles and bindings "not found" (a permission really missing says neither)."""
    reason = _authorization(request, "reason")
    when = _unix(request["requestReceivedTimestamp"])
    return (not reason or "not found" in reason) and any(0 <= when - start < within for start in restarts)


def _unix(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


#: Rights for paths no test here is sure to take, each one the operator's code does take when it happens.
RARELY_USED = {
    ("jobset.x-k8s.io", "jobsets", "get"),  # a JobSet create that met one its watch had not delivered yet (409)
    ("trainer.kubeflow.org", "clustertrainingruntimes", "get"),  # a runtime created a moment before its job,
    ("trainer.kubeflow.org", "trainingruntimes", "get"),  # not yet delivered by the watch
    ("", "secrets", "update"),  # the status endpoint's certificate issued again for a new host name
    ("", "configmaps", "get"),  # a namespace's CA ConfigMap made before this operator started (its create: 409)
    ("", "configmaps", "patch"),  # one whose CA differs from the operator's
}
