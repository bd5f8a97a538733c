"""A claim for ``/workspace`` when a job's initializers and its trainer share nothing there.

Kubeflow's initializers write ``/workspace/dataset`` and ``/workspace/model`` and its trainers read them there, but
only a volume both mount makes that work: Kubeflow's LLM runtimes declare one (the JobSet's
``volumeClaimPolicies``), its ``examples/yaml/05-multi-step.yaml`` does not, and the trainer finds nothing. When a
JobSet has initializer jobs (``dataset-initializer``, ``model-initializer``) and its trainer mounts nothing at or
under ``/workspace`` (and it declares no ``volumeClaimPolicies``), the operator makes one claim for the job,
``<job>-workspace`` (owned by the TrainJob: it goes with it), and mounts it at ``/workspace`` in the initializers'
and the trainer's containers as volume ``initializer`` (Kubeflow's name). The JobSet's own ``volumeClaimPolicies``
would need JobSet v0.11; this works with any JobSet.

===========================================  ======================================================================
annotation of the TrainJob                   meaning
===========================================  ======================================================================
``trainjob/workspace-size``                  the claim's storage request (default ``10Gi``)
``trainjob/workspace-storage-class``         its StorageClass (default: the cluster's default class)
``trainjob/workspace-access-mode``           ``ReadWriteOnce`` (default, as Kubeflow's runtimes: the pods share a
                                             node), ``ReadWriteMany`` (nodes spread over the cluster: NFS, CephFS,
                                             EFS ...) or ``ReadWriteOncePod``
===========================================  ======================================================================
"""

from __future__ import annotations

import copy
import os
from typing import Any

from trainjob.constants import (
    ANCESTOR_STEP_LABEL,
    DATASET_INITIALIZER,
    MODEL_INITIALIZER,
    TRAINER_JOB,
    TRAINER_STEP,
    WORKSPACE_ACCESS_MODE_ANNOTATION,
    WORKSPACE_SIZE_ANNOTATION,
    WORKSPACE_STORAGE_CLASS_ANNOTATION,
)
from trainjob.errors import ValidationError

WORKSPACE_PATH = "/workspace"
WORKSPACE_VOLUME = "initializer"
DEFAULT_SIZE = "10Gi"
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
_INITIALIZER_STEPS = (DATASET_INITIALIZER, MODEL_INITIALIZER)


def claim_name(job_name: str) -> str:
    return f"{job_name}-workspace"


def add_workspace_claim(jobset: dict[str, Any], annotations: dict[str, str] | None) -> dict[str, Any] | None:
    """Mount a claim at ``/workspace`` in ``jobset``'s initializer and trainer containers when they need one (see
    the module); the PersistentVolumeClaim to create (named for the JobSet, in its namespace), or ``None``."""
    spec = jobset.get("spec") or {}
    if spec.get("volumeClaimPolicies"):
        return None
    jobs = spec.get("replicatedJobs") or []
    initializers = [rj for rj in jobs if _step(rj) in _INITIALIZER_STEPS]
    trainer = next((rj for rj in jobs if _step(rj) == TRAINER_STEP), None) or next(
        (rj for rj in jobs if rj.get("name") == TRAINER_JOB), None)
    if not initializers or trainer is None or _mounts_workspace(_main_container(trainer)):
        return None
    name = claim_name(jobset["metadata"]["name"])
    for replicated in [*initializers, trainer]:
        pod = replicated["template"]["spec"]["template"]["spec"]
        pod["volumes"] = [v for v in pod.get("volumes") or [] if v.get("name") != WORKSPACE_VOLUME] + [
            {"name": WORKSPACE_VOLUME, "persistentVolumeClaim": {"claimName": name}}]
        container = _main_container(replicated)
        if not _mounts_workspace(container):
            container.setdefault("volumeMounts", []).append({"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE_PATH})
    return _claim(name, jobset["metadata"].get("namespace"), annotations or {})


def _claim(name: str, namespace: str | None, annotations: dict[str, str]) -> dict[str, Any]:
    from trainjob.api.quantity import parse_quantity

    size = annotations.get(WORKSPACE_SIZE_ANNOTATION, DEFAULT_SIZE)
    try:
        if parse_quantity(size) <= 0:
            raise ValueError(size)
    except (ValueError, ArithmeticError, TypeError):
        raise ValidationError(f"metadata.annotations[{WORKSPACE_SIZE_ANNOTATION}]",
                              f"must be a storage quantity such as 10Gi, got {size!r}") from None
    mode = annotations.get(WORKSPACE_ACCESS_MODE_ANNOTATION, ACCESS_MODES[0])
    if mode not in ACCESS_MODES:
        raise ValidationError(f"metadata.annotations[{WORKSPACE_ACCESS_MODE_ANNOTATION}]",
                              f"must be one of {', '.join(ACCESS_MODES)}, got {mode!r}")
    claim: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": size}}},
    }
    storage_class = annotations.get(WORKSPACE_STORAGE_CLASS_ANNOTATION)
    if storage_class is not None:
        claim["spec"]["storageClassName"] = storage_class
    return copy.deepcopy(claim)


def _step(replicated: dict[str, Any]) -> str:
    labels = ((replicated.get("template") or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(ANCESTOR_STEP_LABEL) or (replicated.get("name") if replicated.get("name") in
                                                 _INITIALIZER_STEPS else "") or ""


def _main_container(replicated: dict[str, Any]) -> dict[str, Any]:
    containers = replicated["template"]["spec"]["template"]["spec"].get("containers") or [{}]
    return next((c for c in containers if c.get("name") == replicated.get("name")), containers[0])


def _mounts_workspace(container: dict[str, Any]) -> bool:
    paths = (os.path.normpath(m.get("mountPath") or "/") for m in container.get("volumeMounts") or [])
    return any(p == WORKSPACE_PATH or p.startswith(WORKSPACE_PATH + "/") for p in paths)
