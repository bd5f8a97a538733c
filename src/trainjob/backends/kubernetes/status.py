"""TrainJob status from the JobSet's: pure functions, so every rule is one table-driven test away.

===============================  ==============================================================================
TrainJob condition               set when
===============================  ==============================================================================
``Suspended`` True               ``spec.suspend`` is true (reason ``Suspended``); removed on resume
``Complete`` True                the JobSet has ``Completed`` True (its reason and message are copied)
``Failed`` True                  the JobSet has ``Failed`` True (copied), the job is invalid, or the deadline passed
===============================  ==============================================================================

A job that runs (neither finished nor suspended) has no conditions at all, as under Kubeflow Trainer: the Kubeflow
SDK reports ``Running`` only for a TrainJob without conditions whose ``node`` pods all run, so a ``Running``
condition (removed when seen) or a ``Suspended`` False
left after a resume would keep it at ``Created`` for good. Whether the trainer runs is read from ``jobsStatus``
instead (:func:`trainer_running`), which mirrors the JobSet's ``replicatedJobsStatus``.

``activeDeadlineSeconds`` counts from the later of the JobSet's creation and its last resume, which JobSet records
as the ``lastTransitionTime`` of its own ``Suspended`` False condition; suspending stops the clock and resuming
restarts it, as for a Kubernetes Job, with no state of the operator's own.
"""

from __future__ import annotations

import datetime
from typing import Any

from trainjob.backends.kubernetes.resources import (
    COMPLETE,
    FAILED,
    FINISHED_STATUSES,
    RUNNING,
    SUSPENDED,
)

#: The message of the Suspended condition, Kubeflow Trainer's words.
SUSPENDED_MESSAGE = "TrainJob is suspended"
#: JobSet condition type -> TrainJob condition type.
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
        (c for t in FINISHED_STATUSES if (c := find_condition(status, t)) and c["status"] == "True"), None
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


def remove_condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    """A copy of ``status`` without the ``type_`` condition (and without ``conditions`` once none is left)."""
    conditions = [dict(c) for c in status.get("conditions") or [] if c.get("type") != type_]
    out = {k: v for k, v in status.items() if k != "conditions"}
    return {**out, "conditions": conditions} if conditions else out


def failed(status: dict[str, Any], reason: str, message: str, now: float) -> dict[str, Any]:
    """``status`` with ``Failed`` True (and no ``Running`` condition)."""
    return set_condition(remove_condition(status, RUNNING), FAILED, True, reason, message, now)


def derive_status(status: dict[str, Any], suspend: bool, jobset: dict[str, Any], now: float) -> dict[str, Any]:
    """The TrainJob status once ``jobset`` (already mirroring ``suspend``) is taken into account."""
    out = dict(status)
    js_status = jobset.get("status") or {}
    jobs = [
        {k: entry[k] for k in _JOBS_STATUS_FIELDS if k in entry}
        for entry in js_status.get("replicatedJobsStatus") or []
    ]
    if jobs:
        out["jobsStatus"] = jobs

    out = remove_condition(out, RUNNING)  # compat: a stored Running condition; can go once no TrainJob has one
    if suspend:
        out = set_condition(out, SUSPENDED, True, "Suspended", SUSPENDED_MESSAGE, now)
    else:
        out = remove_condition(out, SUSPENDED)

    for js_cond in js_status.get("conditions") or []:
        ours = _JOBSET_TERMINAL.get(js_cond.get("type", ""))
        if ours and js_cond.get("status") == "True" and finished_condition(out) is None:
            reason = js_cond.get("reason") or ("JobSetCompleted" if ours == COMPLETE else "JobSetFailed")
            message = js_cond.get("message") or f"the JobSet {js_cond['type'].lower()}"
            out = set_condition(out, ours, True, reason, message, now)
    return out


def trainer_running(status: dict[str, Any], trainer: str) -> bool:
    """Whether every started Job of the trainer's replicated job has all its pods ready (``jobsStatus``).

    JobSet counts a Job ``active`` while any of its pods is not finished and ``ready`` once ready plus succeeded
    pods reach its parallelism, so ``ready >= active > 0`` means no trainer pod is pending or restarting."""
    for entry in status.get("jobsStatus") or []:
        if entry.get("name") == trainer:
            ready, active = int(entry.get("ready") or 0), int(entry.get("active") or 0)
            return active > 0 and ready >= active and not entry.get("suspended")
    return False


def resumed_at(jobset: dict[str, Any]) -> float | None:
    """When the JobSet was last resumed: its ``Suspended`` False condition's ``lastTransitionTime``, if any."""
    cond = find_condition(jobset.get("status") or {}, SUSPENDED)
    if cond is None or cond.get("status") != "False" or not cond.get("lastTransitionTime"):
        return None
    return parse_timestamp(cond["lastTransitionTime"])


def deadline_remaining(
    suspend: bool, jobset: dict[str, Any], deadline_seconds: int | None, now: float
) -> float | None:
    """Seconds left before ``activeDeadlineSeconds`` passes (<= 0: passed); ``None`` when no clock runs.

    The clock stands still while the job is suspended, and after a resume until the JobSet says it resumed (its
    ``Suspended`` condition is still True then)."""
    created = (jobset.get("metadata") or {}).get("creationTimestamp")
    if not deadline_seconds or suspend or not created or is_true(jobset.get("status") or {}, SUSPENDED):
        return None
    start = max(parse_timestamp(created), resumed_at(jobset) or 0.0)
    return start + deadline_seconds - now
