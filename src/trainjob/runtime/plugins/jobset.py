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
"""

from __future__ import annotations

from typing import Any

from trainjob.api.errors import quote, shorten
from trainjob.errors import ValidationError
from trainjob.runtime.framework import Context, Plugin
from trainjob.runtime.gang import label_pods
from trainjob.runtime.patches import PodPatch, metadata_changes, patched_jobs, pod_patches
from trainjob.runtime.plan import Plan, PodSet
from trainjob.runtime.template import env_from_api, pod_spec, upsert_env

TRAINJOB_NAME_LABEL = "trainer.kubeflow.org/trainjob-name"


class JobSetPlugin(Plugin):
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
