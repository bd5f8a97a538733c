"""API objects (TrainJob, pods, events, runtimes as the API server returns them) -> the SDK's types.

Pure functions: the backend fetches, these translate::

    job = trainjob_view(api_object, pods)     # trainjob.sdk.types.TrainJob, status from the conditions
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from trainjob.backends.base import restarts_by_reason, runtime_view
from trainjob.backends.kubernetes.status import find_condition, trainer_running
from trainjob.constants import (
    ANCESTOR_STEP_LABEL,
    COMPLETE,
    COMPLETION_INDEX_LABEL,
    FAILED,
    LAUNCH_ANNOTATION,
    MASTER_PORT,
    PET_MASTER_PORT,
    PET_NNODES,
    PET_NPROC_PER_NODE,
    REPLICATED_JOB_LABEL,
    RUNTIME_SNAPSHOT_ANNOTATION,
    SUSPENDED,
    TRAINER_CONTAINER,
    TRAINER_JOB,
    UNSCHEDULABLE,
)
from trainjob.progress import progress_of_trainer_status
from trainjob.runtime.launch import LaunchValues
from trainjob.sdk import types

_EPOCH = datetime.datetime.fromtimestamp(0, tz=datetime.UTC)


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def _condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The job's ``type_`` condition when it is ``True``, else ``None``."""
    cond = find_condition(job.get("status") or {}, type_)
    return cond if cond is not None and cond.get("status") == "True" else None


def job_status(job: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The SDK status (``Complete``, ``Failed``, ``Suspended``, ``Running``, ``Created``) and its condition.

    Complete, Failed and Suspended come from a True condition of that type; a job without them is ``Running`` once
    every trainer pod is ready (``jobsStatus``, :func:`~.status.trainer_running`): the operator writes no
    condition while a job runs, as Kubeflow Trainer does, which the Kubeflow SDK needs to say Running."""
    for type_, status in ((COMPLETE, types.COMPLETE), (FAILED, types.FAILED), (SUSPENDED, types.SUSPENDED)):
        if (cond := _condition(job, type_)) is not None:
            return status, cond
    if (cond := _condition(job, UNSCHEDULABLE)) is not None:  # pods the scheduler cannot place: said why
        return types.CREATED, cond
    if trainer_running(job.get("status") or {}, TRAINER_JOB):
        return types.RUNNING, None
    return types.CREATED, None


def started_at(pods: list[dict[str, Any]]) -> datetime.datetime | None:
    """When the job's trainer started: the earliest ``startTime`` of its current trainer pods."""
    times = [t for pod in trainer_pods(pods).values() if (t := parse_time((pod.get("status") or {}).get("startTime")))]
    return min(times) if times else None


def node_index(pod: dict[str, Any]) -> int:
    """The node (completion index) a trainer pod runs."""
    meta = pod.get("metadata") or {}
    value = (meta.get("labels") or {}).get(COMPLETION_INDEX_LABEL) or (meta.get("annotations") or {}).get(
        COMPLETION_INDEX_LABEL
    )
    return int(value) if value is not None else 0


def trainer_pods(pods: list[dict[str, Any]], trainer: str = TRAINER_JOB) -> dict[int, dict[str, Any]]:
    """Trainer pods by node index (the newest pod wins when a node's pod was replaced)."""
    out: dict[int, dict[str, Any]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        if (pod["metadata"].get("labels") or {}).get(REPLICATED_JOB_LABEL, trainer) == trainer:
            out[node_index(pod)] = pod
    return out


def trainer_name(jobset: dict[str, Any]) -> str:
    """The replicated job that runs the trainer: labelled ``trainjob-ancestor-step: trainer``, else ``node``."""
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        labels = ((rj.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_STEP_LABEL) == "trainer":
            return str(rj["name"])
    return TRAINER_JOB


def trainer_container(pod: dict[str, Any]) -> str:
    """The trainer container of a node pod: ``node``, else the pod's first container."""
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    return TRAINER_CONTAINER if TRAINER_CONTAINER in names or not names else str(names[0])


def _recorded(job: dict[str, Any], jobset: dict[str, Any] | None) -> dict[str, str]:
    """What was recorded about the job (runtime snapshot, launch values): on its JobSet, where the JobSet's
    create wrote them, or on the job itself (the launch values trainjob's client writes at submit)."""
    keys = (RUNTIME_SNAPSHOT_ANNOTATION, LAUNCH_ANNOTATION)
    out = {k: v for k, v in (((jobset or {}).get("metadata") or {}).get("annotations") or {}).items() if k in keys}
    out.update({k: v for k, v in ((job.get("metadata") or {}).get("annotations") or {}).items() if k in keys})
    return out


def trainjob_view(job: dict[str, Any], pods: list[dict[str, Any]],
                  jobset: dict[str, Any] | None = None, queued: str | None = None) -> types.TrainJob:
    """A TrainJob object (and its pods, and its JobSet when readable) as the SDK's ``TrainJob``. ``queued``: where
    the job waits in Kueue (:func:`.kueue.queue_state`), shown as its reason and message while it is not running."""
    meta, spec = job["metadata"], job.get("spec") or {}
    trainer = spec.get("trainer") or {}
    recorded = _recorded(job, jobset)
    snapshot_text = recorded.get(RUNTIME_SNAPSHOT_ANNOTATION)
    snapshot = json.loads(snapshot_text) if snapshot_text else None
    ref_name = (spec.get("runtimeRef") or {}).get("name", types.UNKNOWN)
    runtime = runtime_view({"metadata": {"name": ref_name, "labels": (snapshot or {}).get("labels") or {}},
                            "spec": (snapshot or {}).get("spec") or {}})
    status, cond = job_status(job)
    nodes = trainer.get("numNodes") or runtime.trainer.num_nodes
    nproc = trainer.get("numProcPerNode")
    launch = launch_values(job, pods, jobset)
    if launch is not None:  # numProcPerNode auto|cpu|gpu, or taken from the runtime: the numbers the pods run
        nodes, nproc = launch.num_nodes, launch.num_proc_per_node
    finished = _condition(job, COMPLETE) or _condition(job, FAILED)
    reason, message = (cond.get("reason"), cond.get("message")) if cond else (None, None)
    if queued and finished is None and status in (types.SUSPENDED, types.CREATED):
        reason, message = "Queued", queued
    steps = [
        types.Step(
            name=f"node-{index}",
            status=(pod.get("status") or {}).get("phase"),
            pod_name=pod["metadata"]["name"],
        )
        for index, pod in sorted(trainer_pods(pods).items())
    ]
    return types.TrainJob(
        name=meta["name"],
        runtime=runtime,
        steps=steps,
        num_nodes=int(nodes),
        creation_timestamp=parse_time(meta.get("creationTimestamp")) or _EPOCH,
        status=status,
        reason=reason,
        message=message,
        num_proc_per_node=nproc if isinstance(nproc, int) else None,
        start_time=started_at(pods),
        completion_time=parse_time(finished.get("lastTransitionTime")) if finished else None,
        restarts=sum(restarts_of(job, jobset).values()),
        progress=progress_of_trainer_status((job.get("status") or {}).get("trainerStatus")),
        resource=job,
    )


def restarts_of(job: dict[str, Any], jobset: dict[str, Any] | None = None) -> dict[str, int]:
    """:func:`~trainjob.backends.base.restarts_by_reason` of the job, its JobSet's own count when that is ahead of
    the one the operator reported."""
    counts = restarts_by_reason((job.get("metadata") or {}).get("annotations"))
    counts["failure"] = max(counts["failure"], int(((jobset or {}).get("status") or {}).get("restarts") or 0))
    return counts


def launch_values(job: dict[str, Any], pods: list[dict[str, Any]],
                  jobset: dict[str, Any] | None = None) -> LaunchValues | None:
    """The launch values the job runs with: the ``trainjob/launch`` annotation written when the job was resolved
    (:data:`~trainjob.constants.LAUNCH_ANNOTATION`, on the job or its JobSet), else a trainer pod's ``PET_NNODES`` /
    ``PET_NPROC_PER_NODE``; ``None`` when neither is there (a job written by an older client, before its pods)."""
    text = _recorded(job, jobset).get(LAUNCH_ANNOTATION)
    if text:
        try:
            return LaunchValues.from_dict(json.loads(text))
        except (ValueError, TypeError):  # not JSON, or not launch values: the pods may tell
            pass
    for pod in trainer_pods(pods).values():
        for container in ((pod.get("spec") or {}).get("containers")) or []:
            env = {e.get("name"): e.get("value") for e in container.get("env") or []}
            values = _launch_of_env(env)
            if values is not None:
                return values
    return None


def _launch_of_env(env: dict[str, Any]) -> LaunchValues | None:
    """Launch values from torchrun's environment (``PET_NNODES`` is ``N`` or ``MIN:MAX``); ``None`` if absent."""
    nnodes, nproc = str(env.get(PET_NNODES) or ""), str(env.get(PET_NPROC_PER_NODE) or "")
    port = str(env.get(PET_MASTER_PORT) or "")
    low, _, high = nnodes.partition(":")
    if not (nproc.isdigit() and low.isdigit() and (high.isdigit() or not high)):
        return None
    try:
        return LaunchValues(
            num_nodes=int(high or low), num_proc_per_node=int(nproc),
            master_port=int(port) if port.isdigit() else MASTER_PORT,
            min_nodes=int(low) if high else None, max_nodes=int(high) if high else None,
        )
    except ValueError:
        return None


def event_view(event: dict[str, Any]) -> types.Event:
    involved = event.get("involvedObject") or {}
    when = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
    return types.Event(
        involved_object_kind=involved.get("kind", ""),
        involved_object_name=involved.get("name", ""),
        message=event.get("message", ""),
        reason=event.get("reason", ""),
        event_time=parse_time(when) or _EPOCH,
        type=event.get("type", "Normal"),
    )
