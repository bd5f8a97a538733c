"""The jobset plugin (build phase): the final pod templates and the JobSet settings the plan is rendered with.

- every pod and the JobSet carry ``trainer.kubeflow.org/trainjob-name: {job}``;
- ``spec.podTemplateOverrides`` are applied in order to the jobs named in ``targetJobs``: labels, annotations,
  ``nodeSelector`` (merged), ``affinity`` / ``serviceAccountName`` (replaced), ``tolerations``, ``volumes``,
  ``schedulingGates``, ``imagePullSecrets`` (appended; a volume replaces one of the same name), container ``env``
  (merged by name) and ``volumeMounts`` (a mount replaces one at the same path);
- the JobSet network gets ``subdomain: {job}`` and ``enableDNSHostnames: true`` so that pod
  ``{job}-node-0-0`` resolves as ``{job}-node-0-0.{job}``.
"""

from __future__ import annotations

from typing import Any

from trainjob.api import PodTemplateOverride
from trainjob.api.errors import quote, shorten
from trainjob.errors import ValidationError
from trainjob.runtime.framework import Context, Plugin
from trainjob.runtime.gang import label_pods
from trainjob.runtime.plan import Plan, PodSet
from trainjob.runtime.template import env_from_api, pod_spec, upsert_env

TRAINJOB_NAME_LABEL = "trainer.kubeflow.org/trainjob-name"


class JobSetPlugin(Plugin):
    name = "jobset"

    def validate(self, ctx: Context) -> list[ValidationError]:
        problems = []
        jobs = {p.name: p for p in ctx.plan.pod_sets}
        for i, override in enumerate(ctx.trainjob.spec.pod_template_overrides or []):
            for j, target in enumerate(override.target_jobs):
                if target.name not in jobs:
                    problems.append(
                        ValidationError(
                            f"spec.podTemplateOverrides[{i}].targetJobs[{j}].name",
                            f"runtime {ctx.runtime.name!r} has no job {quote(target.name)} "
                            f"(jobs: {shorten(', '.join(jobs), 400)})",
                        )
                    )
                    continue
                problems += _unknown_containers(override, i, jobs[target.name])
        return problems

    def build(self, ctx: Context) -> None:
        plan = ctx.plan
        plan.labels[TRAINJOB_NAME_LABEL] = plan.job_name
        label_pods(plan.pod_sets, labels={TRAINJOB_NAME_LABEL: plan.job_name})
        jobs = {p.name: p for p in plan.pod_sets}
        for override in ctx.trainjob.spec.pod_template_overrides or []:
            for target in override.target_jobs:
                apply_pod_template_override(override, jobs[target.name])
        _enable_pod_dns(plan)


def apply_pod_template_override(override: PodTemplateOverride, pod_set: PodSet) -> None:
    """Apply one ``podTemplateOverrides`` entry to ``pod_set`` (see the module docstring for the merge rules)."""
    if override.metadata is not None:
        label_pods([pod_set], labels=override.metadata.labels, annotations=override.metadata.annotations)
    spec_override = override.spec
    if spec_override is None:
        return
    spec = pod_spec(pod_set.template)
    if spec_override.service_account_name is not None:
        spec["serviceAccountName"] = spec_override.service_account_name
    if spec_override.node_selector:
        spec.setdefault("nodeSelector", {}).update(spec_override.node_selector)
    if spec_override.affinity is not None:
        spec["affinity"] = spec_override.affinity
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
    for init_override in spec_override.init_containers or []:
        init = next(c for c in spec.get("initContainers") or [] if c.get("name") == init_override.name)
        env = [var.to_dict() for var in init_override.env or []]
        for key, items, identity in (
            ("env", env, "name"),
            ("volumeMounts", init_override.volume_mounts, "mountPath"),
        ):
            if items:
                init[key] = _merge_list(init.get(key) or [], items, identity)


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


def _unknown_containers(override: PodTemplateOverride, index: int, pod_set: PodSet) -> list[ValidationError]:
    if override.spec is None:
        return []
    problems = []
    names = [c.name for c in pod_set.containers]
    init_names = [c["name"] for c in pod_spec(pod_set.template).get("initContainers") or []]
    for field, overrides, known in (
        ("containers", override.spec.containers, names),
        ("initContainers", override.spec.init_containers, init_names),
    ):
        known_set = set(known)
        for j, container in enumerate(overrides or []):
            if container.name not in known_set:
                problems.append(
                    ValidationError(
                        f"spec.podTemplateOverrides[{index}].spec.{field}[{j}].name",
                        f"job {pod_set.name!r} has no {field[:-1]} {quote(container.name)} "
                        f"({field}: {shorten(', '.join(known), 400) or 'none'})",
                    )
                )
    return problems
