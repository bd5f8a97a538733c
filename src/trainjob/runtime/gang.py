"""What a gang (all pods start together or none does) needs: how many pods and how many resources; and the
PodGroup object the gang plugins (``coscheduling``, ``volcano``) render around their spec.

>>> from trainjob.runtime.plan import Container, PodSet, Resources
>>> node = PodSet("node", 2, [Container("node", resources=Resources(requests={"cpu": "2500m"}))])
>>> gang_size([node]), gang_resources([node])
(2, {'cpu': '5'})
"""

from __future__ import annotations

from typing import Any

from trainjob.api.quantity import sum_quantities
from trainjob.constants import TRAINER_STEP, TRAINJOB_NAME_LABEL
from trainjob.runtime.plan import ElasticPolicy, Plan, PodGroupPolicy, PodSet
from trainjob.runtime.plugin import Context, Plugin, PodGroupEnforcer, Renderer
from trainjob.runtime.template import object_metadata, pod_metadata


def members(pod_set: PodSet, elastic: ElasticPolicy | None = None) -> int:
    """Pods of ``pod_set`` the gang waits for: all of them; an elastic trainer only needs ``minNodes``."""
    if elastic is not None and pod_set.ancestor_step == TRAINER_STEP:
        return min(pod_set.count, elastic.min_nodes)
    return pod_set.count


def gang_size(pod_sets: list[PodSet], elastic: ElasticPolicy | None = None) -> int:
    """``minMember`` of the PodGroup: every pod of every pod set (elastic trainers: ``minNodes``)."""
    return sum(members(p, elastic) for p in pod_sets)


def gang_resources(pod_sets: list[PodSet], elastic: ElasticPolicy | None = None) -> dict[str, str]:
    """``minResources`` of the PodGroup: the summed requests (limits where no request) of the gang's pods."""
    parts = [
        (container.resources.effective(), members(pod_set, elastic))
        for pod_set in pod_sets
        for container in pod_set.containers
    ]
    return sum_quantities(parts)


def label_pods(
    pod_sets: list[PodSet], *, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> None:
    """Add ``labels`` / ``annotations`` to the pod template of every pod set."""
    for pod_set in pod_sets:
        meta = pod_metadata(pod_set.template)
        if labels:
            meta.setdefault("labels", {}).update(labels)
        if annotations:
            meta.setdefault("annotations", {}).update(annotations)


def pod_group_object(plan: Plan, api_version: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A PodGroup of ``api_version`` named after the job, labelled ``trainer.kubeflow.org/trainjob-name``."""
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": object_metadata(plan, {TRAINJOB_NAME_LABEL: plan.job_name}, {}),
        "spec": spec,
    }


class GangPlugin(Plugin, PodGroupEnforcer, Renderer):
    """What the gang-scheduling plugins share: enabled by ``podGroupPolicy.<name>``, a PodGroup requirement of every
    pod (``minNodes`` of an elastic trainer) and their summed requests, rendered as the scheduler's PodGroup.
    Subclasses name the scheduler (``name``, ``api_version``) and add their own settings."""

    api_version = ""

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.pod_group_policy
        return policy is not None and getattr(policy, self.name) is not None

    def gang_policy(self, plan: Plan, **settings: Any) -> PodGroupPolicy:
        """The plan's PodGroup requirement: every pod, their requests, and the scheduler's own ``settings``."""
        return PodGroupPolicy(scheduler=self.name, min_member=gang_size(plan.pod_sets, plan.elastic),
                              min_resources=gang_resources(plan.pod_sets, plan.elastic), **settings)

    def render(self, plan: Plan) -> list[dict[str, Any]]:
        policy = plan.pod_group
        if policy is None or policy.scheduler != self.name:
            return []
        spec: dict[str, Any] = {"minMember": policy.min_member}
        if policy.min_resources:
            spec["minResources"] = dict(policy.min_resources)
        spec.update(self.pod_group_spec(policy))
        return [pod_group_object(plan, self.api_version, spec)]

    def pod_group_spec(self, policy: PodGroupPolicy) -> dict[str, Any]:
        """The scheduler's own PodGroup fields, after ``minMember`` and ``minResources``."""
        return {}
