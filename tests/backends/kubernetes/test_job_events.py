"""The events of a running TrainJob as tables: JobSet created, node group restarting, elastic node group resized.
Objects in (:class:`kubetest.memory_api.MemoryApi`, no cluster); the events posted and what is kept out."""

from __future__ import annotations

from typing import Any

import pytest
from kubetest.memory_api import MemoryApi

from trainjob.backends.kubernetes.cache import CachedReads
from trainjob.backends.kubernetes.job_events import RESTARTS_ANNOTATION, JobEvents
from trainjob.backends.kubernetes.progress import RESIZE_ANNOTATION
from trainjob.backends.kubernetes.resources import (
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINJOBS,
)

NS, NAME, NOW = "ml", "mnist", 1_800_000_000.0


def world(annotations: dict[str, str] | None = None) -> tuple[MemoryApi, JobEvents, dict[str, Any]]:
    api = MemoryApi(lambda: NOW)
    meta: dict[str, Any] = {"name": NAME, "namespace": NS}
    if annotations:
        meta["annotations"] = annotations
    job = api.seed({"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind, "metadata": meta, "spec": {}})
    return api, JobEvents(api, CachedReads(api)), job


def events(api: MemoryApi) -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in api.events]


def annotation(api: MemoryApi, key: str) -> str | None:
    job = api.stored(TRAINJOBS, NS, NAME)
    assert job is not None
    return (job["metadata"].get("annotations") or {}).get(key)


def node_pod(node: int, phase: str = "Running", log: str = "") -> tuple[dict[str, Any], dict[str, str]]:
    pod = {"metadata": {"name": f"{NAME}-node-0-{node}", "namespace": NS,
                        "labels": {JOBSET_NAME_LABEL: NAME, REPLICATED_JOB_LABEL: "node",
                                   COMPLETION_INDEX_LABEL: str(node)}},
           "spec": {"containers": [{"name": "node"}]}, "status": {"phase": phase}}
    return pod, {"node": log}


# -- JobSetCreated -------------------------------------------------------------------------------------------------

ANNOUNCING = [
    # (id, what happens, JobSetCreated events posted)
    ("announced-once", ["announce"], 1),
    ("announced-again-after-a-crash-is-one-event", ["announce", "forget", "announce"], 1),
    ("a-missed-announcement-is-made", ["if-missed"], 1),
    ("an-announced-jobset-is-not-announced-again", ["announce", "if-missed"], 1),
    ("a-job-with-a-status-was-announced-before", ["if-missed-with-status"], 0),
]


@pytest.mark.parametrize(("steps", "posted"), [case[1:] for case in ANNOUNCING], ids=[case[0] for case in ANNOUNCING])
def test_jobset_created_is_posted_once_per_jobset(steps: list[str], posted: int) -> None:
    api, job_events, job = world()
    jobset = {"metadata": {"name": NAME, "namespace": NS, "uid": "jobset-uid"}}
    for step in steps:
        if step == "announce":
            job_events.announce(job, jobset)
        elif step == "forget":
            job_events.forget(NS, NAME)
        elif step == "if-missed":
            job_events.announce_if_missed(job, {}, jobset)
        else:
            job_events.announce_if_missed(job, {"jobsStatus": []}, jobset)
    assert events(api) == [("Normal", "JobSetCreated", f"created JobSet {NAME}")] * posted
    assert [e["metadata"]["name"] for e in api.events] == [f"{NAME}.jobset-uid"] * posted


# -- Restarting ----------------------------------------------------------------------------------------------------

RESTARTS = [
    # (id, JobSet's status.restarts, reported before, failurePolicy.maxRestarts, events, annotation after)
    ("no-restart-posts-nothing", 0, None, 3, [], None),
    ("a-first-restart-names-its-attempt", 1, None, 3,
     [("Warning", "Restarting", "attempt 2 of 4: a Job of the node group failed")], "1"),
    ("a-restart-reported-is-not-posted-again", 1, "1", 3, [], "1"),
    ("without-a-limit-the-attempt-stands-alone", 2, "1", None,
     [("Warning", "Restarting", "attempt 3: a Job of the node group failed")], "2"),
    ("an-unreadable-count-counts-as-none", 1, "garbage", 3,
     [("Warning", "Restarting", "attempt 2 of 4: a Job of the node group failed")], "1"),
]


@pytest.mark.parametrize(("restarts", "reported", "limit", "posted", "after"), [case[1:] for case in RESTARTS],
                         ids=[case[0] for case in RESTARTS])
def test_each_restart_of_the_node_group_is_one_restarting_event(restarts: int, reported: str | None,
                                                                 limit: int | None, posted: list, after: str | None
                                                                 ) -> None:
    api, job_events, job = world({RESTARTS_ANNOTATION: reported} if reported is not None else None)
    policy = {"failurePolicy": {"maxRestarts": limit}} if limit is not None else {}
    job_events.report_restarts(job, {"spec": policy, "status": {"restarts": restarts}})
    assert events(api) == posted
    assert annotation(api, RESTARTS_ANNOTATION) == after


def test_a_restart_names_the_failed_rank_while_its_pod_is_there() -> None:
    api, job_events, job = world()
    pod, _ = node_pod(1, phase="Failed")
    pod["status"]["containerStatuses"] = [{"name": "node", "state": {"terminated": {
        "exitCode": 1, "finishedAt": "2027-01-15T08:00:10Z",
        "message": "Traceback (most recent call last):\nValueError: lr must be positive\n"}}}]
    api.add_pod(pod)
    job_events.report_restarts(job, {"spec": {"failurePolicy": {"maxRestarts": 1}}, "status": {"restarts": 1}})
    [(kind, reason, message)] = events(api)
    assert (kind, reason) == ("Warning", "Restarting")
    assert message.startswith("attempt 2 of 2: node-1") and message.endswith("ValueError: lr must be positive")


# -- Resized -------------------------------------------------------------------------------------------------------

SHRUNK = "2027-01-15T08:01:10Z [trainjob] resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 30\n"
GREW = "2027-01-15T08:02:10Z [trainjob] resized 2 -> 3 nodes (world size 2 -> 3), resuming at step 50\n"
RESIZES = [
    # (id, pods (node, phase, log), last resize reported before, events, annotation after)
    ("no-resize-posts-nothing", [(0, "Running", "2027-01-15T08:00:30Z step 3/10\n")], None, [], None),
    ("a-shrink-is-a-warning", [(0, "Running", SHRUNK)], None,
     [("Warning", "Resized", "Resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 30")],
     "2027-01-15T08:01:10Z"),
    ("growth-is-normal-and-oldest-first", [(0, "Running", GREW), (1, "Running", SHRUNK)], None,
     [("Warning", "Resized", "Resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 30"),
      ("Normal", "Resized", "Resized 2 -> 3 nodes (world size 2 -> 3), resuming at step 50")],
     "2027-01-15T08:02:10Z"),
    ("a-resize-reported-before-is-not-posted-again", [(0, "Running", SHRUNK + GREW)], "2027-01-15T08:01:10Z",
     [("Normal", "Resized", "Resized 2 -> 3 nodes (world size 2 -> 3), resuming at step 50")],
     "2027-01-15T08:02:10Z"),
    ("pods-that-do-not-run-are-not-read", [(0, "Pending", SHRUNK)], None, [], None),
]


@pytest.mark.parametrize(("pods", "reported", "posted", "after"), [case[1:] for case in RESIZES],
                         ids=[case[0] for case in RESIZES])
def test_each_resize_a_rank_logged_is_one_resized_event(pods: list, reported: str | None, posted: list,
                                                        after: str | None) -> None:
    api, job_events, job = world({RESIZE_ANNOTATION: reported} if reported is not None else None)
    for node, phase, log in pods:
        api.add_pod(*node_pod(node, phase, log))
    read = job_events.report_resizes(job, api.list_pods(NS, f"{JOBSET_NAME_LABEL}={NAME}"))
    assert events(api) == posted
    assert annotation(api, RESIZE_ANNOTATION) == after
    assert sorted(read) == sorted(f"{NAME}-node-0-{node}" for node, phase, _ in pods if phase == "Running")
