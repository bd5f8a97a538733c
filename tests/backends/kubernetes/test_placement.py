"""Pods the scheduler cannot place (:mod:`trainjob.backends.kubernetes.placement`): which pods count, the message,
and how the SDK's view shows a job that has them."""

from __future__ import annotations

from typing import Any

from trainjob.backends.kubernetes.placement import placement_message, unschedulable
from trainjob.backends.kubernetes.views import trainjob_view


def pod(name: str, reason: str = "Unschedulable", since: str = "2026-12-07T10:00:05Z",
        message: str = "0/2 nodes are available: 2 Insufficient cpu.") -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
         "lastTransitionTime": since}]}}


def test_only_pods_the_scheduler_refused_count_longest_waiting_first() -> None:
    pods = [pod("b", since="2026-12-07T10:00:09Z"), pod("gated", reason="SchedulingGated"),
            pod("a", since="2026-12-07T10:00:01Z"), {"metadata": {"name": "bound"}, "status": {"phase": "Pending"}}]
    found = unschedulable(pods)
    assert [p["metadata"]["name"] for p, _ in found] == ["a", "b"]
    assert placement_message(found) == (
        "2 pod(s) not placed since 2026-12-07T10:00:01Z: 0/2 nodes are available: 2 Insufficient cpu. (pod a); "
        "the job waits for capacity, it is not failed")


def test_a_job_with_unplaced_pods_reads_created_with_the_schedulers_words() -> None:
    message = "1 pod(s) not placed since ...: 0/2 nodes are available: 2 Insufficient cpu. (pod x)"
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "seed", "namespace": "ml", "creationTimestamp": "2026-12-07T10:00:00Z"},
           "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 4}},
           "status": {"conditions": [{"type": "Unschedulable", "status": "True", "reason": "PodsUnschedulable",
                                      "message": message}]}}
    view = trainjob_view(job, [])
    assert (view.status, view.reason, view.message) == ("Created", "PodsUnschedulable", message)
