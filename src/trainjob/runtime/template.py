"""Between the runtime's JobSet template (plain Kubernetes dicts) and the plan's typed pod sets and containers.

The template is kept whole in :attr:`PodSet.template` so that rendering loses no field the plan does not model;
the typed :class:`~trainjob.runtime.plan.Container` fields win when the JobSet is rendered again.
"""

from __future__ import annotations

import copy
from typing import Any

from trainjob.api import EnvVar as ApiEnvVar
from trainjob.api import ReplicatedJob, Runtime
from trainjob.constants import (
    ANCESTOR_STEP_LABEL,
    DATASET_INITIALIZER,
    MODEL_INITIALIZER,
    TRAINER_JOB,
    TRAINER_STEP,
)
from trainjob.errors import ValidationError
from trainjob.runtime.plan import Container, ContainerPort, EnvVar, Plan, PodSet, Resources

__all__ = ["DATASET_INITIALIZER", "MODEL_INITIALIZER"]


def ancestor_step(job: ReplicatedJob) -> str | None:
    """The ``trainjob-ancestor-step`` label of a replicated job, else its name for the well-known jobs."""
    labels = (job.template.get("metadata") or {}).get("labels") or {}
    step = labels.get(ANCESTOR_STEP_LABEL)
    if step:
        return step
    return job.name if job.name in (TRAINER_JOB, DATASET_INITIALIZER, MODEL_INITIALIZER) else None


def pod_spec(template: dict[str, Any]) -> dict[str, Any]:
    """The pod spec inside a replicated job's JobTemplateSpec, created empty where missing."""
    job_spec = template.setdefault("spec", {})
    pod_template = job_spec.setdefault("template", {})
    return pod_template.setdefault("spec", {})


def pod_metadata(template: dict[str, Any]) -> dict[str, Any]:
    """The pod template metadata inside a replicated job's JobTemplateSpec, created empty where missing."""
    pod_template = template.setdefault("spec", {}).setdefault("template", {})
    return pod_template.setdefault("metadata", {})


def pod_sets_from_runtime(runtime: Runtime) -> list[PodSet]:
    """One pod set per replicated job, in template order; counts are ``replicas x parallelism``."""
    out = []
    for job in runtime.spec.template.spec.replicated_jobs:
        template = copy.deepcopy(job.template)
        spec = pod_spec(template)
        containers = [container_from_dict(c) for c in spec.get("containers") or []]
        parallelism = (template.get("spec") or {}).get("parallelism") or 1
        out.append(
            PodSet(
                name=job.name,
                count=(job.replicas or 1) * parallelism,
                replicas=job.replicas or 1,
                depends_on=copy.deepcopy(job.depends_on or []),
                group_name=job.group_name,
                containers=containers,
                ancestor_step=ancestor_step(job),
                template=template,
            )
        )
    return out


def trainer_pod_set(pod_sets: list[PodSet], runtime_name: str) -> PodSet:
    """The pod set labelled ``trainer`` (or named ``node``); a runtime without one cannot run a TrainJob."""
    for pod_set in pod_sets:
        if pod_set.ancestor_step == TRAINER_STEP:
            return pod_set
    for pod_set in pod_sets:
        if pod_set.name == TRAINER_JOB:
            return pod_set
    raise ValidationError(
        "spec.template.spec.replicatedJobs",
        f"runtime {runtime_name!r} has no trainer job: name one replicated job {TRAINER_JOB!r} or label it "
        f"{ANCESTOR_STEP_LABEL}: {TRAINER_STEP}",
    )


def main_container(pod_set: PodSet, preferred: str) -> Container:
    """The container named ``preferred``, else the first one; a pod set without containers gets one."""
    for container in pod_set.containers:
        if container.name == preferred:
            return container
    if not pod_set.containers:
        pod_set.containers.append(Container(name=preferred))
    return pod_set.containers[0]


def container_from_dict(data: dict[str, Any]) -> Container:
    """A plan container from a Kubernetes container dict."""
    resources = data.get("resources") or {}
    return Container(
        name=data.get("name", ""),
        image=data.get("image"),
        command=list(data.get("command") or []),
        args=list(data.get("args") or []),
        env=[env_from_dict(e) for e in data.get("env") or []],
        ports=[
            ContainerPort(
                container_port=p["containerPort"], name=p.get("name"), protocol=p.get("protocol", "TCP")
            )
            for p in data.get("ports") or []
        ],
        resources=Resources(
            requests={k: str(v) for k, v in (resources.get("requests") or {}).items()},
            limits={k: str(v) for k, v in (resources.get("limits") or {}).items()},
            claims=copy.deepcopy(list(resources.get("claims") or [])),
        ),
        volume_mounts=copy.deepcopy(list(data.get("volumeMounts") or [])),
        working_dir=data.get("workingDir"),
    )


def container_to_dict(container: Container, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Kubernetes container dict: the plan's typed fields first, then the fields of ``base`` (the template's
    container) that the plan does not model (``securityContext``, ``envFrom`` ...)."""
    resources = {
        "requests": dict(container.resources.requests),
        "limits": dict(container.resources.limits),
        "claims": copy.deepcopy(container.resources.claims),
    }
    typed: dict[str, Any] = {
        "name": container.name,
        "image": container.image,
        "command": list(container.command),
        "args": list(container.args),
        "workingDir": container.working_dir,
        "env": [env_to_dict(e) for e in container.env],
        "ports": [port_to_dict(p) for p in container.ports],
        "resources": {k: v for k, v in resources.items() if v},
        "volumeMounts": copy.deepcopy(container.volume_mounts),
    }
    out = {k: v for k, v in typed.items() if v}
    out.update({k: copy.deepcopy(v) for k, v in (base or {}).items() if k not in typed})
    return out


def object_metadata(plan: Plan, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """The metadata of an object rendered for ``plan``: named after the job, in its namespace; empty label and
    annotation maps are left out."""
    meta: dict[str, Any] = {"name": plan.job_name, "namespace": plan.namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def env_from_dict(data: dict[str, Any]) -> EnvVar:
    return EnvVar(name=data["name"], value=data.get("value"), value_from=copy.deepcopy(data.get("valueFrom")))


def env_from_api(var: ApiEnvVar) -> EnvVar:
    return env_from_dict(var.to_dict())


def env_to_dict(var: EnvVar) -> dict[str, Any]:
    out: dict[str, Any] = {"name": var.name}
    if var.value_from is not None:
        out["valueFrom"] = copy.deepcopy(var.value_from)
    else:
        out["value"] = var.value if var.value is not None else ""
    return out


def port_to_dict(port: ContainerPort) -> dict[str, Any]:
    out: dict[str, Any] = {"containerPort": port.container_port, "protocol": port.protocol}
    if port.name:
        out["name"] = port.name
    return out


def upsert_env(container: Container, variables: list[EnvVar]) -> None:
    """Set each variable on ``container``: replace one of the same name in place, else append."""
    index = {var.name: i for i, var in enumerate(container.env)}
    for var in variables:
        if var.name in index:
            container.env[index[var.name]] = var
        else:
            index[var.name] = len(container.env)
            container.env.append(var)
