"""The jobset plugin (build phase): the final pod templates and the JobSet settings the plan is rendered with.

- every pod and the JobSet carry ``trainer.kubeflow.org/trainjob-name: {job}``;
- ``spec.podTemplateOverrides`` (v2.1) and then ``spec.runtimePatches`` (v2.2+, :mod:`trainjob.runtime.patches`)
  are applied in order to the jobs they name: labels, annotations, ``nodeSelector`` (merged), ``affinity`` /
  ``serviceAccountName`` / ``securityContext`` / ``terminationGracePeriodSeconds`` (replaced), ``tolerations``,
  ``volumes``, ``schedulingGates``, ``imagePullSecrets`` (appended; a volume replaces one of the same name),
  container ``env`` (merged by name), ``volumeMounts`` (a mount replaces one at the same path) and
  ``securityContext``; a runtime patch's JobSet and Job metadata go to the JobSet and to the named Jobs;
- the JobSet network gets ``subdomain: {job}`` and ``enableDNSHostnames: true`` so that pod
  ``{job}-node-0-0`` resolves as ``{job}-node-0-0.{job}``.

Rendering (:func:`render_jobset`): the ``jobset.x-k8s.io/v1alpha2`` JobSet named after the job. Each pod set becomes
one replicated job of Indexed Jobs (``completions = parallelism`` = pods per job), so the completion index is the
node rank and, with the JobSet network's subdomain, pod ``{job}-node-0-0`` answers at ``{job}-node-0-0.{job}``.
The runtime's template fields the plan does not model are kept.
"""

from __future__ import annotations

import copy
from typing import Any

from trainjob.api.errors import quote, shorten
from trainjob.constants import JOBSET_API_VERSION, TRAINJOB_NAME_LABEL
from trainjob.errors import ValidationError
from trainjob.runtime.gang import label_pods
from trainjob.runtime.patches import PodPatch, metadata_changes, patched_jobs, pod_patches
from trainjob.runtime.plan import Plan, PodSet
from trainjob.runtime.plugin import Builder, Context, Plugin, Renderer, Validator
from trainjob.runtime.template import container_to_dict, env_from_api, object_metadata, pod_spec, upsert_env

#: Jobs need a pod restart policy other than ``Always``; failures are handled by the JobSet, not in place.
DEFAULT_RESTART_POLICY = "Never"


class JobSetPlugin(Plugin, Validator, Builder, Renderer):
    """Phases: validate (the jobs that patches name), build (labels, patches, pod DNS), render (the JobSet)."""

    name = "jobset"

    def validate(self, ctx: Context) -> list[ValidationError]:
        problems = []
        jobs = {p.name: p for p in ctx.plan.pod_sets}
        for patch in pod_patches(ctx.trainjob):
            for target, name_path in patch.targets:
                if target not in jobs:
                    problems.append(_no_such_job(ctx, jobs, target, name_path))
                    continue
                problems += _unknown_containers(patch, jobs[target])
        checked = {path for patch in pod_patches(ctx.trainjob) for _, path in patch.targets}
        for name, path in patched_jobs(ctx.trainjob):
            if name not in jobs and path not in checked:
                problems.append(_no_such_job(ctx, jobs, name, path))
        return problems

    def build(self, ctx: Context) -> None:
        plan = ctx.plan
        jobs = {p.name: p for p in plan.pod_sets}
        for change in metadata_changes(ctx.trainjob):
            if change.job is None:
                plan.labels.update(change.labels or {})
                plan.annotations.update(change.annotations or {})
            else:
                job_meta = jobs[change.job].template.setdefault("metadata", {})
                for key, values in (("labels", change.labels), ("annotations", change.annotations)):
                    if values:
                        job_meta.setdefault(key, {}).update(values)
        plan.labels[TRAINJOB_NAME_LABEL] = plan.job_name
        label_pods(plan.pod_sets, labels={TRAINJOB_NAME_LABEL: plan.job_name})
        for patch in pod_patches(ctx.trainjob):
            for target, _ in patch.targets:
                apply_pod_patch(patch, jobs[target])
        _enable_pod_dns(plan)

    def render(self, plan: Plan) -> list[dict[str, Any]]:
        return [render_jobset(plan)]


def render_jobset(plan: Plan) -> dict[str, Any]:
    """The JobSet named after the job, in its namespace, labelled ``trainer.kubeflow.org/trainjob-name``."""
    spec = copy.deepcopy(plan.jobset_spec)
    if plan.suspend:
        spec["suspend"] = True
    spec["replicatedJobs"] = [_replicated_job(plan, pod_set) for pod_set in plan.pod_sets]
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": object_metadata(plan, plan.labels, plan.annotations),
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
    pod = dict(pod_template.get("spec") or {})
    originals = {c.get("name"): c for c in pod.get("containers") or []}
    pod["containers"] = [container_to_dict(c, originals.get(c.name)) for c in pod_set.containers]
    pod.setdefault("restartPolicy", DEFAULT_RESTART_POLICY)
    job_spec["template"] = {
        "metadata": pod_template.get("metadata") or {},
        "spec": _containers_first(pod),
    }
    replicated: dict[str, Any] = {"name": pod_set.name}
    if pod_set.group_name:
        replicated["groupName"] = pod_set.group_name
    if pod_set.depends_on:
        replicated["dependsOn"] = copy.deepcopy(pod_set.depends_on)
    return {**replicated, "replicas": pod_set.replicas, "template": template}


def _containers_first(pod: dict[str, Any]) -> dict[str, Any]:
    keys = ["initContainers", "containers"]
    return {k: pod[k] for k in keys if k in pod} | {k: v for k, v in pod.items() if k not in keys}


def apply_pod_patch(patch: PodPatch, pod_set: PodSet) -> None:
    """Apply one pod-level change to ``pod_set`` (see the module docstring for the merge rules)."""
    label_pods([pod_set], labels=patch.labels, annotations=patch.annotations)
    spec_override = patch.spec
    if spec_override is None:
        return
    spec = pod_spec(pod_set.template)
    for field, key in (("service_account_name", "serviceAccountName"), ("affinity", "affinity"),
                       ("security_context", "securityContext"),
                       ("termination_grace_period_seconds", "terminationGracePeriodSeconds")):
        value = getattr(spec_override, field, None)
        if value is not None:
            spec[key] = value
    if spec_override.node_selector:
        spec.setdefault("nodeSelector", {}).update(spec_override.node_selector)
    for key, items, identity in (
        ("tolerations", spec_override.tolerations, None),
        ("volumes", spec_override.volumes, "name"),
        ("schedulingGates", [g.to_dict() for g in spec_override.scheduling_gates or []], "name"),
        ("imagePullSecrets", [s.to_dict() for s in spec_override.image_pull_secrets or []], "name"),
    ):
        if items:
            spec[key] = _merge_list(spec.get(key) or [], items, identity)
    for container_override in spec_override.containers or []:
        container = pod_set.container(container_override.name)
        upsert_env(container, [env_from_api(var) for var in container_override.env or []])
        container.volume_mounts = _merge_list(
            container.volume_mounts, container_override.volume_mounts, "mountPath"
        )
        security = getattr(container_override, "security_context", None)
        if security is not None:  # kept on the template's container, which rendering starts from
            for original in spec.setdefault("containers", []):
                if original.get("name") == container_override.name:
                    original["securityContext"] = security
    for init_override in spec_override.init_containers or []:
        init = next(c for c in spec.get("initContainers") or [] if c.get("name") == init_override.name)
        env = [var.to_dict() for var in init_override.env or []]
        for key, items, identity in (
            ("env", env, "name"),
            ("volumeMounts", init_override.volume_mounts, "mountPath"),
        ):
            if items:
                init[key] = _merge_list(init.get(key) or [], items, identity)
        security = getattr(init_override, "security_context", None)
        if security is not None:
            init["securityContext"] = security


def _no_such_job(ctx: Context, jobs: dict[str, PodSet], name: str, path: str) -> ValidationError:
    return ValidationError(
        path, f"runtime {ctx.runtime.name!r} has no job {quote(name)} (jobs: {shorten(', '.join(jobs), 400)})"
    )


def _enable_pod_dns(plan: Plan) -> None:
    network = plan.jobset_spec.setdefault("network", {})
    network.setdefault("subdomain", plan.job_name)
    network["enableDNSHostnames"] = True
    network.setdefault("publishNotReadyAddresses", True)


def _merge_list(
    current: list[dict[str, Any]], additions: list[dict[str, Any]] | None, identity: str | None
) -> list[dict[str, Any]]:
    """``current`` plus ``additions``; with ``identity``, an addition replaces the first item with the same key
    (linear: a position index per key, so long lists stay fast)."""
    out = list(current)
    if not identity:
        return out + list(additions or [])
    positions: dict[Any, int] = {}
    for i, old in enumerate(out):
        positions.setdefault(_key(old.get(identity)), i)
    for item in additions or []:
        key = _key(item.get(identity))
        if key in positions:
            out[positions[key]] = item
        else:
            positions[key] = len(out)
            out.append(item)
    return out


def _key(value: Any) -> Any:
    """A hashable stand-in for an identity value (a name or path is a string; anything else compares by repr)."""
    return value if isinstance(value, str | int | None) else repr(value)


def _unknown_containers(patch: PodPatch, pod_set: PodSet) -> list[ValidationError]:
    if patch.spec is None:
        return []
    problems = []
    names = [c.name for c in pod_set.containers]
    init_names = [c["name"] for c in pod_spec(pod_set.template).get("initContainers") or []]
    for field, overrides, known in (
        ("containers", patch.spec.containers, names),
        ("initContainers", patch.spec.init_containers, init_names),
    ):
        known_set = set(known)
        for j, container in enumerate(overrides or []):
            if container.name not in known_set:
                problems.append(
                    ValidationError(
                        f"{patch.path}.spec.{field}[{j}].name",
                        f"job {pod_set.name!r} has no {field[:-1]} {quote(container.name)} "
                        f"({field}: {shorten(', '.join(known), 400) or 'none'})",
                    )
                )
    return problems
