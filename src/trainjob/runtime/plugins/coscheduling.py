"""The coscheduling plugin: gang scheduling with the Kubernetes scheduler-plugins ``Coscheduling`` plugin.

Every pod gets the label ``scheduling.x-k8s.io/pod-group: {job}``; the plan asks for a
``scheduling.x-k8s.io/v1alpha1`` PodGroup named after the job with ``minMember`` = all pods, ``minResources`` =
their summed requests and ``scheduleTimeoutSeconds`` from the runtime (default 60), which this plugin renders.
"""

from __future__ import annotations

from typing import Any

from trainjob.constants import COSCHEDULING_API_VERSION, POD_GROUP_LABEL
from trainjob.runtime.gang import gang_resources, gang_size, label_pods, pod_group_object
from trainjob.runtime.plan import Plan, PodGroupPolicy
from trainjob.runtime.plugin import Context, Plugin, PodGroupEnforcer, Renderer

DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60


class CoschedulingPlugin(Plugin, PodGroupEnforcer, Renderer):
    """Phases: pod group policy (the requirement and the pod label), render (the PodGroup)."""

    name = "coscheduling"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.pod_group_policy
        return policy is not None and policy.coscheduling is not None

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        source = ctx.runtime.spec.pod_group_policy.coscheduling  # type: ignore[union-attr]
        plan.pod_group = PodGroupPolicy(
            scheduler=self.name,
            min_member=gang_size(plan.pod_sets, plan.elastic),
            min_resources=gang_resources(plan.pod_sets, plan.elastic),
            schedule_timeout_seconds=source.schedule_timeout_seconds or DEFAULT_SCHEDULE_TIMEOUT_SECONDS,
        )
        label_pods(plan.pod_sets, labels={POD_GROUP_LABEL: plan.job_name})

    def render(self, plan: Plan) -> list[dict[str, Any]]:
        policy = plan.pod_group
        if policy is None or policy.scheduler != self.name:
            return []
        spec: dict[str, Any] = {"minMember": policy.min_member}
        if policy.min_resources:
            spec["minResources"] = dict(policy.min_resources)
        if policy.schedule_timeout_seconds is not None:
            spec["scheduleTimeoutSeconds"] = policy.schedule_timeout_seconds
        return [pod_group_object(plan, COSCHEDULING_API_VERSION, spec)]
