"""The coscheduling plugin: gang scheduling with the Kubernetes scheduler-plugins ``Coscheduling`` plugin.

Every pod gets the label ``scheduling.x-k8s.io/pod-group: {job}``; the plan asks for a
``scheduling.x-k8s.io/v1alpha1`` PodGroup named after the job with ``minMember`` = all pods, ``minResources`` =
their summed requests and ``scheduleTimeoutSeconds`` from the runtime (default 60), which this plugin renders.
"""

from __future__ import annotations

from typing import Any

from trainjob.constants import COSCHEDULING_API_VERSION, POD_GROUP_LABEL
from trainjob.runtime.gang import GangPlugin, label_pods
from trainjob.runtime.plan import PodGroupPolicy
from trainjob.runtime.plugin import Context

DEFAULT_SCHEDULE_TIMEOUT_SECONDS = 60


class CoschedulingPlugin(GangPlugin):
    """Phases: pod group policy (the requirement and the pod label), render (the PodGroup)."""

    name = "coscheduling"
    api_version = COSCHEDULING_API_VERSION

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        source = ctx.runtime.spec.pod_group_policy.coscheduling  # type: ignore[union-attr]
        timeout = source.schedule_timeout_seconds or DEFAULT_SCHEDULE_TIMEOUT_SECONDS
        plan.pod_group = self.gang_policy(plan, schedule_timeout_seconds=timeout)
        label_pods(plan.pod_sets, labels={POD_GROUP_LABEL: plan.job_name})

    def pod_group_spec(self, policy: PodGroupPolicy) -> dict[str, Any]:
        if policy.schedule_timeout_seconds is None:
            return {}
        return {"scheduleTimeoutSeconds": policy.schedule_timeout_seconds}
