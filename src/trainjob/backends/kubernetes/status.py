"""TrainJob status from the JobSet's: pure functions, so every rule is one table-driven test away.

===============================  ==============================================================================
TrainJob condition               set when
===============================  ==============================================================================
``Suspended`` True / False       ``spec.suspend`` is true (reason ``Suspended``) / was true and is not (``Resumed``)
``Running`` True                 every pod of the trainer replicated job is ready (JobSet ``replicatedJobsStatus``)
``Complete`` True                the JobSet has ``Completed`` True (its reason and message are copied)
``Failed`` True                  the JobSet has ``Failed`` True (copied), the job is invalid, or the deadline passed
===============================  ==============================================================================

``jobsStatus`` mirrors the JobSet's ``replicatedJobsStatus``. ``activeDeadlineSeconds`` counts from the later of the
JobSet's creation and the last resume (suspending stops the clock, resuming restarts it, as for a Kubernetes Job),
so no extra state is needed and the status keeps the Kubeflow Trainer shape.
"""

from __future__ import annotations

import datetime
from typing import Any

from trainjob.backends.kubernetes.resources import (
    COMPLETE,
    FAILED,
    FINISHED_CONDITIONS,
    RUNNING,
    SUSPENDED,
)

#: JobSet condition type -> TrainJob condition type.
#: The messages of the Suspended condition, Kubeflow Trainer's words.
SUSPENDED_MESSAGE = "TrainJob is suspended"
RESUMED_MESSAGE = "TrainJob is resumed"
_JOBSET_TERMINAL = {"Completed": COMPLETE, "Failed": FAILED}
_JOBS_STATUS_FIELDS = ("name", "ready", "succeeded", "failed", "active", "suspended")


def timestamp(now: float) -> str:
    """RFC 3339 in UTC, the way Kubernetes writes times: ``2026-01-02T03:04:05Z``."""
    return datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(value: str) -> float:
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()


def find_condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def is_true(status: dict[str, Any], type_: str) -> bool:
    cond = find_condition(status, type_)
    return cond is not None and cond.get("status") == "True"


def finished_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    """The ``Complete`` or ``Failed`` condition when the job has finished, else ``None``."""
    return next(
        (c for t in FINISHED_CONDITIONS if (c := find_condition(status, t)) and c["status"] == "True"), None
    )


def set_condition(
    status: dict[str, Any], type_: str, value: bool, reason: str, message: str, now: float
) -> dict[str, Any]:
    """A copy of ``status`` with the condition set; ``lastTransitionTime`` moves only when the value changes."""
    conditions = [dict(c) for c in status.get("conditions") or []]
    text = "True" if value else "False"
    current = next((c for c in conditions if c.get("type") == type_), None)
    if current is None:
        conditions.append({"type": type_})
        current = conditions[-1]
    if current.get("status") != text:
        current["lastTransitionTime"] = timestamp(now)
    current.update(status=text, reason=reason, message=message)
    return {**status, "conditions": conditions}


def failed(status: dict[str, Any], reason: str, message: str, now: float) -> dict[str, Any]:
    """``status`` with ``Failed`` True and ``Running`` False (when it was set)."""
    out = set_condition(status, FAILED, True, reason, message, now)
    if find_condition(out, RUNNING):
        out = set_condition(out, RUNNING, False, reason, "the job has failed", now)
    return out


def derive_status(
    status: dict[str, Any], suspend: bool, jobset: dict[str, Any], trainer: str, now: float
) -> dict[str, Any]:
    """The TrainJob status once ``jobset`` (already mirroring ``suspend``) is taken into account.

    ``trainer`` names the trainer replicated job (``node``).
    """
    out = dict(status)
    js_status = jobset.get("status") or {}
    jobs = [
        {k: entry[k] for k in _JOBS_STATUS_FIELDS if k in entry}
        for entry in js_status.get("replicatedJobsStatus") or []
    ]
    if jobs:
        out["jobsStatus"] = jobs

    if suspend:
        out = set_condition(
            out, SUSPENDED, True, "Suspended", SUSPENDED_MESSAGE, now
        )
    elif find_condition(out, SUSPENDED):
        out = set_condition(out, SUSPENDED, False, "Resumed", RESUMED_MESSAGE, now)

    for js_cond in js_status.get("conditions") or []:
        ours = _JOBSET_TERMINAL.get(js_cond.get("type", ""))
        if ours and js_cond.get("status") == "True" and finished_condition(out) is None:
            reason = js_cond.get("reason") or ("JobSetCompleted" if ours == COMPLETE else "JobSetFailed")
            message = js_cond.get("message") or f"the JobSet {js_cond['type'].lower()}"
            out = set_condition(out, ours, True, reason, message, now)

    done = finished_condition(out)
    if done is not None:
        if find_condition(out, RUNNING):
            out = set_condition(
                out, RUNNING, False, done["reason"], f"the job is {done['type'].lower()}", now
            )
    elif suspend:
        if find_condition(out, RUNNING):
            out = set_condition(out, RUNNING, False, "Suspended", "the TrainJob is suspended", now)
    else:
        expected = trainer_replicas(jobset, trainer)
        ready = next((j.get("ready", 0) for j in jobs if j["name"] == trainer), 0)
        pods = trainer_pods(jobset, trainer)
        if expected and ready >= expected:
            out = set_condition(
                out, RUNNING, True, "AllTrainerPodsRunning", f"all {pods} trainer pods run", now
            )
        elif find_condition(out, RUNNING):
            message = "not every trainer pod runs (a pod restarts or was evicted)"
            out = set_condition(out, RUNNING, False, "TrainerPodsNotReady", message, now)
    return out


def trainer_replicas(jobset: dict[str, Any], trainer: str) -> int:
    """How many Jobs (one per node) the trainer replicated job has."""
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if rj.get("name") == trainer:
            return int(rj.get("replicas", 1))
    return 0


def trainer_pods(jobset: dict[str, Any], trainer: str) -> int:
    """How many pods the trainer runs: Jobs times each Job's parallelism."""
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if rj.get("name") == trainer:
            parallelism = ((rj.get("template") or {}).get("spec") or {}).get("parallelism", 1)
            return int(rj.get("replicas", 1)) * int(parallelism)
    return 0


def deadline_remaining(
    status: dict[str, Any], suspend: bool, jobset: dict[str, Any], deadline_seconds: int | None, now: float
) -> float | None:
    """Seconds left before ``activeDeadlineSeconds`` passes (<= 0: passed); ``None`` when no clock runs."""
    created = (jobset.get("metadata") or {}).get("creationTimestamp")
    if not deadline_seconds or suspend or not created:
        return None
    start = parse_timestamp(created)
    resumed = find_condition(status, SUSPENDED)
    if resumed is not None and resumed.get("status") == "False" and resumed.get("lastTransitionTime"):
        start = max(start, parse_timestamp(resumed["lastTransitionTime"]))
    return start + deadline_seconds - now
