"""Status rules as tables: JobSet status in, TrainJob conditions out; the deadline clock; the work queue."""

from __future__ import annotations

import asyncio
import time

import pytest

from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.workqueue import WorkQueue

NOW = 1_800_000_000.0


def jobset(parallelism: int = 2, ready: int | None = None, conditions: list | None = None) -> dict:
    js: dict = {
        "metadata": {"creationTimestamp": st.timestamp(NOW - 100)},
        "spec": {
            "replicatedJobs": [
                {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": parallelism}}}
            ]
        },
        "status": {},
    }
    if ready is not None:
        js["status"]["replicatedJobsStatus"] = [{"name": "node", "ready": ready, "active": 1}]
    if conditions:
        js["status"]["conditions"] = conditions
    return js


def cond(type_: str, status: str = "True", reason: str = "R", message: str = "m") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def summary(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


@pytest.mark.parametrize(
    ("before", "suspend", "js", "expected"),
    [
        ({}, False, jobset(ready=0), {}),
        ({}, False, jobset(ready=1), {"Running": ("True", "AllTrainerPodsRunning")}),
        (
            {"conditions": [{**cond("Running"), "lastTransitionTime": "x"}]},
            False,
            jobset(ready=0),
            {"Running": ("False", "TrainerPodsNotReady")},
        ),
        ({}, True, jobset(), {"Suspended": ("True", "Suspended")}),
        (
            {"conditions": [{**cond("Suspended"), "lastTransitionTime": "x"}]},
            False,
            jobset(),
            {"Suspended": ("False", "Resumed")},
        ),
        (
            {},
            False,
            jobset(ready=1, conditions=[cond("Completed", reason="AllJobsCompleted")]),
            {"Complete": ("True", "AllJobsCompleted")},
        ),
        (
            {},
            False,
            jobset(conditions=[cond("Failed", reason="FailedJobs")]),
            {"Failed": ("True", "FailedJobs")},
        ),
        ({}, False, jobset(conditions=[cond("Failed", status="False")]), {}),
        (
            {"conditions": [{**cond("Running"), "lastTransitionTime": "x"}]},
            False,
            jobset(ready=1, conditions=[cond("Completed", reason="AllJobsCompleted")]),
            {"Running": ("False", "AllJobsCompleted"), "Complete": ("True", "AllJobsCompleted")},
        ),
    ],
    ids=[
        "starting",
        "all-pods-ready",
        "pod-lost",
        "suspended",
        "resumed",
        "completed",
        "failed",
        "failed-false-ignored",
        "completed-stops-running",
    ],
)
def test_derive_status(before: dict, suspend: bool, js: dict, expected: dict) -> None:
    assert summary(st.derive_status(before, suspend, js, "node", NOW)) == expected


def test_transition_time_moves_only_when_the_value_changes() -> None:
    first = st.set_condition({}, "Running", True, "A", "m", NOW)
    again = st.set_condition(first, "Running", True, "B", "m2", NOW + 50)
    flipped = st.set_condition(again, "Running", False, "C", "m3", NOW + 90)
    times = [s["conditions"][0]["lastTransitionTime"] for s in (first, again, flipped)]
    assert times == [st.timestamp(NOW), st.timestamp(NOW), st.timestamp(NOW + 90)]


@pytest.mark.parametrize(
    ("status", "suspend", "deadline", "expected"),
    [
        ({}, False, None, None),
        ({}, True, 60, None),
        ({}, False, 60, -40.0),
        ({}, False, 300, 200.0),
        (
            {"conditions": [{**cond("Suspended", "False"), "lastTransitionTime": st.timestamp(NOW - 10)}]},
            False,
            60,
            50.0,
        ),
    ],
    ids=["no-deadline", "suspended-stops-the-clock", "passed", "left", "resume-restarts-the-clock"],
)
def test_deadline_counts_from_the_later_of_creation_and_resume(
    status: dict, suspend: bool, deadline: int | None, expected: float | None
) -> None:
    assert st.deadline_remaining(status, suspend, jobset(), deadline, NOW) == expected


def test_work_queue_deduplicates_retries_and_delays() -> None:
    calls: list[tuple[str, float]] = []
    failures = {"flaky": 1}

    async def handle(key: object) -> float | None:
        calls.append((str(key), time.monotonic()))
        if failures.get(str(key), 0):
            failures[str(key)] -= 1
            raise RuntimeError("API server unavailable")
        return None

    async def scenario() -> None:
        queue = WorkQueue()
        for _ in range(5):
            queue.add("dup")
        queue.add("flaky")
        queue.add("later", after=0.3)
        queue.add("later", after=0.2)  # the earlier time wins
        workers = asyncio.create_task(queue.run_workers(handle, workers=2))
        await asyncio.sleep(1.0)
        workers.cancel()
        await asyncio.gather(workers, return_exceptions=True)

    start = time.monotonic()
    asyncio.run(scenario())
    names = [name for name, _ in calls]
    assert names.count("dup") == 1
    assert names.count("flaky") == 2  # failed once, retried after backoff
    assert names.count("later") == 1
    # Real clock (WorkQueue takes none): guards that a delayed key waits its earlier delay, not much longer.
    assert 0.15 < next(t for n, t in calls if n == "later") - start < 0.5
