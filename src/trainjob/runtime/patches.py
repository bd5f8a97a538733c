"""A TrainJob's changes to its runtime's template, from either Kubeflow API generation, as one list.

Kubeflow Trainer v2.1 (the seeds) says them with ``spec.podTemplateOverrides`` (pod template changes for the jobs
named in ``targetJobs``) and ``spec.labels`` / ``spec.annotations``; v2.2+ with ``spec.runtimePatches``, one
entry per owner (``manager``), each a patch of the runtime's JobSet template:

=================================================================  ===========================================
``runtimePatches[i].trainingRuntimeSpec.template``                 what it changes
=================================================================  ===========================================
``.metadata`` (labels, annotations)                                the JobSet (and, as ``spec.labels``, its Jobs)
``.spec.replicatedJobs[k].template.metadata``                      the Jobs of replicated job ``name``
``.spec.replicatedJobs[k].template.spec.template.metadata``        their pods' labels and annotations
``.spec.replicatedJobs[k].template.spec.template.spec``            their pod spec, merged as podTemplateOverrides
                                                                   are, plus ``securityContext`` (pod and
                                                                   container) and ``terminationGracePeriodSeconds``
=================================================================  ===========================================

:func:`pod_patches` lists the pod-level changes of both, v2.1's first, each with the field path errors name::

    for patch in pod_patches(trainjob):
        for job_name, name_path in patch.targets: ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainjob.api import TrainJob


@dataclass
class PodPatch:
    """Changes to the pod template of the jobs in ``targets``; ``path`` is the field path of the change itself."""

    path: str
    #: (replicated job name, field path of that name)
    targets: list[tuple[str, str]]
    labels: dict[str, str] | None
    annotations: dict[str, str] | None
    #: A ``PodTemplateSpecOverride`` (v2.1) or ``PodSpecPatch`` (v2.2+), or ``None``.
    spec: Any


@dataclass
class MetadataChange:
    """Labels and annotations for the JobSet (``job is None``) or for the Jobs of replicated job ``job``."""

    job: str | None
    name_path: str
    labels: dict[str, str] | None
    annotations: dict[str, str] | None


def pod_patches(trainjob: TrainJob) -> list[PodPatch]:
    """Every pod-level change, in the order it applies: ``podTemplateOverrides``, then ``runtimePatches``."""
    patches = []
    for i, override in enumerate(trainjob.spec.pod_template_overrides or []):
        path = f"spec.podTemplateOverrides[{i}]"
        meta = override.metadata
        patches.append(PodPatch(
            path=path,
            targets=[(t.name, f"{path}.targetJobs[{j}].name") for j, t in enumerate(override.target_jobs)],
            labels=meta.labels if meta else None,
            annotations=meta.annotations if meta else None,
            spec=override.spec,
        ))
    for job_patch, job_path in _replicated_job_patches(trainjob):
        pod = job_patch.template.spec.template if job_patch.template and job_patch.template.spec else None
        if pod is None:
            continue
        patches.append(PodPatch(
            path=f"{job_path}.template.spec.template",
            targets=[(job_patch.name, f"{job_path}.name")],
            labels=pod.metadata.labels if pod.metadata else None,
            annotations=pod.metadata.annotations if pod.metadata else None,
            spec=pod.spec,
        ))
    return patches


def metadata_changes(trainjob: TrainJob) -> list[MetadataChange]:
    """The labels and annotations ``runtimePatches`` give the JobSet and its Jobs, in order."""
    changes = []
    for i, patch in enumerate(trainjob.spec.runtime_patches or []):
        template = patch.training_runtime_spec.template if patch.training_runtime_spec else None
        if template is not None and template.metadata is not None:
            path = f"spec.runtimePatches[{i}].trainingRuntimeSpec.template.metadata"
            changes.append(MetadataChange(None, path, template.metadata.labels, template.metadata.annotations))
    for job_patch, job_path in _replicated_job_patches(trainjob):
        meta = job_patch.template.metadata if job_patch.template else None
        if meta is not None:
            changes.append(MetadataChange(job_patch.name, f"{job_path}.name", meta.labels, meta.annotations))
    return changes


def patched_jobs(trainjob: TrainJob) -> list[tuple[str, str]]:
    """(replicated job name, field path of the name) of every job a runtime patch names."""
    return [(job_patch.name, f"{path}.name") for job_patch, path in _replicated_job_patches(trainjob)]


def _replicated_job_patches(trainjob: TrainJob) -> list[tuple[Any, str]]:
    found = []
    for i, patch in enumerate(trainjob.spec.runtime_patches or []):
        template = patch.training_runtime_spec.template if patch.training_runtime_spec else None
        jobs = template.spec.replicated_jobs if template and template.spec else None
        for k, job_patch in enumerate(jobs or []):
            path = f"spec.runtimePatches[{i}].trainingRuntimeSpec.template.spec.replicatedJobs[{k}]"
            found.append((job_patch, path))
    return found
