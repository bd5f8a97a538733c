"""Store rows as the SDK's types, and the TrainJob resource with its status filled in for ``get -o yaml``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from trainjob.constants import TRAINER_JOB
from trainjob.progress import numeric_metrics, remaining_seconds, trainer_status
from trainjob.sdk import types


def timestamp(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def rfc3339(seconds: float | None) -> str | None:
    return None if seconds is None else timestamp(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def eta_seconds(
    status: str, step: int | None, total: int | None, first_step: int | None, first_time: float | None, last_time: float | None
) -> float | None:
    """Seconds left for an active job at the step rate seen between its first and last metrics records."""
    if status not in (types.CREATED, types.RUNNING):
        return None
    return remaining_seconds(step, total, first_step, first_time, last_time)


def progress(row: dict[str, Any]) -> types.Progress | None:
    """Progress from the job's last metrics record: the percentage and time left ``update_trainjob_status``
    reported, else from the steps ``report`` gave (the time left extrapolates the step rate seen so far)."""
    if row.get("metrics_time") is None:
        return None
    step, total = row["step"], row["total_steps"]
    percent, remaining = row.get("progress_percent"), row.get("remaining_seconds")
    active = row["status"] in (types.CREATED, types.RUNNING)
    if percent is None and remaining is None:
        remaining = eta_seconds(row["status"], step, total, row["first_step"], row["first_metrics_time"],
                                row["metrics_time"])
    return types.Progress(
        step=step,
        total_steps=total,
        metrics=numeric_metrics(json.loads(row["metrics"] or "{}")),
        updated=timestamp(row["metrics_time"]),
        eta_seconds=remaining if active else None,
        percent=percent,
    )


def job_summary(summary: tuple[Any, ...]) -> types.JobSummary:
    """A job's summary from the store's summary columns (:data:`~trainjob.backends.local.store.SUMMARY_COLUMNS`):
    the time left as :func:`progress` gives it, for an active job only."""
    (name, status, nodes, procs, runtime, created, started, finished, step, total, loss, last_time, first_step,
     first_time, percent, remaining, *_supervisor) = summary
    if last_time is None:
        step = total = loss = remaining = percent = None
    elif percent is None and remaining is None:
        remaining = eta_seconds(status, step, total, first_step, first_time, last_time)
    elif status not in (types.CREATED, types.RUNNING):
        remaining = None
    return types.JobSummary(
        name=name, status=status, num_nodes=nodes, num_proc_per_node=procs, runtime=runtime, created=created,
        started=started, finished=finished, step=step, total_steps=total,
        loss=loss if isinstance(loss, int | float) else None, eta_seconds=remaining, percent=percent,
    )


def sdk_runtime(name: str, num_nodes: int = 1) -> types.Runtime:
    return types.Runtime(
        name=name, trainer=types.RuntimeTrainer(trainer_type="CustomTrainer", framework="torch", image="", num_nodes=num_nodes)
    )


def job_message(row: dict[str, Any]) -> str | None:
    """The job's message, followed for its whole life by what was scaled down to fit this machine, if anything
    was (:mod:`~trainjob.backends.local.client.scaling`)."""
    scaled = row.get("scaled")
    if not scaled:
        return row["message"]
    return "; ".join(part for part in (row["message"], f"scaled to this machine: {scaled}") if part)


def sdk_job(row: dict[str, Any], nodes: list[dict[str, Any]] | None = None) -> types.TrainJob:
    """The SDK view of a job row (``nodes`` gives the steps; ``resource`` only when the row has it)."""
    name = row["name"]
    steps = [
        types.Step(name=f"node-{n['idx']}", status=n["status"], pod_name=f"{name}-node-0-{n['idx']}",
                   device="cpu", device_count=str(row["num_proc_per_node"]))
        for n in nodes or []
    ]
    return types.TrainJob(
        name=name,
        runtime=sdk_runtime(row["runtime"], row["num_nodes"]),
        steps=steps,
        num_nodes=row["num_nodes"],
        creation_timestamp=timestamp(row["created"]),
        status=row["status"],
        reason=row["reason"],
        message=job_message(row),
        num_proc_per_node=row["num_proc_per_node"],
        start_time=timestamp(row["started"]),
        completion_time=timestamp(row["finished"]),
        restarts=row["restarts"],
        progress=progress(row),
        resource=resource_with_status(row, nodes or []) if "resource" in row else {},
    )


def resource_with_status(row: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The stored TrainJob with ``status`` as a controller would report it: conditions and jobsStatus.

    The row's ``resource`` is left as it is (rows are read from the store for each call, so their documents are
    not shared): the returned resource is a copy of its top level with ``status`` set."""
    resource = {**row["resource"]}
    condition = {
        "type": row["status"],
        "status": "True",
        "reason": row["reason"] or row["status"],
        "message": job_message(row) or "",
        "lastTransitionTime": rfc3339(row["finished"] or row["started"] or row["created"]),
    }
    counts = {"active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
    for node in nodes:
        key = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}.get(node["status"])
        if key:
            counts[key] += 1
    counts["ready"] = counts["active"]
    if row["status"] == types.SUSPENDED:
        counts["suspended"] = row["num_nodes"]
    resource["status"] = {"conditions": [condition], "jobsStatus": [{"name": TRAINER_JOB, **counts}]}
    reported = trainer_status(progress(row)) if "step" in row else None
    if reported is not None:
        resource["status"]["trainerStatus"] = reported
    return resource


def sdk_event(row: dict[str, Any]) -> types.Event:
    kind, _, name = row["object"].partition("/")
    return types.Event(
        involved_object_kind=kind,
        involved_object_name=name,
        message=row["message"],
        reason=row["reason"],
        event_time=timestamp(row["time"]),
        type=row["type"],
    )
