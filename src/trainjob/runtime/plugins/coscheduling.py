"""The coscheduling plugin: gang scheduling with the Kubernetes scheduler-plugins ``Coscheduling`` plugin.

Every pod gets the label ``scheduling.x-k8s.io/pod-group: {job}``; the plan asks for a
``scheduling.x-k8s.io/v1alpha1`` PodGroup named after the job with ``minMember`` = all pods, ``minResources`` =
their summed requests and ``scheduleTimeoutSeconds`` from the runtime (default 60).
"""

from __future__ import annotations

from trainjob.runtime.framework import Context, Plugin
from trainjob.runtime.gang import gang_resources, gang_size, label_pods
from trainjob.runtime.plan import PodGroupPolicy

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60


class CoschedulingPlugin(Plugin):
    name = "coscheduling"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.pod_group_policy
        return policy is not None and policy.coscheduling is not None

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        source = ctx.runtime.spec.pod_group_policy.coscheduling  # type: ignore[union-attr]
        plan.pod_group = PodGroupPolicy(
            scheduler="coscheduling",
            min_member=gang_size(plan.pod_sets, plan.elastic),
            min_resources=gang_resources(plan.pod_sets, plan.elastic),
            schedule_timeout_seconds=source.schedule_timeout_seconds or DEFAULT_SCHEDULE_TIMEOUT_SECONDS,
        )
        label_pods(plan.pod_sets, labels={POD_GROUP_LABEL: plan.job_name})
