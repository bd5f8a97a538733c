"""Kubernetes objects from a :class:`Plan`: a ``jobset.x-k8s.io/v1alpha2`` JobSet and, for gang scheduling, a
PodGroup (``scheduling.x-k8s.io/v1alpha1`` for coscheduling, ``scheduling.volcano.sh/v1beta1`` for Volcano); an MPI
plan adds its SSH keys Secret and hostfile ConfigMap (:mod:`trainjob.runtime.plugins.mpi`).

Each pod set becomes one replicated job of Indexed Jobs (``completions = parallelism`` = pods per job), so the
completion index is the node rank and, with the JobSet network's subdomain, pod ``{job}-node-0-0`` answers at
``{job}-node-0-0.{job}``. The runtime's template fields the plan does not model are kept.

>>> from trainjob.runtime import builtin_runtimes, resolve                        # doctest: +SKIP
>>> objects = render_objects(resolve(job, builtin_runtimes()["torch-distributed"]))  # doctest: +SKIP
>>> [o["kind"] for o in objects]                                                  # doctest: +SKIP
['JobSet']
"""

from __future__ import annotations

import copy
from typing import Any

from trainjob.runtime.plan import Plan, PodGroupPolicy, PodSet
from trainjob.runtime.plugins.jobset import TRAINJOB_NAME_LABEL
from trainjob.runtime.template import container_to_dict

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
COSCHEDULING_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
VOLCANO_API_VERSION = "scheduling.volcano.sh/v1beta1"
#: Jobs need a pod restart policy other than ``Always``; failures are handled by the JobSet, not in place.
DEFAULT_RESTART_POLICY = "Never"


def render_objects(plan: Plan) -> list[dict[str, Any]]:
    """The JobSet, followed by the PodGroup when the plan asks for gang scheduling, then an MPI plan's Secret and
    ConfigMap (labelled like the PodGroup)."""
    pod_group = render_podgroup(plan)
    return [render_jobset(plan), *([pod_group] if pod_group else []), *render_mpi_objects(plan)]


def render_mpi_objects(plan: Plan) -> list[dict[str, Any]]:
    """The SSH keys Secret and hostfile ConfigMap of an MPI plan; nothing for other plans."""
    if plan.mpi is None:
        return []
    from trainjob.runtime.plugins.mpi import render_hostfile_configmap, render_ssh_auth_secret

    objects = [render_ssh_auth_secret(plan), render_hostfile_configmap(plan)]
    for obj in objects:
        obj["metadata"]["labels"] = {TRAINJOB_NAME_LABEL: plan.job_name}
    return objects


def render_jobset(plan: Plan) -> dict[str, Any]:
    """The JobSet named after the job, in its namespace, labelled ``trainer.kubeflow.org/trainjob-name``."""
    spec = copy.deepcopy(plan.jobset_spec)
    if plan.suspend:
        spec["suspend"] = True
    spec["replicatedJobs"] = [_replicated_job(plan, pod_set) for pod_set in plan.pod_sets]
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": _metadata(plan, plan.labels, plan.annotations),
        "spec": spec,
    }


def render_podgroup(plan: Plan) -> dict[str, Any] | None:
    """The PodGroup for the plan's gang-scheduling policy, or ``None`` without one."""
    policy = plan.pod_group
    if policy is None:
        return None
    if policy.scheduler not in _POD_GROUP_RENDERERS:
        raise ValueError(
            f"no PodGroup kind for scheduler {policy.scheduler!r}; known: {', '.join(_POD_GROUP_RENDERERS)}"
        )
    api_version, spec = _POD_GROUP_RENDERERS[policy.scheduler](policy)
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": _metadata(plan, {TRAINJOB_NAME_LABEL: plan.job_name}, {}),
        "spec": spec,
    }


def _replicated_job(plan: Plan, pod_set: PodSet) -> dict[str, Any]:
    template = copy.deepcopy(pod_set.template)
    job_meta = template.setdefault("metadata", {})
    job_meta["labels"] = {**(job_meta.get("labels") or {}), **plan.labels}
    if plan.annotations:
        job_meta["annotations"] = {**(job_meta.get("annotations") or {}), **plan.annotations}
    job_spec = template.setdefault("spec", {})
    pods_per_job = max(1, pod_set.count // max(1, pod_set.replicas))
    job_spec["completionMode"] = "Indexed"
    job_spec["parallelism"] = pods_per_job
    job_spec["completions"] = pods_per_job
    if plan.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = plan.active_deadline_seconds
    pod_template = job_spec.get("template") or {}
    pod_spec = dict(pod_template.get("spec") or {})
    originals = {c.get("name"): c for c in pod_spec.get("containers") or []}
    pod_spec["containers"] = [container_to_dict(c, originals.get(c.name)) for c in pod_set.containers]
    pod_spec.setdefault("restartPolicy", DEFAULT_RESTART_POLICY)
    job_spec["template"] = {
        "metadata": pod_template.get("metadata") or {},
        "spec": _containers_first(pod_spec),
    }
    replicated: dict[str, Any] = {"name": pod_set.name}
    if pod_set.group_name:
        replicated["groupName"] = pod_set.group_name
    if pod_set.depends_on:
        replicated["dependsOn"] = copy.deepcopy(pod_set.depends_on)
    return {**replicated, "replicas": pod_set.replicas, "template": template}


def _containers_first(pod_spec: dict[str, Any]) -> dict[str, Any]:
    keys = ["initContainers", "containers"]
    return {k: pod_spec[k] for k in keys if k in pod_spec} | {
        k: v for k, v in pod_spec.items() if k not in keys
    }


def _metadata(plan: Plan, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": plan.job_name, "namespace": plan.namespace}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _coscheduling_spec(policy: PodGroupPolicy) -> tuple[str, dict[str, Any]]:
    spec: dict[str, Any] = {"minMember": policy.min_member}
    if policy.min_resources:
        spec["minResources"] = dict(policy.min_resources)
    if policy.schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = policy.schedule_timeout_seconds
    return COSCHEDULING_API_VERSION, spec


def _volcano_spec(policy: PodGroupPolicy) -> tuple[str, dict[str, Any]]:
    spec: dict[str, Any] = {"minMember": policy.min_member}
    if policy.min_resources:
        spec["minResources"] = dict(policy.min_resources)
    if policy.queue:
        spec["queue"] = policy.queue
    spec.update(copy.deepcopy(policy.extra))
    return VOLCANO_API_VERSION, spec


_POD_GROUP_RENDERERS = {"coscheduling": _coscheduling_spec, "volcano": _volcano_spec}
