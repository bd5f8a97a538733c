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


OLD_RUNNING = {"conditions": [{**cond("Running"), "lastTransitionTime": "x"}]}
OLD_RESUMED = {"conditions": [{**cond("Suspended", "False", "Resumed"), "lastTransitionTime": "x"}]}


@pytest.mark.parametrize(
    ("before", "suspend", "js", "expected"),
    [
        ({}, False, jobset(ready=0), {}),
        ({}, False, jobset(ready=1), {}),
        (OLD_RUNNING, False, jobset(ready=1), {}),
        (OLD_RUNNING, False, jobset(ready=0), {}),
        ({}, True, jobset(), {"Suspended": ("True", "Suspended")}),
        (OLD_RUNNING, True, jobset(), {"Suspended": ("True", "Suspended")}),
        ({"conditions": [{**cond("Suspended"), "lastTransitionTime": "x"}]}, False, jobset(), {}),
        (OLD_RESUMED, False, jobset(ready=1), {}),
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
            OLD_RUNNING,
            False,
            jobset(ready=1, conditions=[cond("Completed", reason="AllJobsCompleted")]),
            {"Complete": ("True", "AllJobsCompleted")},
        ),
    ],
    ids=[
        "starting-has-no-conditions",
        "running-has-no-conditions",
        "an-old-running-condition-is-removed",
        "an-old-running-false-condition-is-removed",
        "suspended",
        "suspending-removes-an-old-running-condition",
        "resume-removes-suspended",
        "an-old-suspended-false-is-removed",
        "completed",
        "failed",
        "failed-false-ignored",
        "completed-removes-an-old-running-condition",
    ],
)
def test_derive_status(before: dict, suspend: bool, js: dict, expected: dict) -> None:
    assert summary(st.derive_status(before, suspend, js, NOW)) == expected


def test_a_job_without_conditions_keeps_none() -> None:
    """The Kubeflow SDK says Running only for a TrainJob with no ``conditions`` at all: not even an empty list."""
    assert "conditions" not in st.derive_status(OLD_RUNNING, False, jobset(ready=1), NOW)


@pytest.mark.parametrize(
    ("jobs_status", "running"),
    [
        ([], False),
        ([{"name": "node", "ready": 0, "active": 1}], False),
        ([{"name": "node", "ready": 1, "active": 1}], True),
        ([{"name": "node", "ready": 1, "active": 2}], False),
        ([{"name": "node", "ready": 2, "active": 2}, {"name": "launcher", "ready": 0, "active": 1}], True),
        ([{"name": "node", "ready": 0, "active": 0, "succeeded": 1}], False),
    ],
    ids=["no-jobs-yet", "pods-pending", "all-ready", "one-job-of-two-ready", "other-jobs-do-not-count", "finished"],
)
def test_the_trainer_runs_when_every_started_job_is_ready(jobs_status: list, running: bool) -> None:
    assert st.trainer_running({"jobsStatus": jobs_status}, "node") is running


def test_transition_time_moves_only_when_the_value_changes() -> None:
    first = st.set_condition({}, "Suspended", True, "A", "m", NOW)
    again = st.set_condition(first, "Suspended", True, "B", "m2", NOW + 50)
    flipped = st.set_condition(again, "Suspended", False, "C", "m3", NOW + 90)
    times = [s["conditions"][0]["lastTransitionTime"] for s in (first, again, flipped)]
    assert times == [st.timestamp(NOW), st.timestamp(NOW), st.timestamp(NOW + 90)]


def resumed_jobset(suspended: str, at: float) -> dict:
    """The JobSet after JobSet's controller saw a suspend (``"True"``) or a resume (``"False"``) ``at`` NOW+at."""
    js = jobset()
    js["status"]["conditions"] = [{**cond("Suspended", suspended, "ResumeJobs", "jobset is resumed"),
                                   "lastTransitionTime": st.timestamp(NOW + at)}]
    return js


@pytest.mark.parametrize(
    ("suspend", "js", "deadline", "expected"),
    [
        (False, jobset(), None, None),
        (True, jobset(), 60, None),
        (False, jobset(), 60, -40.0),
        (False, jobset(), 300, 200.0),
        (False, resumed_jobset("False", -10), 60, 50.0),
        (False, resumed_jobset("False", -500), 60, -40.0),
        (False, resumed_jobset("True", -10), 60, None),
    ],
    ids=["no-deadline", "suspended-stops-the-clock", "passed", "left", "the-jobsets-resume-restarts-the-clock",
         "a-resume-before-creation-does-not-count", "the-clock-waits-for-the-jobset-to-resume"],
)
def test_deadline_counts_from_the_later_of_creation_and_the_jobsets_resume(
    suspend: bool, js: dict, deadline: int | None, expected: float | None
) -> None:
    assert st.deadline_remaining(suspend, js, deadline, NOW) == expected


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
