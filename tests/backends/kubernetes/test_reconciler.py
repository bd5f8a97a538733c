"""The operator's reconcile as tables, without a cluster: the cluster's objects in; the requests one pass makes, the
status it writes, the events it posts and when it wants to look again out.

The API server is :class:`kubetest.memory_api.MemoryApi`; the reconciler, the runtime framework, the status rules
and the signer run for real. Each case builds the cluster's state with ``before`` steps (a first pass of the
operator, the JobSet controller reporting, pods logging, a user editing the job), then runs the pass under test at
``START + later`` seconds.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubetest.memory_api import MemoryApi, Request, SyncedWatchCache

from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.job_events import RESTARTS_ANNOTATION
from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.manifests import builtin_runtimes
from trainjob.backends.kubernetes.progress import RESIZE_ANNOTATION
from trainjob.backends.kubernetes.reconcile import Reconciler
from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    COMPLETION_INDEX_LABEL,
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    JOBSET_NAME_LABEL,
    JOBSETS,
    REPLICATED_JOB_LABEL,
    RUNTIME_SNAPSHOT_ANNOTATION,
    TRAINING_RUNTIMES,
    TRAINJOB_NAME_LABEL,
    TRAINJOBS,
    VOLCANO_PODGROUPS,
    ResourceRef,
)
from trainjob.backends.kubernetes.snapshot import SnapshotSigner
from trainjob.backends.kubernetes.status import timestamp
from trainjob.backends.kubernetes.status_server import StatusEndpoint
from trainjob.constants import LAUNCH_ANNOTATION, TTL_ANNOTATION
from trainjob.errors import AlreadyExistsError

NS, NAME = "ml", "mnist"
START = 1_800_000_000.0  # 2027-01-15T08:00:00Z: the job and its JobSet are created then
SIGNER = SnapshotSigner(b"operator-key-" * 3)
TWO_NODES = {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", "train.py"]}

# -- the world before the pass ------------------------------------------------------------------------------------


class Clock:
    """The time the operator and the API server see; steps move it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    api: MemoryApi
    reconciler: Reconciler
    clock: Clock


Step = Callable[[World], None]


def trainjob(runtime: str = "torch-distributed", annotations: dict[str, str] | None = None, **spec: Any) -> dict:
    """TrainJob ``ml/mnist`` as a user creates it: two nodes of ``torchrun train.py`` unless ``spec`` says."""
    meta: dict[str, Any] = {"name": NAME, "namespace": NS}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": TRAINJOBS.kind,
        "metadata": meta,
        "spec": {"runtimeRef": {"name": runtime}, "trainer": TWO_NODES, **spec},
    }


def elastic_runtime() -> dict[str, Any]:
    """TrainingRuntime ``ml/elastic``: torch-distributed whose nodes rendezvous elastically, 2 to 3 of them."""
    runtime = next(r for r in builtin_runtimes() if r["metadata"]["name"] == "torch-distributed")
    spec = copy.deepcopy(runtime["spec"])
    spec["mlPolicy"].pop("numNodes", None)
    spec["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 2, "maxNodes": 3, "maxRestarts": 5}
    return {"apiVersion": TRAINING_RUNTIMES.api_version, "kind": TRAINING_RUNTIMES.kind,
            "metadata": {"name": "elastic", "namespace": NS}, "spec": spec}


def first_pass(world: World) -> None:
    """The operator has seen the job once (snapshot, JobSet, launch annotation)."""
    world.reconciler.reconcile(NS, NAME)


def another_pass(world: World) -> None:
    """The operator has seen the job again (and mirrored what the JobSet and pods say)."""
    world.reconciler.reconcile(NS, NAME)


def at(seconds: float) -> Step:
    """The clock reads ``START + seconds`` from this step on."""

    def step(world: World) -> None:
        world.clock.now = START + seconds

    return step


def jobset_reports(**status: Any) -> Step:
    """The JobSet controller writes the JobSet's status."""

    def step(world: World) -> None:
        world.api.set_status(JOBSETS, NS, NAME, status)

    return step


def trainer_jobs(**counts: int) -> dict[str, Any]:
    """``replicatedJobsStatus`` for the trainer's replicated job (counts of its Jobs)."""
    return {"replicatedJobsStatus": [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0,
                                      "suspended": 0, **counts}]}


def jobset_condition(type_: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": message}


def pod_runs(node: int, phase: str, log: str = "", terminated: dict[str, Any] | None = None) -> Step:
    """The pod of trainer node ``node`` exists (owned by the JobSet, as its Job's pods are for the collector),
    in ``phase``, its ``node`` container having logged ``log`` and, if given, ``terminated`` so."""

    def step(world: World) -> None:
        jobset = world.api.stored(JOBSETS, NS, NAME)
        assert jobset is not None
        status: dict[str, Any] = {"phase": phase}
        if terminated is not None:
            status["containerStatuses"] = [{"name": "node", "state": {"terminated": terminated}}]
        pod = {
            "metadata": {
                "name": f"{NAME}-node-0-{node}-x{node}", "namespace": NS,
                "labels": {JOBSET_NAME_LABEL: NAME, REPLICATED_JOB_LABEL: "node", COMPLETION_INDEX_LABEL: str(node)},
                "ownerReferences": [{"kind": "JobSet", "name": NAME, "uid": jobset["metadata"]["uid"]}],
            },
            "spec": {"containers": [{"name": "node"}]},
            "status": status,
        }
        world.api.add_pod(pod, {"node": log} if log else None)

    return step


def evicted(node: int) -> Step:
    """The Eviction API marks the pod of trainer node ``node`` ``DisruptionTarget`` and starts deleting it."""

    def step(world: World) -> None:
        pod = world.api.pods[(NS, f"{NAME}-node-0-{node}-x{node}")]
        pod["metadata"]["deletionTimestamp"] = timestamp(world.clock())
        pod["status"].setdefault("conditions", []).append({
            "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting", "lastTransitionTime": timestamp(world.clock())})

    return step


UNPLACED_MESSAGE = (f"2 pod(s) not placed since {timestamp(START + 5)}: 0/2 nodes are available: 2 Insufficient "
                    f"cpu. (pod {NAME}-node-0-0-x0); the job waits for capacity, it is not failed")


def unplaced(node: int, since: float) -> Step:
    """The pod of trainer node ``node`` exists and the scheduler has said since ``START + since`` that no node
    fits it."""

    def step(world: World) -> None:
        pod_runs(node, "Pending")(world)
        pod = world.api.pods[(NS, f"{NAME}-node-0-{node}-x{node}")]
        pod["status"]["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 Insufficient cpu.\n", "lastTransitionTime": timestamp(START + since)}]

    return step


def user_patches(patch: dict[str, Any]) -> Step:
    """Someone merge-patches the TrainJob (``kubectl patch --type=merge``)."""

    def step(world: World) -> None:
        world.api.patch(TRAINJOBS, NS, NAME, patch)

    return step


def someone_deletes_the_jobset(world: World) -> None:
    world.api.delete(JOBSETS, NS, NAME)


def someone_creates_a_jobset_of_that_name(world: World) -> None:
    world.api.create({"apiVersion": JOBSETS.api_version, "kind": JOBSETS.kind,
                      "metadata": {"name": NAME, "namespace": NS}, "spec": {"replicatedJobs": []}})


def being_deleted(world: World) -> None:
    job = world.api.objects[(TRAINJOBS.group, TRAINJOBS.plural, NS, NAME)]
    job["metadata"]["deletionTimestamp"] = timestamp(world.clock())


# -- what the pass should do ---------------------------------------------------------------------------------------


def get(resource: str, where: str = f"{NS}/{NAME}") -> Request:
    return ("get", resource, where)


def patch(resource: str, where: str = f"{NS}/{NAME}") -> Request:
    return ("patch", resource, where)


def create(resource: str, where: str = f"{NS}/{NAME}") -> Request:
    return ("create", resource, where)


def delete(resource: str, where: str = f"{NS}/{NAME}") -> Request:
    return ("delete", resource, where)


PATCH_JOB, PATCH_STATUS = patch("trainjobs"), patch("trainjobs/status")
EVENT = create("events")
LIST_PODS = ("list", "pods", NS)
#: What a pass over a new job asks of the API server: the JobSet created (with the signed runtime snapshot and the
#: launch values among its annotations) and the JobSetCreated event. The job, its runtime and the absent JobSet
#: come from the watch cache (here one that every watch event has reached: SyncedWatchCache).
CREATE_REQUESTS = [create("jobsets"), EVENT]


def log_of(node: int) -> Request:
    return get("pods/log", f"{NS}/{NAME}-node-0-{node}-x{node}")


def cond(type_: str, status: str, reason: str, message: str | Text, at: float = 0.0) -> dict[str, Any]:
    """A TrainJob condition that moved ``at`` seconds after ``START``."""
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": timestamp(START + at)}


@dataclass(frozen=True)
class Text:
    """Equal to any message that starts and ends so (for words another module's tests own)."""

    start: str
    end: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith(self.start) and other.endswith(self.end)

    def __hash__(self) -> int:
        return hash((self.start, self.end))


@dataclass
class Case:
    """One reconcile: the cluster before it and what it should do."""

    id: str
    job: dict[str, Any]
    before: Sequence[Step] = ()
    later: float = 0.0  # seconds after START of the pass under test (steps may have moved the clock further)
    requests: list[Request] = field(default_factory=list)
    any_order: bool = False  # the requests are compared as a multiset
    status: dict[str, Any] | None = None  # the TrainJob's status after the pass (None: it has none)
    events: list[tuple[str, str, str | Text]] = field(default_factory=list)  # (type, reason, message) posted
    again_in: float | None = None
    then: Callable[[World], None] | None = None  # anything else the case checks
    runtimes: Sequence[dict[str, Any]] = ()  # besides the built-in ClusterTrainingRuntimes
    served: Sequence[ResourceRef] | None = None  # the custom resources the cluster serves (None: all)


@dataclass
class Outcome:
    requests: list[Request]
    status: dict[str, Any] | None
    events: list[tuple[str, str, str]]
    again_in: float | None


def cluster_with(job: dict[str, Any], runtimes: Sequence[dict[str, Any]] = (),
                 served: Sequence[ResourceRef] | None = None) -> tuple[Clock, MemoryApi]:
    """The "cluster" at ``START``: the built-in runtimes (and ``runtimes``) and ``job``, nothing recorded yet."""
    clock = Clock(START)
    api = MemoryApi(clock, served=served)
    for runtime in [*builtin_runtimes(), *runtimes]:
        api.seed(runtime)
    api.seed(job)
    return clock, api


def reconcile(case: Case) -> tuple[Outcome, World]:
    clock, api = cluster_with(case.job, case.runtimes, case.served)
    world = World(api, Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api)), clock)
    for step in case.before:
        step(world)
    clock.now = max(clock.now, START + case.later)
    api.requests.clear()
    api.events.clear()
    again_in = world.reconciler.reconcile(NS, NAME)
    job = api.stored(TRAINJOBS, NS, NAME)
    events = [(e["type"], e["reason"], e["message"]) for e in api.events]
    return Outcome(list(api.requests), job.get("status") if job else None, events, again_in), world


# -- checks beyond the table's columns ----------------------------------------------------------------------------


def the_snapshot_is_the_runtime_signed(runtime: str, kind: str = "ClusterTrainingRuntime",
                                       on: str = "JobSet") -> Callable[[World], None]:
    """The snapshot signed for the job, on its JobSet (where the create carried it) or on the TrainJob."""

    def check(world: World) -> None:
        job = world.api.stored(TRAINJOBS, NS, NAME)
        assert job is not None
        carrier = world.api.stored(JOBSETS, NS, NAME) if on == "JobSet" else job
        assert carrier is not None
        ref = CLUSTER_TRAINING_RUNTIMES if kind == "ClusterTrainingRuntime" else TRAINING_RUNTIMES
        source = world.api.stored(ref, None if kind == "ClusterTrainingRuntime" else NS, runtime)
        assert source is not None
        assert SIGNER.verified(job, carrier) == {
            "kind": kind, "name": runtime, "resourceVersion": source["metadata"]["resourceVersion"],
            "labels": source["metadata"].get("labels") or {}, "spec": source["spec"],
        }

    return check


def created_jobset_owned_by_the_job(world: World) -> None:
    job, jobset = world.api.stored(TRAINJOBS, NS, NAME), world.api.stored(JOBSETS, NS, NAME)
    assert job is not None and jobset is not None
    assert jobset["metadata"]["ownerReferences"] == [{
        "apiVersion": TRAINJOBS.api_version, "kind": "TrainJob", "name": NAME, "uid": job["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }]
    assert jobset["metadata"]["labels"][TRAINJOB_NAME_LABEL] == NAME
    assert jobset["spec"]["suspend"] is False
    node = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert node["parallelism"] == 2
    env = {e["name"]: e.get("value") for e in node["template"]["spec"]["containers"][0]["env"]}
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("2", "1")
    assert json.loads(jobset["metadata"]["annotations"][LAUNCH_ANNOTATION]) == {
        "numNodes": 2, "numProcPerNode": 1, "masterPort": 29500,
    }
    the_snapshot_is_the_runtime_signed("torch-distributed")(world)


def created_a_volcano_podgroup_for_both_nodes(world: World) -> None:
    podgroup = world.api.stored(VOLCANO_PODGROUPS, NS, NAME)
    assert podgroup is not None and world.api.stored(COSCHEDULING_PODGROUPS, NS, NAME) is None
    assert podgroup["spec"]["minMember"] == 2
    job = world.api.stored(TRAINJOBS, NS, NAME)
    assert job is not None and podgroup["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    jobset = world.api.stored(JOBSETS, NS, NAME)
    assert jobset is not None
    pod_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod_spec["schedulerName"] == "volcano"


def jobset_suspend_is(value: bool) -> Callable[[World], None]:
    def check(world: World) -> None:
        jobset = world.api.stored(JOBSETS, NS, NAME)
        assert jobset is not None and jobset["spec"]["suspend"] is value

    return check


def the_pods_are_marked(world: World, reasons: dict[int, str | None]) -> None:
    """Trainer node ``i``'s pod has a ``DisruptionTarget=True`` condition of reason ``reasons[i]`` (``None``: no
    such condition); a node not named has no pod any more."""
    for (_, name), pod in world.api.pods.items():
        node = int(name.rsplit("-x", 1)[1])
        marks = [c for c in pod["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"]
        assert node in reasons, f"pod {name} should be gone"
        assert [c["reason"] for c in marks] == ([reasons[node]] if reasons[node] else []), name


def the_annotation_is(world: World, key: str, value: str) -> None:
    job = world.api.stored(TRAINJOBS, NS, NAME)
    assert job is not None and job["metadata"]["annotations"].get(key) == value


def no_jobset(world: World) -> None:
    assert world.api.stored(JOBSETS, NS, NAME) is None


def the_gpu_limit_equals_the_request(world: World) -> None:
    jobset = world.api.stored(JOBSETS, NS, NAME)
    assert jobset is not None
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def the_job_and_what_it_owns_are_gone(world: World) -> None:
    assert world.api.stored(TRAINJOBS, NS, NAME) is None
    assert world.api.stored(JOBSETS, NS, NAME) is None
    assert not world.api.pods


def the_last_resize_is_remembered(world: World) -> None:
    job = world.api.stored(TRAINJOBS, NS, NAME)
    assert job is not None and job["metadata"]["annotations"][RESIZE_ANNOTATION] == "2027-01-15T08:01:10Z"


#: A snapshot a user wrote: the runtime's name, a pod template of their own (host PID namespace, their image).
FORGED = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed",
          "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
              "spec": {"hostPID": True, "containers": [{"name": "node", "image": "mine"}]}}}}}]}}}}


def the_runtime_is_edited(world: World) -> None:
    """The platform team changes the runtime's image after the job started."""
    runtime = world.api.objects[(CLUSTER_TRAINING_RUNTIMES.group, CLUSTER_TRAINING_RUNTIMES.plural, "",
                                 "torch-distributed")]
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        for container in rj["template"]["spec"]["template"]["spec"]["containers"]:
            container["image"] = "edited-later"


def the_jobset_runs_the_runtimes_pods(world: World) -> None:
    """The JobSet's pods are the runtime's as it was when the job started: no forged or later template."""
    jobset = world.api.stored(JOBSETS, NS, NAME)
    assert jobset is not None
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "hostPID" not in pod
    assert {c["image"] for c in pod["containers"]} - {"mine", "edited-later"} == {c["image"] for c in pod["containers"]}


def a_new_jobset_was_created(world: World) -> None:
    jobset = world.api.stored(JOBSETS, NS, NAME)
    assert jobset is not None and "status" not in jobset
    created_jobset_owned_by_the_job(world)


def the_foreign_jobset_is_untouched(world: World) -> None:
    jobset = world.api.stored(JOBSETS, NS, NAME)
    assert jobset is not None and "ownerReferences" not in jobset["metadata"]


def assert_annotation(world: World, key: str, value: str) -> None:
    job = world.api.stored(TRAINJOBS, NS, NAME)
    assert job is not None and job["metadata"]["annotations"][key] == value


def all_of(*checks: Callable[[World], None]) -> Callable[[World], None]:
    def check(world: World) -> None:
        for one in checks:
            one(world)

    return check


# -- the table -----------------------------------------------------------------------------------------------------

PROGRESS_LOG = (
    "2027-01-15T08:00:30Z [rank0]: step 10/100 loss=2.5\n"
    "2027-01-15T08:00:40Z [rank0]: step 20/100 loss=1.5\n"
)
PROGRESS = {"progressPercentage": 20, "estimatedRemainingSeconds": 80,
            "metrics": [{"name": "loss", "value": "1.5"}], "lastUpdatedTime": "2027-01-15T08:00:40Z"}
TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 9\nValueError: lr must be positive\n'
RESIZE_LOG = (
    "2027-01-15T08:00:30Z [rank0]: step 30/100 loss=2\n"
    "2027-01-15T08:01:10Z [rank0]: [trainjob] resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 30\n"
    "2027-01-15T08:01:20Z [rank0]: step 40/100 loss=1\n"
)
RESIZED = "Resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 30"
RUNNING_JOBSET = jobset_reports(**trainer_jobs(ready=1, active=1))
#: JobSet's own Suspended condition: True while suspended, False (with the time) once its controller resumed it.
JOBSET_SUSPENDED = {"type": "Suspended", "status": "True", "reason": "SuspendedJobs", "message": "jobset is suspended",
                    "lastTransitionTime": timestamp(START + 10)}
JOBSET_RESUMED_AT_105 = jobset_reports(conditions=[{
    "type": "Suspended", "status": "False", "reason": "ResumeJobs", "message": "jobset is resumed",
    "lastTransitionTime": timestamp(START + 105)}])
#: A job created suspended, resumed by the user at 100 s; JobSet's controller resumed the JobSet at 105 s.
RESUMED_AT_100_JOBSET_AT_105 = [first_pass, at(10), jobset_reports(conditions=[JOBSET_SUSPENDED]), at(100),
                                user_patches({"spec": {"suspend": False}}), another_pass, at(105),
                                JOBSET_RESUMED_AT_105]
FAILED_JOBSET = jobset_reports(**trainer_jobs(failed=1),
                               conditions=[jobset_condition("Failed", "FailedJobs", "jobset failed due to job")])
COMPLETED_JOBSET = jobset_reports(
    **trainer_jobs(succeeded=1),
    conditions=[jobset_condition("Completed", "AllJobsCompleted", "jobset completed successfully")])
#: The validator's words are its own tests' business; the reconciler's part is the field and what to do.
INVALID_NUM_PROC = Text("spec.trainer.numProcPerNode: ", " (fix the TrainJob and create it again)")
DEADLINE_MESSAGE = ("the job ran longer than spec.activeDeadlineSeconds=60s; its JobSet was deleted (raise the "
                    "deadline to let it run longer)")

CASES = [
    # -- creating --
    Case(
        "create-renders-an-owned-jobset-and-signs-the-snapshot",
        trainjob(),
        requests=CREATE_REQUESTS,
        events=[("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=10.0,
        then=created_jobset_owned_by_the_job,
    ),
    Case(
        "create-suspended-creates-a-suspended-jobset",
        trainjob(suspend=True),
        requests=[*CREATE_REQUESTS, PATCH_STATUS],
        status={"conditions": [cond("Suspended", "True", "Suspended", "TrainJob is suspended")]},
        events=[("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=None,
        then=jobset_suspend_is(True),
    ),
    Case(
        "create-with-gang-scheduling-creates-the-podgroup-first",
        trainjob("torch-distributed-volcano"),
        requests=[create("podgroups"), create("jobsets"), EVENT],
        events=[("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=10.0,
        then=all_of(created_a_volcano_podgroup_for_both_nodes,
                    the_snapshot_is_the_runtime_signed("torch-distributed-volcano")),
    ),
    Case(
        "create-gives-a-gpu-request-its-limit-with-an-event",
        trainjob(trainer={"numNodes": 1, "command": ["torchrun", "train.py"],
                          "resourcesPerNode": {"requests": {"nvidia.com/gpu": 1}}}),
        requests=[*CREATE_REQUESTS[:-1], EVENT, EVENT],
        events=[("Normal", "ExtendedResourceLimitsSet", "node/node: set limits nvidia.com/gpu=1 equal to the "
                 "requests (Kubernetes needs limits for extended resources)"),
                ("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=10.0,
        then=the_gpu_limit_equals_the_request,
    ),
    Case(
        "create-fails-when-the-podgroup-crd-is-not-installed",
        trainjob("torch-distributed-volcano"),
        served=[JOBSETS, COSCHEDULING_PODGROUPS],
        requests=[create("podgroups"), PATCH_STATUS, EVENT],
        status={"conditions": [cond("Failed", "True", "CRDNotInstalled",
                                    "the cluster does not serve PodGroup (scheduling.volcano.sh/v1beta1): install "
                                    "Volcano, or use a runtime without podGroupPolicy.volcano, then create the "
                                    "TrainJob again")]},
        events=[("Warning", "CRDNotInstalled",
                 "the cluster does not serve PodGroup (scheduling.volcano.sh/v1beta1): install Volcano, or use a "
                 "runtime without podGroupPolicy.volcano, then create the TrainJob again")],
        then=no_jobset,
    ),
    # -- idempotence --
    Case(
        "a-second-pass-writes-nothing",
        trainjob(),
        before=[first_pass],
        later=5,
        requests=[],
        again_in=10.0,
    ),
    Case(
        "a-second-pass-over-a-running-job-only-reads",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running", PROGRESS_LOG), pod_runs(1, "Running"), at(60),
                another_pass],
        later=70,
        requests=[LIST_PODS, log_of(0)],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"], "trainerStatus": PROGRESS},
        again_in=10.0,
    ),
    # -- status from the JobSet --
    Case(
        "running-has-no-conditions-and-progress-from-node-0",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running", PROGRESS_LOG), pod_runs(1, "Running")],
        later=60,
        requests=[LIST_PODS, log_of(0), PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"], "trainerStatus": PROGRESS},
        again_in=10.0,
    ),
    Case(
        "an-old-running-condition-is-removed",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, another_pass,
                lambda world: world.api.patch_status(TRAINJOBS, NS, NAME, {"conditions": [
                    cond("Running", "True", "AllTrainerPodsRunning", "all 2 trainer pods run", at=5)]})],
        later=60,
        requests=[LIST_PODS, PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"]},
        again_in=10.0,
    ),
    Case(
        "a-restart-of-the-node-group-becomes-a-restarting-event-not-a-condition",
        trainjob(),
        before=[first_pass, jobset_reports(restarts=1, **trainer_jobs(active=1)),
                pod_runs(1, "Failed", terminated={"exitCode": 137, "finishedAt": "2027-01-15T08:00:50Z",
                                                  "reason": "OOMKilled"})],
        later=60,
        requests=[LIST_PODS, EVENT, PATCH_JOB, LIST_PODS, PATCH_STATUS],  # OOMKilled says it all: no log read
        status={"jobsStatus": trainer_jobs(active=1)["replicatedJobsStatus"]},
        events=[("Warning", "Restarting",
                 "attempt 2 of 4: node-1: OOMKilled: container node ran out of memory (no memory limit) (exit code 137)")],
        again_in=10.0,
        then=lambda world: assert_annotation(world, RESTARTS_ANNOTATION, "1"),
    ),
    Case(
        "not-running-while-a-trainer-pod-is-not-ready",
        trainjob(),
        before=[first_pass, jobset_reports(**trainer_jobs(active=1)), pod_runs(0, "Pending"),
                pod_runs(1, "Running")],
        later=60,
        requests=[LIST_PODS, PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(active=1)["replicatedJobsStatus"]},
        again_in=10.0,
    ),
    Case(
        "pods-the-scheduler-cannot-place-are-named-in-a-condition-not-failed",
        trainjob(),
        before=[first_pass, jobset_reports(**trainer_jobs(active=1)), unplaced(0, since=5), unplaced(1, since=6),
                another_pass],
        later=60,
        any_order=True,  # the pod-start look, the placement look, node 0's progress
        requests=[LIST_PODS, LIST_PODS, LIST_PODS, EVENT, PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(active=1)["replicatedJobsStatus"],
                "conditions": [cond("Unschedulable", "True", "PodsUnschedulable", UNPLACED_MESSAGE, at=60)]},
        events=[("Warning", "PodsUnschedulable", UNPLACED_MESSAGE)],
        again_in=10.0,
    ),
    Case(
        "placed-pods-take-the-unschedulable-condition-away",
        trainjob(),
        before=[first_pass, jobset_reports(**trainer_jobs(active=1)), unplaced(0, since=5), another_pass, at(60),
                another_pass, jobset_reports(**trainer_jobs(active=1, ready=1))],
        later=65,
        requests=[LIST_PODS, PATCH_STATUS],  # node 0's progress; the condition goes without a look
        status={"jobsStatus": trainer_jobs(active=1, ready=1)["replicatedJobsStatus"]},
        again_in=10.0,
    ),
    Case(
        "complete-copies-the-jobset-condition",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running", PROGRESS_LOG), at(60), another_pass,
                COMPLETED_JOBSET, pod_runs(0, "Succeeded", PROGRESS_LOG)],
        later=100,
        requests=[LIST_PODS, log_of(0), PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(succeeded=1)["replicatedJobsStatus"],
                "conditions": [cond("Complete", "True", "AllJobsCompleted", "jobset completed successfully", at=100)],
                "trainerStatus": PROGRESS},
        again_in=None,
    ),
    Case(
        "failed-names-the-node-and-exception-that-failed-first",
        trainjob(),
        before=[first_pass, FAILED_JOBSET,
                pod_runs(0, "Failed", "2027-01-15T08:01:00Z [rank0]: step 20/100 loss=1.5\n",
                         terminated={"exitCode": 1, "finishedAt": "2027-01-15T08:01:30Z"}),
                pod_runs(1, "Failed", terminated={"exitCode": 1, "finishedAt": "2027-01-15T08:01:20Z",
                                                  "message": TRACEBACK})],
        later=100,
        requests=[LIST_PODS, log_of(0), LIST_PODS, log_of(0), PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(failed=1)["replicatedJobsStatus"],
                "conditions": [cond("Failed", "True", "FailedJobs",
                                    "node-1: ValueError: lr must be positive (jobset failed due to job)", at=100)],
                "trainerStatus": {"progressPercentage": 20, "metrics": [{"name": "loss", "value": "1.5"}],
                                  "lastUpdatedTime": "2027-01-15T08:01:00Z"}},
        again_in=None,
    ),
    # -- suspend and resume --
    Case(
        "suspending-a-running-job-suspends-its-jobset",
        trainjob(),
        before=[first_pass, user_patches({"spec": {"suspend": True}})],
        later=30,
        # its pods listed before and after the JobSet is suspended, to be marked (it has none yet)
        requests=[LIST_PODS, patch("jobsets"), LIST_PODS, PATCH_STATUS],
        status={"conditions": [cond("Suspended", "True", "Suspended", "TrainJob is suspended", at=30)]},
        then=jobset_suspend_is(True),
    ),
    Case(
        "suspending-marks-the-running-pods-disruption-targets-before-the-jobset-stops-them",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running"), pod_runs(1, "Running"), pod_runs(2, "Failed"),
                user_patches({"spec": {"suspend": True}})],
        later=30,
        requests=[LIST_PODS, patch("pods/status", f"{NS}/{NAME}-node-0-0-x0"),
                  patch("pods/status", f"{NS}/{NAME}-node-0-1-x1"), patch("jobsets"), LIST_PODS, PATCH_STATUS],
        status={"conditions": [cond("Suspended", "True", "Suspended", "TrainJob is suspended", at=30)],
                "jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"]},
        then=lambda world: the_pods_are_marked(world, {0: "TrainJobSuspended", 1: "TrainJobSuspended", 2: None}),
    ),
    Case(
        "an-evicted-pod-takes-the-other-running-pods-of-its-group-down-with-it",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running", PROGRESS_LOG), pod_runs(1, "Running"),
                at(60), evicted(1)],
        later=61,
        # the restart counted on the job first (trainjob/disruptions), then the peer marked and stopped
        requests=[LIST_PODS, PATCH_JOB, patch("pods/status", f"{NS}/{NAME}-node-0-0-x0"),
                  delete("pods", f"{NS}/{NAME}-node-0-0-x0"), EVENT, LIST_PODS, PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"]},
        events=[("Warning", "Disrupted", Text(
            f"pod {NAME}-node-0-1-x1 was evicted (the Eviction API: a drain, or a disruption budget's controller); "
            f"stopping the other 1 pod(s) of its node group ({NAME}-node-0-0-x0) so that it restarts together",
            "a disruption does not count against maxRestarts"))],
        again_in=10.0,
        then=lambda world: (the_pods_are_marked(world, {1: "EvictionByEvictionAPI"}),
                            the_annotation_is(world, "trainjob/disruptions", "1")),
    ),
    Case(
        "resuming-a-suspended-job-resumes-its-jobset-and-removes-suspended",
        trainjob(suspend=True),
        before=[first_pass, user_patches({"spec": {"suspend": False}})],
        later=30,
        requests=[patch("jobsets"), PATCH_STATUS],
        status={},
        again_in=10.0,
        then=jobset_suspend_is(False),
    ),
    # -- activeDeadlineSeconds --
    Case(
        "before-the-deadline-the-next-pass-is-due-when-it-passes",
        trainjob(activeDeadlineSeconds=60),
        before=[first_pass],
        later=55,
        requests=[],
        again_in=5.0,
    ),
    Case(
        "the-deadline-counts-from-the-jobsets-resume",
        trainjob(activeDeadlineSeconds=60, suspend=True),
        before=RESUMED_AT_100_JOBSET_AT_105,
        later=160,
        requests=[],
        status={},
        again_in=5.0,
    ),
    Case(
        "the-deadline-waits-for-the-jobset-to-resume",
        trainjob(activeDeadlineSeconds=60, suspend=True),
        before=[first_pass, at(10), jobset_reports(conditions=[JOBSET_SUSPENDED]), at(100),
                user_patches({"spec": {"suspend": False}}), another_pass],
        later=130,
        requests=[],
        status={},
        again_in=10.0,
    ),
    Case(
        "past-the-deadline-after-a-resume-the-job-fails",
        trainjob(activeDeadlineSeconds=60, suspend=True),
        before=RESUMED_AT_100_JOBSET_AT_105,
        later=166,
        requests=[delete("jobsets"), delete("podgroups"), delete("podgroups"), PATCH_STATUS,
                  EVENT],
        status={"conditions": [cond("Failed", "True", "DeadlineExceeded", DEADLINE_MESSAGE, at=166)]},
        events=[("Warning", "DeadlineExceeded", DEADLINE_MESSAGE)],
        then=no_jobset,
    ),
    Case(
        "past-the-deadline-the-job-fails-and-its-children-are-deleted",
        trainjob(activeDeadlineSeconds=60),
        before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running"), pod_runs(1, "Running"), at(30), another_pass],
        later=61,
        requests=[delete("jobsets"), delete("podgroups"), delete("podgroups"), PATCH_STATUS,
                  EVENT],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"],
                "conditions": [cond("Failed", "True", "DeadlineExceeded", DEADLINE_MESSAGE, at=61)]},
        events=[("Warning", "DeadlineExceeded", DEADLINE_MESSAGE)],
        then=no_jobset,
    ),
    # -- jobs that cannot run --
    Case(
        "an-unknown-runtime-fails-naming-the-known-ones",
        trainjob("torch-distribute"),
        requests=[get("clustertrainingruntimes", "torch-distribute"), ("list", "clustertrainingruntimes", ""),
                  PATCH_STATUS, EVENT],
        status={"conditions": [cond("Failed", "True", "RuntimeNotFound",
                                    "spec.runtimeRef.name: ClusterTrainingRuntime 'torch-distribute' not found; "
                                    "available: deepspeed-distributed, mpi-distributed, ray-distributed, "
                                    "torch-distributed, torch-distributed-volcano, torchtune-llama3.2-1b, "
                                    "torchtune-llama3.2-3b, torchtune-qwen2.5-1.5b (create the runtime, then create "
                                    "the TrainJob again)")]},
        events=[("Warning", "RuntimeNotFound",
                 "spec.runtimeRef.name: ClusterTrainingRuntime 'torch-distribute' not found; available: "
                 "deepspeed-distributed, mpi-distributed, ray-distributed, torch-distributed, "
                 "torch-distributed-volcano, torchtune-llama3.2-1b, torchtune-llama3.2-3b, torchtune-qwen2.5-1.5b "
                 "(create the runtime, then create the TrainJob again)")],
        then=no_jobset,
    ),
    Case(
        "a-runtime-of-another-api-group-fails-without-reading-it",
        trainjob(runtimeRef={"name": "x", "apiGroup": "example.com", "kind": "Runtime"}),
        requests=[PATCH_STATUS, EVENT],
        status={"conditions": [cond("Failed", "True", "InvalidRuntimeRef",
                                    "spec.runtimeRef: must reference a trainer.kubeflow.org ClusterTrainingRuntime or "
                                    "TrainingRuntime, got apiGroup='example.com' kind='Runtime'")]},
        events=[("Warning", "InvalidRuntimeRef",
                 "spec.runtimeRef: must reference a trainer.kubeflow.org ClusterTrainingRuntime or TrainingRuntime, "
                 "got apiGroup='example.com' kind='Runtime'")],
    ),
    Case(
        "an-invalid-spec-fails-naming-the-field",
        trainjob(trainer={"numNodes": 2, "numProcPerNode": "gpu", "command": ["torchrun", "train.py"]}),
        requests=[PATCH_STATUS, EVENT],
        status={"conditions": [cond("Failed", "True", "InvalidTrainJob", INVALID_NUM_PROC)]},
        events=[("Warning", "InvalidTrainJob", INVALID_NUM_PROC)],
        then=no_jobset,
    ),
    Case(
        "a-jobset-the-job-did-not-create-is-not-adopted",
        trainjob(),
        before=[someone_creates_a_jobset_of_that_name],
        requests=[PATCH_STATUS, EVENT],
        status={"conditions": [cond("Failed", "True", "JobSetConflict",
                                    "a JobSet 'mnist' that this TrainJob did not create exists in namespace 'ml'; "
                                    "delete it or give the TrainJob another name")]},
        events=[("Warning", "JobSetConflict",
                 "a JobSet 'mnist' that this TrainJob did not create exists in namespace 'ml'; delete it or give "
                 "the TrainJob another name")],
        then=the_foreign_jobset_is_untouched,
    ),
    # -- the signed snapshot --
    Case(
        "a-snapshot-the-operator-did-not-sign-is-replaced-with-a-warning",
        trainjob(),
        before=[user_patches({"metadata": {"annotations": {RUNTIME_SNAPSHOT_ANNOTATION: json.dumps(FORGED)}}})],
        requests=[PATCH_JOB, EVENT, create("jobsets"), EVENT],
        events=[("Warning", "RuntimeSnapshotReplaced",
                 "the runtime-snapshot annotation was not written by the operator (it is signed) and was replaced by "
                 "a snapshot of ClusterTrainingRuntime 'torch-distributed'"),
                ("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=10.0,
        then=all_of(the_snapshot_is_the_runtime_signed("torch-distributed"),
                    the_snapshot_is_the_runtime_signed("torch-distributed", on="TrainJob"),
                    the_jobset_runs_the_runtimes_pods),
    ),
    Case(
        "a-snapshot-written-once-the-jobset-exists-changes-nothing",
        trainjob(),
        before=[first_pass, user_patches({"metadata": {"annotations": {RUNTIME_SNAPSHOT_ANNOTATION: json.dumps(
            FORGED)}}})],
        later=5,
        requests=[],
        again_in=10.0,
        then=the_snapshot_is_the_runtime_signed("torch-distributed"),
    ),
    Case(
        "a-jobset-deleted-after-the-runtime-changed-is-built-from-the-snapshot",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, at(60), another_pass, the_runtime_is_edited, someone_deletes_the_jobset],
        later=90,
        requests=[EVENT, create("jobsets"), EVENT],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"]},
        events=[("Warning", "JobSetRecreated",
                 "JobSet 'mnist' was deleted by someone else; creating it again (training restarts, from its last "
                 "checkpoint when the script keeps one)"),
                ("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=10.0,
        then=the_jobset_runs_the_runtimes_pods,
    ),
    # -- elastic jobs --
    Case(
        "a-resize-in-an-elastic-jobs-log-becomes-a-resized-event",
        trainjob("elastic", runtimeRef={"name": "elastic", "kind": "TrainingRuntime"},
                 trainer={"command": ["torchrun", "train.py"]}),
        runtimes=[elastic_runtime()],
        before=[first_pass, jobset_reports(**trainer_jobs(ready=1, active=1)), pod_runs(0, "Running", RESIZE_LOG),
                pod_runs(1, "Running", RESIZE_LOG), pod_runs(2, "Failed")],
        later=90,
        requests=[LIST_PODS, log_of(0), log_of(1), EVENT, PATCH_JOB, PATCH_STATUS],
        any_order=True,  # which running pod's log is read first does not matter
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"],
                "trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 300,
                                  "metrics": [{"name": "loss", "value": "1"}],
                                  "lastUpdatedTime": "2027-01-15T08:01:20Z"}},
        events=[("Warning", "Resized", RESIZED)],
        again_in=10.0,
        then=all_of(the_last_resize_is_remembered, the_snapshot_is_the_runtime_signed("elastic", "TrainingRuntime")),
    ),
    Case(
        "a-resize-is-reported-once",
        trainjob("elastic", runtimeRef={"name": "elastic", "kind": "TrainingRuntime"},
                 trainer={"command": ["torchrun", "train.py"]}),
        runtimes=[elastic_runtime()],
        before=[first_pass, jobset_reports(**trainer_jobs(ready=1, active=1)), pod_runs(0, "Running", RESIZE_LOG),
                pod_runs(1, "Running", RESIZE_LOG), at(90), another_pass],
        later=100,
        requests=[LIST_PODS, log_of(0), log_of(1)],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"],
                "trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 300,
                                  "metrics": [{"name": "loss", "value": "1"}],
                                  "lastUpdatedTime": "2027-01-15T08:01:20Z"}},
        again_in=10.0,
        then=the_last_resize_is_remembered,
    ),
    # -- after the end --
    Case(
        "a-finished-job-is-deleted-with-its-children-once-its-ttl-passed",
        trainjob(annotations={TTL_ANNOTATION: "60"}),
        before=[first_pass, COMPLETED_JOBSET, pod_runs(0, "Succeeded"), at(10), another_pass],
        later=71,
        requests=[delete("trainjobs")],
        status=None,
        then=the_job_and_what_it_owns_are_gone,
    ),
    Case(
        "a-finished-job-is-looked-at-again-when-its-ttl-passes",
        trainjob(annotations={TTL_ANNOTATION: "60"}),
        before=[first_pass, COMPLETED_JOBSET, at(10), another_pass],
        later=40,
        requests=[],
        status={"jobsStatus": trainer_jobs(succeeded=1)["replicatedJobsStatus"],
                "conditions": [cond("Complete", "True", "AllJobsCompleted", "jobset completed successfully", at=10)]},
        again_in=30.0,
    ),
    Case(
        "the-pass-that-finishes-a-job-returns-its-ttl",
        trainjob(annotations={TTL_ANNOTATION: "60"}),
        before=[first_pass, COMPLETED_JOBSET],
        later=10,
        requests=[LIST_PODS, PATCH_STATUS],
        status={"jobsStatus": trainer_jobs(succeeded=1)["replicatedJobsStatus"],
                "conditions": [cond("Complete", "True", "AllJobsCompleted", "jobset completed successfully", at=10)]},
        again_in=60.0,
    ),
    # -- things others do --
    Case(
        "a-jobset-deleted-by-someone-else-is-created-again-with-a-warning",
        trainjob(),
        before=[first_pass, RUNNING_JOBSET, at(60), another_pass, someone_deletes_the_jobset],
        later=90,
        requests=[EVENT, create("jobsets"), EVENT],
        status={"jobsStatus": trainer_jobs(ready=1, active=1)["replicatedJobsStatus"]},
        events=[("Warning", "JobSetRecreated",
                 "JobSet 'mnist' was deleted by someone else; creating it again (training restarts, from its last "
                 "checkpoint when the script keeps one)"),
                ("Normal", "JobSetCreated", "created JobSet mnist")],
        again_in=10.0,
        then=a_new_jobset_was_created,
    ),
    Case(
        "a-job-managed-by-another-controller-is-left-alone",
        trainjob(managedBy="kueue.x-k8s.io/multikueue"),
        requests=[],
        then=no_jobset,
    ),
    Case(
        "a-job-being-deleted-is-left-alone",
        trainjob(),
        before=[being_deleted],
        requests=[],
        then=no_jobset,
    ),
    Case(
        "a-job-that-is-gone-is-left-alone",
        trainjob(),
        before=[lambda world: world.api.objects.clear()],
        requests=[],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_reconcile(case: Case) -> None:
    outcome, world = reconcile(case)
    if case.any_order:
        assert Counter(outcome.requests) == Counter(case.requests)
    else:
        assert outcome.requests == case.requests
    assert outcome.status == case.status
    assert outcome.events == case.events
    assert outcome.again_in == case.again_in
    if case.then is not None:
        case.then(world)


def test_the_memory_api_merge_patches_and_keeps_the_status_subresource_apart() -> None:
    api = MemoryApi(Clock(START))
    created = api.create({"apiVersion": JOBSETS.api_version, "kind": JOBSETS.kind, "status": {"x": 1},
                          "metadata": {"name": NAME, "namespace": NS, "labels": {"a": "1", "b": "2"}}})
    assert "status" not in created and created["metadata"]["creationTimestamp"] == "2027-01-15T08:00:00Z"
    patched = api.patch(JOBSETS, NS, NAME, {"metadata": {"labels": {"a": None}}, "spec": {"l": [1]}, "status": {"x": 2}})
    assert patched is not None and patched["metadata"]["labels"] == {"b": "2"} and "status" not in patched
    assert patched["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    api.patch_status(JOBSETS, NS, NAME, {"x": 3})
    stored = api.stored(JOBSETS, NS, NAME)
    assert stored is not None and (stored["spec"], stored["status"]) == ({"l": [1]}, {"x": 3})
    with pytest.raises(AlreadyExistsError):
        api.create(created)
    assert api.patch(JOBSETS, NS, "gone", {}) is None and api.delete(JOBSETS, NS, "gone") is False
    assert api.requests == [create("jobsets"), patch("jobsets"), patch("jobsets/status"), create("jobsets"),
                            patch("jobsets", f"{NS}/gone"), delete("jobsets", f"{NS}/gone")]


def test_the_memory_api_answers_the_calls_kube_api_answers() -> None:
    """The double keeps KubeApi's methods and their signatures, so the reconciler calls the same surface."""
    public = {n for n, v in vars(KubeApi).items() if callable(v) and not n.startswith("_")}
    for name in public:
        assert name in vars(MemoryApi), f"MemoryApi does not implement KubeApi.{name}"
        assert inspect.signature(getattr(MemoryApi, name)) == inspect.signature(getattr(KubeApi, name)), name


def test_a_refused_delete_at_the_deadline_is_retried_and_the_job_fails_only_once_its_jobset_is_gone() -> None:
    case = Case("deadline-with-a-refused-delete", trainjob(activeDeadlineSeconds=60),
                before=[first_pass, RUNNING_JOBSET, pod_runs(0, "Running"), pod_runs(1, "Running")], later=61)
    clock, api = cluster_with(case.job, served=case.served)
    world = World(api, Reconciler(api, SIGNER, clock=clock), clock)
    for step in case.before:
        step(world)
    clock.now = START + 61
    delete = api.delete
    refusals = [ApiError("the server is currently unable to handle the request", status=503)]

    def refuse_once(ref: Any, *args: Any, **kwargs: Any) -> bool:
        if ref is JOBSETS and refusals:
            raise refusals.pop()
        return delete(ref, *args, **kwargs)

    api.delete = refuse_once  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        world.reconciler.reconcile(NS, NAME)
    job = api.stored(TRAINJOBS, NS, NAME)
    assert job is not None and not any(c["type"] == "Failed" for c in (job.get("status") or {}).get("conditions", []))
    world.reconciler.reconcile(NS, NAME)
    assert api.stored(JOBSETS, NS, NAME) is None
    job = api.stored(TRAINJOBS, NS, NAME)
    assert job is not None
    assert [c["reason"] for c in job["status"]["conditions"] if c["type"] == "Failed"] == ["DeadlineExceeded"]


def test_a_cache_behind_the_api_server_creates_nothing_twice() -> None:
    """The watch has delivered the job but not yet the JobSet an earlier pass created: the create answers 409, the
    pass reads that one JobSet and goes on; no second JobSet, no second JobSetCreated event."""
    clock, api = cluster_with(trainjob())
    Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api)).reconcile(NS, NAME)
    lagging = ObjectCache()
    for ref, namespace in ((TRAINJOBS, NS), (CLUSTER_TRAINING_RUNTIMES, None)):
        for obj in api.list(ref, namespace):
            lagging.observe(ref, obj)
    api.requests.clear()
    assert len(api.events) == 1
    assert Reconciler(api, SIGNER, clock=clock, cache=lagging).reconcile(NS, NAME) == 10.0
    # A reconciler that did not post this JobSet's JobSetCreated posts it under its fixed name: the API server
    # answers 409 for the one the first pass posted, so nothing new appears.
    assert api.requests == [create("jobsets"), get("jobsets"), EVENT]
    assert [e["reason"] for e in api.events] == ["JobSetCreated"]
    assert lagging.get(JOBSETS, NS, NAME) == api.stored(JOBSETS, NS, NAME)  # what the read found is cached


def test_a_job_the_cache_has_not_seen_is_left_for_its_own_event() -> None:
    api = MemoryApi(Clock(START))
    api.seed(trainjob())
    assert Reconciler(api, SIGNER, cache=ObjectCache()).reconcile(NS, NAME) is None
    assert api.requests == []


def test_a_jobset_whose_event_was_cut_off_gets_it_from_the_next_replica_once() -> None:
    """The leader created the JobSet and died before its JobSetCreated event; the replica that takes over posts
    it (under a name made from the JobSet's uid, so posting it twice is a 409, never a second event)."""
    clock, api = cluster_with(trainjob(suspend=True))
    post_event = api.post_event

    def killed(*args: Any, **kwargs: Any) -> None:
        raise ApiError("the operator was killed before the answer", status=None)

    api.post_event = killed  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api)).reconcile(NS, NAME)
    api.post_event = post_event  # type: ignore[method-assign]
    assert api.stored(JOBSETS, NS, NAME) is not None and not api.events
    for _ in range(2):  # the replica that took over, then a restarted one
        Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api)).reconcile(NS, NAME)
    assert [(e["reason"], e["message"]) for e in api.events] == [("JobSetCreated", "created JobSet mnist")]
    jobset = api.stored(JOBSETS, NS, NAME)
    assert api.events[0]["metadata"]["name"] == f"{NAME}.{jobset['metadata']['uid']}"


def test_the_pods_stall_setting_is_left_out_where_the_status_client_implies_auto() -> None:
    """A pod with the status client (``TRAINJOB_COLLECTIVES_URL``) takes ``auto`` when ``TRAINJOB_STALL_DUMP`` is
    absent: the operator leaves the default out of each of the job's pods, and its namespace's CA ConfigMap is made
    with the job's first JobSet."""
    def env_of(reconciler: Reconciler, api: MemoryApi) -> dict[str, str]:
        reconciler.reconcile(NS, NAME)
        container = api.stored(JOBSETS, NS, NAME)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
            "spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    clock, api = cluster_with(trainjob())
    pushed = env_of(Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api),
                               status_endpoint=StatusEndpoint("https://10.0.0.1:8443", "CA")), api)
    assert pushed["TRAINJOB_COLLECTIVES_URL"] == "collectives" and "TRAINJOB_STALL_DUMP" not in pushed
    assert api.stored(CONFIGMAPS, NS, "trainjob-status-ca")["data"] == {"ca.crt": "CA"}
    clock, api = cluster_with(trainjob())
    polled = env_of(Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api)), api)
    assert polled["TRAINJOB_STALL_DUMP"] == "auto" and "TRAINJOB_COLLECTIVES_URL" not in polled


def test_pod_counts_moving_in_a_burst_are_written_once_when_it_settles_and_conditions_at_once() -> None:
    clock, api = cluster_with(trainjob())
    reconciler = Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api),
                            status_endpoint=StatusEndpoint("https://10.0.0.1:8443", "CA"))  # progress is pushed
    reconciler.reconcile(NS, NAME)
    api.set_status(JOBSETS, NS, NAME, trainer_jobs(active=1))
    reconciler.reconcile(NS, NAME)  # the first count: written
    api.requests.clear()
    for at_, counts in ((0.3, {"active": 1, "ready": 1}), (0.6, {"active": 2, "ready": 1})):
        clock.now = START + at_
        api.set_status(JOBSETS, NS, NAME, trainer_jobs(**counts))
        again = reconciler.reconcile(NS, NAME)
        assert again == pytest.approx(1.0 - at_), again  # due when the second since the last write is over
    assert api.requests == []
    clock.now = START + 1.0
    reconciler.reconcile(NS, NAME)
    assert api.requests == [PATCH_STATUS]
    assert api.stored(TRAINJOBS, NS, NAME)["status"]["jobsStatus"][0]["active"] == 2
    clock.now = START + 1.1  # a condition is not held back
    api.set_status(JOBSETS, NS, NAME, {**trainer_jobs(failed=1), "conditions": [
        jobset_condition("Failed", "FailedJobs", "jobset failed due to job")]})
    reconciler.reconcile(NS, NAME)
    assert any(c["type"] == "Failed" for c in api.stored(TRAINJOBS, NS, NAME)["status"]["conditions"])



@pytest.mark.parametrize("jobset_condition_", [
    jobset_condition("Completed", "AllJobsCompleted", "jobset completed successfully"),
    jobset_condition("Failed", "FailedJobs", "jobset failed due to job"),
])
def test_a_report_waiting_for_its_interval_is_written_with_the_condition_that_finishes_the_job(
    jobset_condition_: dict[str, Any]
) -> None:
    """The pods' last report often arrives within the status endpoint's write interval, and the job can finish
    before that interval is over: the finished status must already hold it, in the same write."""
    clock, api = cluster_with(trainjob())
    written = {"progressPercentage": 98, "estimatedRemainingSeconds": 1, "lastUpdatedTime": "2026-11-24T10:00:00Z",
               "metrics": [{"name": "step", "value": "59"}]}
    waiting: dict[tuple[str, str], dict[str, Any]] = {}
    reconciler = Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api),
                            status_endpoint=StatusEndpoint("https://10.0.0.1:8443", "CA"),
                            pending_progress=lambda ns, name: waiting.get((ns, name)))
    reconciler.reconcile(NS, NAME)
    api.set_status(JOBSETS, NS, NAME, trainer_jobs(active=1, ready=1))
    api.set_status(TRAINJOBS, NS, NAME, {**api.stored(TRAINJOBS, NS, NAME).get("status", {}),
                                         "trainerStatus": written})
    clock.now = START + 5
    reconciler.reconcile(NS, NAME)
    waiting[(NS, NAME)] = {"progressPercentage": 100, "lastUpdatedTime": "2026-11-24T10:00:01Z",
                           "metrics": [{"name": "step", "value": "60"}]}
    assert api.stored(TRAINJOBS, NS, NAME)["status"]["trainerStatus"] == written  # not while the job runs
    clock.now = START + 6
    api.requests.clear()
    counts = {"succeeded": 1} if jobset_condition_["type"] == "Completed" else {"failed": 1}
    api.set_status(JOBSETS, NS, NAME, {**trainer_jobs(**counts), "conditions": [jobset_condition_]})
    reconciler.reconcile(NS, NAME)
    assert api.requests.count(PATCH_STATUS) == 1, api.requests
    status = api.stored(TRAINJOBS, NS, NAME)["status"]
    assert any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in status["conditions"])
    assert status["trainerStatus"] == waiting[(NS, NAME)]  # estimatedRemainingSeconds, not reported, is gone


RANK_0_IN_ALL_REDUCE = """[trainjob-stacks rank 0] no progress for 6 s; its stacks:
[trainjob-stacks rank 0] Thread 0x1 (most recent call first):
[trainjob-stacks rank 0]   File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
[trainjob-stacks rank 0]   File "/job/train.py", line 30 in <module>
"""
RANK_1_IN_LOADER = """step 7
[trainjob-stacks rank 1] no progress for 6 s; its stacks:
[trainjob-stacks rank 1] Thread 0x2 (most recent call first):
[trainjob-stacks rank 1]   File "/job/train.py", line 12 in __getitem__
[trainjob-stacks rank 1]   File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 733 in __next__
[trainjob-stacks rank 1]   File "/job/train.py", line 28 in <module>
"""


@pytest.mark.parametrize(("node_1_log", "named"), [
    (RANK_1_IN_LOADER, "rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (train.py:12)"),
    ("step 7\n", "rank 1 wrote no stacks (a rank writes them when it reports through trainjob.torch.report, or, in "
                 "an image with trainjob, when its collectives stop; not while it holds the GIL); of the others: "
                 "every rank waits in all_reduce"),
])
def test_a_stalled_job_is_failed_naming_its_stuck_rank_from_the_stacks_in_the_pods_logs(
    node_1_log: str, named: str
) -> None:
    clock, api = cluster_with(trainjob(annotations={"trainjob/stall-timeout": "10s", "trainjob/stall-action": "fail"}))
    world = World(api, Reconciler(api, SIGNER, clock=clock, cache=SyncedWatchCache(api),
                                  status_endpoint=StatusEndpoint("https://10.0.0.1:8443", "CA")), clock)
    first_pass(world)
    container = api.stored(JOBSETS, NS, NAME)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]
    assert {"name": "TRAINJOB_STALL_DUMP", "value": "5"} in container["env"]  # the ranks dump at half the limit
    jobset_reports(**trainer_jobs(active=2, ready=2))(world)
    for node, log in ((0, RANK_0_IN_ALL_REDUCE), (1, node_1_log)):  # as the kubelet keeps them: time, then line
        pod_runs(node, "Running", "".join(f"2027-01-15T08:00:0{node}Z {line}\n" for line in log.splitlines()))(world)
    api.set_status(TRAINJOBS, NS, NAME, {**api.stored(TRAINJOBS, NS, NAME).get("status", {}), "trainerStatus": {
        "progressPercentage": 7, "lastUpdatedTime": timestamp(START + 1)}})
    at(1)(world)
    another_pass(world)  # the report arrives: the stall watch is armed
    at(12)(world)
    another_pass(world)
    failed = next(c for c in api.stored(TRAINJOBS, NS, NAME)["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Stalled" and named in failed["message"], failed["message"]
    assert [e["reason"] for e in api.events if e["reason"] == "Stalled"] == ["Stalled"]
