"""The pod-start watch as tables: a running job's pods (their waiting reasons, when) in; when it looks at them,
whether and when the job fails, and what it asked of the API server out. The API server is
:class:`kubetest.memory_api.MemoryApi`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from kubetest.memory_api import MemoryApi

from trainjob.backends.kubernetes.cache import CachedReads, ObjectCache
from trainjob.backends.kubernetes.pod_start import (
    GRACE_ANNOTATION,
    READ_AT_MOST,
    REASON,
    PodStartWatch,
    pods_not_starting,
)
from trainjob.backends.kubernetes.resources import (
    JOBS,
    JOBSET_NAME_LABEL,
    JOBSETS,
    REPLICATED_JOB_LABEL,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.status_writer import StatusWriter

NS, NAME, START = "ml", "mnist", 1_800_000_000.0
IMAGE = "registry.example.com/team/train:v1-typo"
PULL_ERROR = (f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": '
              f"{IMAGE}: not found")
STARTING = {"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 0}]}
STARTED = {"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 1}]}


def rising(ready: int, active: int = 1000) -> dict[str, Any]:
    """A JobSet of a thousand nodes with ``active`` of their pods made and ``ready`` of them running."""
    return {"replicatedJobsStatus": [{"name": "node", "active": active, "ready": ready}]}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"phase": "Pending", "containerStatuses": [
        {"name": "node", "image": IMAGE, "ready": False,
         "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}]}


@dataclass
class Case:
    """Passes at ``START + t``: the JobSet's status then and, per pod, its status then (``None``: unchanged)."""

    id: str
    passes: Sequence[tuple[float, dict[str, Any], dict[str, Any] | None]]
    due_in: float | None  # what the last pass returned
    lists: int  # pod lists asked for
    failed: bool = False
    annotations: dict[str, str] | None = None


CASES = [
    Case("started-pods-are-not-looked-at", [(0, STARTED, waiting("ContainerCreating"))], due_in=None, lists=0),
    Case("a-new-start-waits-ten-seconds", [(0, STARTING, waiting("ErrImagePull", PULL_ERROR))],
         due_in=10, lists=0),
    Case("slow-pull-is-looked-at-less-and-less-often",
         [(0, STARTING, waiting("ContainerCreating")), (10, STARTING, None), (20, STARTING, None),
          (40, STARTING, None), (80, STARTING, None), (600, STARTING, None)], due_in=60, lists=5),
    Case("a-bad-image-fails-after-the-grace",
         [(0, STARTING, waiting("ErrImagePull", PULL_ERROR)), (10, STARTING, None),
          (20, STARTING, waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')), (30, STARTING, None),
          (40, STARTING, None)], due_in=0, lists=4, failed=True),
    Case("within-the-grace-it-waits", [(0, STARTING, waiting("ErrImagePull", PULL_ERROR)), (10, STARTING, None),
                                       (35, STARTING, None)], due_in=5, lists=2),
    Case("a-blip-that-clears-restarts-the-grace",
         [(0, STARTING, waiting("ErrImagePull", PULL_ERROR)), (10, STARTING, None),
          (20, STARTING, waiting("ContainerCreating")), (40, STARTING, waiting("ErrImagePull", PULL_ERROR)),
          (60, STARTING, None)], due_in=10, lists=4),
    Case("started-after-all-forgets", [(0, STARTING, waiting("ErrImagePull", PULL_ERROR)), (10, STARTING, None),
                                       (15, STARTED, None), (16, STARTING, None)], due_in=10, lists=1),
    Case("pods-coming-up-are-not-listed",  # a thousand pods on a busy cluster: slow, not stuck
         [(0, rising(0), waiting("ContainerCreating")), (10, rising(300), None), (20, rising(600), None),
          (30, rising(900), None)], due_in=10, lists=0),
    Case("pods-being-made-are-not-listed",  # the Job controller still making them: none ready yet
         [(0, rising(0, 100), waiting("ContainerCreating")), (10, rising(0, 400), None), (20, rising(0, 800), None),
          (30, rising(50), None), (40, rising(60), None)], due_in=10, lists=0),
    Case("a-count-that-stops-growing-is-looked-at",
         [(0, rising(0), waiting("ContainerCreating")), (10, rising(300), None), (20, rising(300), None)],
         due_in=10, lists=1),
    Case("a-count-that-grows-does-not-hide-one-that-cannot-start",
         [(0, rising(0), waiting("ErrImagePull", PULL_ERROR)), (10, rising(0), None), (20, rising(300), None),
          (30, rising(600), None), (40, rising(900), None)], due_in=0, lists=4, failed=True),
    Case("annotation-zero-fails-at-first-sight", [(0, STARTING, waiting("CreateContainerConfigError",
                                                                        'secret "hf-token" not found')),
                                                  (10, STARTING, None)],
         due_in=0, lists=1, failed=True, annotations={GRACE_ANNOTATION: "0"}),
]


def seed_job(api: MemoryApi, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """TrainJob ``ml/mnist`` (with ``annotations``) and the JobSet it owns."""
    job = api.seed({"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                    "metadata": {"name": NAME, "namespace": NS, "annotations": annotations or {}}, "spec": {}})
    api.seed({"apiVersion": JOBSETS.api_version, "kind": JOBSETS.kind,
              "metadata": {"name": NAME, "namespace": NS,
                           "ownerReferences": [{"kind": "TrainJob", "name": NAME, "uid": job["metadata"]["uid"]}]},
              "spec": {"replicatedJobs": []}})
    return job


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_pod_start_watch(case: Case) -> None:
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    seed_job(api, case.annotations)
    pod = f"{NAME}-node-0-0"
    api.add_pod({"metadata": {"name": pod, "namespace": NS, "labels": {JOBSET_NAME_LABEL: NAME}},
                 "spec": {"nodeName": "gpu-7", "containers": [{"name": "node", "image": IMAGE}]},
                 "status": {"phase": "Pending"}})
    reads = CachedReads(api)
    watch = PodStartWatch(api, StatusWriter(api, reads, lambda: clock[0]))
    due_in: float | None = None
    for t, jobset_status, pod_status in case.passes:
        clock[0] = START + t
        if pod_status is not None:
            api.set_pod_status(NS, pod, pod_status)
        stored = api.stored(TRAINJOBS, NS, NAME)
        assert stored is not None
        if (stored.get("status") or {}).get("conditions"):
            break
        due_in = watch.watch(stored, stored.get("status") or {}, {}, {"status": jobset_status}, clock[0])
    assert due_in == (pytest.approx(case.due_in) if case.due_in is not None else None)
    assert sum(1 for verb, resource, _ in api.requests if resource == "pods" and verb == "list") == case.lists
    stored = api.stored(TRAINJOBS, NS, NAME)
    assert stored is not None
    failed = [c for c in (stored.get("status") or {}).get("conditions") or [] if c["type"] == "Failed"]
    events = [e for e in api.events if e["reason"] == REASON]
    assert bool(failed) == case.failed and len(events) == (1 if case.failed else 0)
    assert (api.stored(JOBSETS, NS, NAME) is None) == case.failed
    if case.failed:
        assert failed[0]["reason"] == REASON and failed[0]["message"] == events[0]["message"]
        assert f"pod {pod} on node gpu-7: container node (image {IMAGE})" in failed[0]["message"]


def test_the_message_names_the_image_node_and_the_registrys_answer() -> None:
    pods = [{"metadata": {"name": "p0"}, "spec": {"nodeName": "n1", "containers": [{"name": "node", "image": IMAGE}]},
             "status": waiting("ErrImagePull", PULL_ERROR)},
            {"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "node", "image": IMAGE}]},
             "status": waiting("ContainerCreating")}]
    assert pods_not_starting(pods) == [f"pod p0 on node n1: container node (image {IMAGE}): ErrImagePull: "
                                       f"{PULL_ERROR}"]


def test_only_pods_on_a_node_and_not_running_are_listed() -> None:
    """A job of many nodes has many pods to send: the list asks the API server for those a node is starting, the
    only ones with a container that can fail to start (a pod waiting for the scheduler has none)."""
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    job = seed_job(api, {GRACE_ANNOTATION: "0"})
    for index, (node, status) in enumerate([
        (None, {"phase": "Pending"}),  # waiting for the scheduler
        ("gpu-1", {"phase": "Running", "containerStatuses": [{"name": "node", "state": {"running": {}}}]}),
        ("gpu-2", waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')),
    ]):
        api.add_pod({"metadata": {"name": f"{NAME}-node-0-{index}", "namespace": NS,
                                  "labels": {JOBSET_NAME_LABEL: NAME}},
                     "spec": {**({"nodeName": node} if node else {}), "containers": [{"name": "node", "image": IMAGE}]},
                     "status": status})
    listed: list[list[str]] = []
    pages = api.table_in_pages

    def looked_at(*args: Any, **kwargs: Any) -> Iterator[list[dict[str, Any]]]:
        for page in pages(*args, **kwargs):
            listed.append([row["Name"] for row in page])
            yield page

    api.table_in_pages = looked_at  # type: ignore[method-assign]
    watch = PodStartWatch(api, StatusWriter(api, CachedReads(api), lambda: clock[0]))
    watch.watch(job, {}, {}, {"status": STARTING}, START)
    clock[0] = START + 10
    assert watch.watch(job, {}, {}, {"status": STARTING}, clock[0]) == 0  # failed: the grace is 0
    assert listed == [[f"{NAME}-node-0-2"]]
    assert [(verb, name) for verb, resource, name in api.requests if resource == "pods" and verb == "get"] == [
        ("get", f"{NS}/{NAME}-node-0-2")]  # the one that cannot start, read whole for the message


def add_node_pods(api: MemoryApi, count: int, status: dict[str, Any]) -> None:
    """``count`` pods of the job, one on each node ``gpu-<i>``, all with ``status``."""
    for index in range(count):
        api.add_pod({"metadata": {"name": f"{NAME}-node-{index}-0", "namespace": NS,
                                  "labels": {JOBSET_NAME_LABEL: NAME}},
                     "spec": {"nodeName": f"gpu-{index}", "containers": [{"name": "node", "image": IMAGE}]},
                     "status": status})


def failed_message(api: MemoryApi, job: dict[str, Any], clock: list[float]) -> str:
    """The ``Failed`` message of a job of grace 0 after the watch's first look at its pods (10 s in)."""
    watch = PodStartWatch(api, StatusWriter(api, CachedReads(api), lambda: clock[0]))
    watch.watch(job, {}, {}, {"status": STARTING}, START)
    clock[0] = START + 10
    assert watch.watch(job, {}, {}, {"status": STARTING}, clock[0]) == 0
    stored = api.stored(TRAINJOBS, NS, NAME)
    assert stored is not None
    return str(next(c for c in stored["status"]["conditions"] if c["type"] == "Failed")["message"])


def test_of_many_pods_that_cannot_start_a_few_are_read_and_the_rest_counted() -> None:
    """A bad image on a job of 50 nodes: 50 rows, 3 pods read whole; the message names the first and counts the
    rest."""
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    job = seed_job(api, {GRACE_ANNOTATION: "0"})
    add_node_pods(api, 50, waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'))
    message = failed_message(api, job, clock)
    assert sum(1 for verb, resource, _ in api.requests if resource == "pods" and verb == "get") == READ_AT_MOST
    assert message.startswith(f"pod {NAME}-node-0-0 on node gpu-0: container node (image {IMAGE}): "
                              f"ImagePullBackOff: Back-off pulling image")
    assert "(and 49 more); its pods could not start for 0 s" in message


def test_an_init_container_that_cannot_start_fails_the_job() -> None:
    """``Init:CrashLoopBackOff``: a crash-looping init container keeps its pod Pending; the job fails naming it."""
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    job = seed_job(api, {GRACE_ANNOTATION: "0"})
    api.add_pod({"metadata": {"name": f"{NAME}-node-0-0", "namespace": NS, "labels": {JOBSET_NAME_LABEL: NAME}},
                 "spec": {"nodeName": "gpu-0", "initContainers": [{"name": "fetch", "image": "busybox:1"}],
                          "containers": [{"name": "node", "image": IMAGE}]},
                 "status": {"phase": "Pending", "initContainerStatuses": [
                     {"name": "fetch", "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                             "message": "back-off 40s restarting failed container"}}}],
                     "containerStatuses": [{"name": "node", "state": {"waiting": {"reason": "PodInitializing"}}}]}})
    assert failed_message(api, job, clock).startswith(f"pod {NAME}-node-0-0 on node gpu-0: container fetch (image busybox:1): "
                                                  "CrashLoopBackOff: back-off 40s restarting failed container; ")


def test_pods_that_started_between_the_listing_and_their_read_leave_a_count() -> None:
    """The few pods read whole had started by then (the listing is a moment older): the message counts the others
    by what the listing printed for them."""
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    job = seed_job(api, {GRACE_ANNOTATION: "0"})
    add_node_pods(api, 5, waiting("ErrImagePull", PULL_ERROR))
    read = api.read_pod

    def started_meanwhile(namespace: str, name: str) -> dict[str, Any] | None:
        pod = read(namespace, name)
        if pod is not None:
            pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "node", "state": {"running": {}}}]}
        return pod

    api.read_pod = started_meanwhile  # type: ignore[method-assign]
    assert failed_message(api, job, clock).startswith(
        "2 of its pods showed ErrImagePull; its pods could not start for 0 s")


def child_job(ready: int, active: int = 1000, rv: int = 1, succeeded: int = 0) -> dict[str, Any]:
    """The one child Job of a built-in runtime's JobSet of a thousand nodes: ``active`` pods not finished, ``ready``
    of them up, ``succeeded`` finished."""
    return {"metadata": {"name": f"{NAME}-node-0", "namespace": NS, "uid": "j1", "resourceVersion": str(rv),
                         "labels": {JOBSET_NAME_LABEL: NAME, REPLICATED_JOB_LABEL: "node", "other": "dropped"},
                         "annotations": {"big": "x" * 1000}},
            "spec": {"parallelism": active, "template": {"spec": {"containers": [{"name": "node"}]}}},
            "status": {"active": active, "ready": ready, "terminating": 0,
                       **({"succeeded": succeeded} if succeeded else {})}}


@pytest.mark.parametrize(("states", "lists"), [
    # coming up: the child Job's ready pods grow between checks, nothing is listed
    (((1000, 0, 0), (1000, 300, 0), (1000, 600, 0), (1000, 900, 0)), 0),
    # pods that run for seconds: fewer active and about as many ready at each check, but more finished
    (((1000, 20, 0), (700, 20, 300), (400, 15, 600), (100, 20, 900)), 0),
    # the count stopped growing: looked at
    (((1000, 0, 0), (1000, 300, 0), (1000, 300, 0)), 1),
    # brief pods, then the rest stopped coming up: looked at
    (((1000, 20, 0), (700, 20, 300), (700, 0, 300)), 1),
], ids=["the-child-jobs-pods-coming-up-are-not-listed", "brief-pods-finishing-while-the-rest-come-up-are-not-listed",
        "the-child-jobs-pods-stuck-are-looked-at", "brief-pods-then-the-rest-stuck-are-looked-at"])
def test_the_child_jobs_pod_counts_decide_the_look(states: tuple[tuple[int, int, int], ...], lists: int) -> None:
    """The built-in runtimes make one child Job of ``numNodes`` pods: its JobSet counts one active Job and no ready
    one until the last pod is up, so only the child Job's own counts (from the operator's watch of Jobs) tell a
    thousand pods coming up from pods that stopped coming up. ``states``: (active, ready, succeeded) at each check."""
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    job = seed_job(api)
    add_node_pods(api, 3, waiting("ContainerCreating"))
    cache = ObjectCache()
    watch = PodStartWatch(api, StatusWriter(api, CachedReads(api), lambda: clock[0]), cache.pod_counts)
    for step, (active, ready, succeeded) in enumerate(states):
        clock[0] = START + 10 * step
        cache.observe(JOBS, child_job(ready, active=active, rv=step + 1, succeeded=succeeded))
        assert watch.watch(job, {}, {}, {"status": STARTING}, clock[0]) == pytest.approx(10)
    assert sum(1 for verb, resource, _ in api.requests if resource == "pods" and verb == "list") == lists


def test_the_cache_keeps_a_child_jobs_counts_only_and_forgets_it_when_deleted() -> None:
    cache = ObjectCache()
    cache.observe(JOBS, child_job(5, active=8))
    cache.observe(JOBS, {**child_job(2, active=2), "metadata": {**child_job(0)["metadata"], "name": "mnist-launcher-0",
                                                                "labels": {JOBSET_NAME_LABEL: NAME,
                                                                           REPLICATED_JOB_LABEL: "launcher"}}})
    kept = cache.get(JOBS, NS, f"{NAME}-node-0")
    assert kept == {"metadata": {"name": f"{NAME}-node-0", "namespace": NS, "uid": "j1", "resourceVersion": "1",
                                 "labels": {JOBSET_NAME_LABEL: NAME, REPLICATED_JOB_LABEL: "node"}},
                    "status": {"active": 8, "ready": 5, "terminating": 0}}
    assert cache.pod_counts(NS, NAME) == {"node": (8, 5), "launcher": (2, 2)}
    assert cache.terminating(NS, NAME) == 0
    cache.observe(JOBS, {**child_job(5, active=7, rv=2), "status": {"active": 7, "ready": 5, "terminating": 1}})
    assert cache.terminating(NS, NAME) == 1  # a pod being deleted: the operator looks for a disruption
    cache.observe(JOBS, child_job(3, active=4, rv=3, succeeded=4))  # pods made and up include the finished ones
    assert cache.pod_counts(NS, NAME)["node"] == (8, 7)
    assert cache.pod_counts(NS, "other") == {} and cache.pod_counts("elsewhere", NAME) == {}
    cache.observe(JOBS, child_job(4, active=8, rv=0))  # an older event than what the cache has: ignored
    assert cache.pod_counts(NS, NAME)["node"] == (8, 7)
    cache.observe(JOBS, child_job(8, active=8, rv=4), deleted=True)
    assert cache.pod_counts(NS, NAME) == {"launcher": (2, 2)} and cache.get(JOBS, NS, f"{NAME}-node-0") is None
