"""API objects (TrainJob, pods, events, runtimes as the API server returns them) -> the SDK's types.

Pure functions: the backend fetches, these translate::

    job = trainjob_view(api_object, pods)     # trainjob.types.TrainJob, status from the conditions
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from trainjob import types
from trainjob.backends.kubernetes.resources import (
    COMPLETE,
    COMPLETION_INDEX_LABEL,
    FAILED,
    REPLICATED_JOB_LABEL,
    RUNNING,
    RUNTIME_SNAPSHOT_ANNOTATION,
    SUSPENDED,
)
from trainjob.backends.kubernetes.status import find_condition
from trainjob.progress import progress_of_trainer_status

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
    """The SDK status (``Complete``, ``Failed``, ``Suspended``, ``Running``, ``Created``) and its condition."""
    for type_, status in ((COMPLETE, types.COMPLETE), (FAILED, types.FAILED), (SUSPENDED, types.SUSPENDED)):
        if (cond := _condition(job, type_)) is not None:
            return status, cond
    if (cond := _condition(job, RUNNING)) is not None:
        return types.RUNNING, cond
    return types.CREATED, None


def node_index(pod: dict[str, Any]) -> int:
    """The node (completion index) a trainer pod runs."""
    meta = pod.get("metadata") or {}
    value = (meta.get("labels") or {}).get(COMPLETION_INDEX_LABEL) or (meta.get("annotations") or {}).get(
        COMPLETION_INDEX_LABEL
    )
    return int(value) if value is not None else 0


def trainer_pods(pods: list[dict[str, Any]], trainer: str = "node") -> dict[int, dict[str, Any]]:
    """Trainer pods by node index (the newest pod wins when a node's pod was replaced)."""
    out: dict[int, dict[str, Any]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        if (pod["metadata"].get("labels") or {}).get(REPLICATED_JOB_LABEL, trainer) == trainer:
            out[node_index(pod)] = pod
    return out


def runtime_view(name: str, spec: dict[str, Any]) -> types.Runtime:
    """A (Cluster)TrainingRuntime ``spec`` as the SDK's ``Runtime``."""
    ml = spec.get("mlPolicy") or {}
    framework = "torch" if "torch" in ml else "mpi" if "mpi" in ml else "plainml"
    image, command = types.UNKNOWN, ()
    for rj in ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
        if rj.get("name") == "node":
            containers = ((rj.get("template") or {}).get("spec") or {}).get("template", {}).get(
                "spec", {}
            ).get("containers") or []
            if containers:
                image = containers[0].get("image", types.UNKNOWN)
                command = tuple(containers[0].get("command") or ())
    trainer = types.RuntimeTrainer(
        trainer_type="CustomTrainer",
        framework=framework,
        image=image,
        num_nodes=int(ml.get("numNodes") or 1),
        command=command,
    )
    return types.Runtime(name=name, trainer=trainer)


def trainjob_view(job: dict[str, Any], pods: list[dict[str, Any]]) -> types.TrainJob:
    """A TrainJob object (and its pods) as the SDK's ``TrainJob``."""
    meta, spec = job["metadata"], job.get("spec") or {}
    trainer = spec.get("trainer") or {}
    snapshot_text = (meta.get("annotations") or {}).get(RUNTIME_SNAPSHOT_ANNOTATION)
    snapshot = json.loads(snapshot_text) if snapshot_text else None
    ref_name = (spec.get("runtimeRef") or {}).get("name", types.UNKNOWN)
    runtime = runtime_view(ref_name, snapshot["spec"] if snapshot else {})
    status, cond = job_status(job)
    nodes = trainer.get("numNodes") or runtime.trainer.num_nodes
    nproc = trainer.get("numProcPerNode")
    resolved = resolved_shape(job, snapshot, pods)
    if resolved is not None:  # numProcPerNode auto|cpu|gpu, or taken from the runtime: the numbers the pods run
        nodes, nproc = resolved[0] or nodes, resolved[1]
    running = _condition(job, RUNNING)
    finished = _condition(job, COMPLETE) or _condition(job, FAILED)
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
        reason=cond.get("reason") if cond else None,
        message=cond.get("message") if cond else None,
        num_proc_per_node=nproc if isinstance(nproc, int) else None,
        start_time=parse_time(running.get("lastTransitionTime")) if running else None,
        completion_time=parse_time(finished.get("lastTransitionTime")) if finished else None,
        progress=progress_of_trainer_status((job.get("status") or {}).get("trainerStatus")),
        resource=job,
    )


def resolved_shape(
    job: dict[str, Any], snapshot: dict[str, Any] | None, pods: list[dict[str, Any]]
) -> tuple[int | None, int] | None:
    """``(nodes, processes per node)`` as the job runs them: resolved from the runtime snapshot the operator
    recorded (so ``numProcPerNode: auto`` counts the requested GPUs or CPUs), else read from a trainer pod's
    ``PET_NNODES`` / ``PET_NPROC_PER_NODE`` (nodes ``None`` when elastic); ``None`` when neither is there yet."""
    if snapshot is not None:
        plan = _plan(job, snapshot)
        if plan is not None:
            return plan.num_nodes, plan.num_proc_per_node
    for pod in trainer_pods(pods).values():
        for container in ((pod.get("spec") or {}).get("containers")) or []:
            env = {e.get("name"): e.get("value") for e in container.get("env") or []}
            nnodes, nproc = env.get("PET_NNODES") or "", env.get("PET_NPROC_PER_NODE") or ""
            if nproc.isdigit():
                return (int(nnodes) if nnodes.isdigit() else None), int(nproc)
    return None


def _plan(job: dict[str, Any], snapshot: dict[str, Any]) -> Any:
    """The job resolved against its runtime snapshot, as the operator resolved it; ``None`` when it cannot be."""
    from trainjob.api import TrainJob, resource_from_dict
    from trainjob.errors import TrainJobError
    from trainjob.runtime import resolve

    meta = job["metadata"]
    try:
        model = TrainJob.from_dict({
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if meta.get(k)},
            "spec": job.get("spec") or {},
        })
        runtime_meta = {"name": snapshot["name"], "labels": snapshot.get("labels") or {}}
        if snapshot.get("kind") == "TrainingRuntime":
            runtime_meta["namespace"] = meta.get("namespace", "default")
        runtime = resource_from_dict({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": snapshot["kind"],
                                      "metadata": runtime_meta, "spec": snapshot["spec"]})
        return resolve(model, runtime)
    except (TrainJobError, KeyError, TypeError, ValueError):
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
