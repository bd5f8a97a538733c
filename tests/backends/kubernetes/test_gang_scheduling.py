"""Gang scheduling for real: the Coscheduling plugin of scheduler-plugins (``kubetest.coscheduling``) places a
TrainJob's pods all together or not at all.

The pods ask for a CPU share of which exactly three fit on the first Node (its real allocatable, less what its pods
request), and are placed on it; two TrainJobs of two nodes each are created together. Pod
bindings (``spec.nodeName``) are sampled every 0.2 s. Through Coscheduling, one job is placed and runs; the other
gets no pod placed until the first one's pods finish, then runs whole. Through kube-scheduler (no gang), the same
jobs take the three slots as 2 + 1: one job is left partly placed, holding a slot it cannot use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster
from kubetest.controlplane import NODE_NAME
from kubetest.coscheduling import coscheduling_scheduler, cpu_for_slots

JOBS = ("first", "second")
NODES = 2
SLOTS = 3
RUN_SECONDS = 10
SAMPLE_EVERY = 0.2
#: Longer than placing a whole gang takes (its pods are bound one API call each), shorter than RUN_SECONDS.
TRANSIENT = 3.0

#: One sample: per job, (pods bound, bound pods not finished yet, pods).
Sample = tuple[float, dict[str, tuple[int, int, int]]]


def _trainer(cpu: str) -> dict[str, Any]:
    return {"numNodes": NODES, "command": ["sleep", str(RUN_SECONDS)], "resourcesPerNode": {"requests": {"cpu": cpu}}}


def _runtime_change(scheduler: str | None, gang: bool) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        if gang:
            spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
        for replicated in spec["template"]["spec"]["replicatedJobs"]:
            pod_spec = replicated["template"]["spec"]["template"]["spec"]
            if scheduler:
                pod_spec["schedulerName"] = scheduler
            pod_spec["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
            replicated["template"]["spec"]["backoffLimit"] = 0

    return change


def _sample(k8s: TrainJobCluster, namespace: str) -> dict[str, tuple[int, int, int]]:
    counts = {job: (0, 0, 0) for job in JOBS}
    for pod in k8s.api.list_pods(namespace, "jobset.sigs.k8s.io/jobset-name"):
        job = pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]
        bound, active, total = counts.get(job, (0, 0, 0))
        on_node = bool(pod["spec"].get("nodeName"))
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        counts[job] = (bound + on_node, active + (on_node and not finished), total + 1)
    return counts


def _run(k8s: TrainJobCluster, namespace: str, runtime: str, cpu: str, until: Callable[[list[Sample]], bool],
         timeout: float) -> list[Sample]:
    """Create both jobs, then sample their pods' bindings until ``until(samples)`` (or fail at ``timeout``)."""
    for job in JOBS:
        k8s.create_job(job, namespace, runtime=runtime, runtime_kind="TrainingRuntime", trainer=_trainer(cpu))
    start = time.monotonic()
    samples: list[Sample] = []
    while not until(samples):
        elapsed = time.monotonic() - start
        assert elapsed < timeout, f"no outcome after {timeout:g} s; last samples {samples[-5:]}\n" + \
            "\n".join(k8s.diagnostics(job, namespace) for job in JOBS)
        samples.append((elapsed, _sample(k8s, namespace)))
        time.sleep(SAMPLE_EVERY)
    return samples


def _partial(counts: tuple[int, int, int]) -> bool:
    bound, _, total = counts
    return total == NODES and 0 < bound < total


def _longest_partial(samples: list[Sample], job: str) -> float:
    """The longest stretch of time for which ``job`` had some but not all of its pods bound."""
    longest, since = 0.0, None
    for t, counts in samples:
        if _partial(counts[job]):
            since = t if since is None else since
            longest = max(longest, t - since)
        else:
            since = None
    return longest


def _both_complete(k8s: TrainJobCluster, namespace: str) -> Callable[[list[Sample]], bool]:
    def done(samples: list[Sample]) -> bool:
        if not samples or len(samples) % 5:  # the TrainJobs are read once a second
            return False
        states = []
        for job in JOBS:
            conditions = {c["type"]: c["status"] for c in (k8s.job(job, namespace).get("status") or {}).get(
                "conditions") or []}
            assert conditions.get("Failed") != "True", k8s.diagnostics(job, namespace)
            states.append(conditions.get("Complete") == "True")
        return all(states)

    return done


@pytest.fixture
def room_for_three(k8s: TrainJobCluster) -> str:
    """The CPU request of which exactly three pods fit on the first Node."""
    return cpu_for_slots(k8s.cp, NODE_NAME, SLOTS)


@pytest.fixture
def second_namespace(k8s: TrainJobCluster, namespace: str) -> Iterator[str]:
    """For the jobs placed by kube-scheduler; deleted with their pods."""
    name = f"{namespace}-default"
    k8s.cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
    yield name
    _delete_namespace(k8s, name)


def _delete_namespace(k8s: TrainJobCluster, name: str) -> None:
    import kubernetes.client

    kubernetes.client.CoreV1Api(k8s.api.client).delete_namespace(name, propagation_policy="Foreground")


def test_coscheduling_places_whole_gangs_and_the_default_scheduler_does_not(
    k8s: TrainJobCluster, namespace: str, second_namespace: str, room_for_three: str
) -> None:
    # Through Coscheduling: one job at a time, each placed whole.
    try:
        with coscheduling_scheduler(k8s.cp) as scheduler:
            k8s.namespaced_runtime(namespace, "gang", _runtime_change(scheduler, gang=True))
            samples = _run(k8s, namespace, "gang", room_for_three, _both_complete(k8s, namespace), timeout=150)
    finally:
        _delete_namespace(k8s, namespace)
    both_partial = [(t, c) for t, c in samples if all(_partial(c[job]) for job in JOBS)]
    assert not both_partial, f"both jobs partly placed at once: {both_partial[:5]}"
    for job in JOBS:
        assert _longest_partial(samples, job) < TRANSIENT, f"{job} was left partly placed: {samples}"
    order = sorted(JOBS, key=lambda job: next(t for t, c in samples if c[job][0] > 0))
    later_start = next(t for t, c in samples if c[order[1]][0] > 0)
    earlier_done = next((t for t, c in samples if c[order[0]][0] == NODES and c[order[0]][1] < NODES), None)
    assert earlier_done is not None and earlier_done <= later_start, \
        f"{order[1]} was placed before {order[0]}'s pods finished: {samples}"

    # Through kube-scheduler, the same jobs: three pods placed, 2 + 1, the fourth pending; one job partly placed
    # (for as long as the other job runs) while holding a slot.
    k8s.namespaced_runtime(second_namespace, "plain", _runtime_change(None, gang=False))

    def partly_placed(samples: list[Sample]) -> bool:
        return any(_longest_partial(samples, job) >= TRANSIENT for job in JOBS)

    samples = _run(k8s, second_namespace, "plain", room_for_three, partly_placed, timeout=60)
    t, last = samples[-1]
    assert sorted(bound for bound, _, _ in last.values()) == [1, 2], last
