"""The volcano plugin: gang scheduling with Volcano.

Every pod gets the annotation ``scheduling.k8s.io/group-name: {job}`` and, when its template names no scheduler,
``schedulerName: volcano``. The plan asks for a ``scheduling.volcano.sh/v1beta1`` PodGroup named after the job with
``minMember`` = all pods, ``minResources`` = their summed requests, the queue from the TrainJob's
``scheduling.volcano.sh/queue-name`` annotation and the runtime's ``networkTopology``, which this plugin renders.
"""

from __future__ import annotations

import copy
from typing import Any

from trainjob.constants import VOLCANO_API_VERSION, VOLCANO_GROUP_NAME_ANNOTATION, VOLCANO_QUEUE_ANNOTATION
from trainjob.runtime.gang import gang_resources, gang_size, label_pods, pod_group_object
from trainjob.runtime.plan import Plan, PodGroupPolicy
from trainjob.runtime.plugin import Context, Plugin, PodGroupEnforcer, Renderer
from trainjob.runtime.template import pod_spec

SCHEDULER_NAME = "volcano"


class VolcanoPlugin(Plugin, PodGroupEnforcer, Renderer):
    """Phases: pod group policy (the requirement, annotation and scheduler name), render (the PodGroup)."""

    name = "volcano"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.pod_group_policy
        return policy is not None and policy.volcano is not None

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        source = ctx.runtime.spec.pod_group_policy.volcano  # type: ignore[union-attr]
        queue = (ctx.trainjob.metadata.annotations or {}).get(VOLCANO_QUEUE_ANNOTATION) or plan.annotations.get(
            VOLCANO_QUEUE_ANNOTATION
        )
        extra = {}
        if source.network_topology is not None:
            extra["networkTopology"] = source.network_topology.to_dict()
        plan.pod_group = PodGroupPolicy(
            scheduler=self.name,
            min_member=gang_size(plan.pod_sets, plan.elastic),
            min_resources=gang_resources(plan.pod_sets, plan.elastic),
            queue=queue,
            extra=extra,
        )
        label_pods(plan.pod_sets, annotations={VOLCANO_GROUP_NAME_ANNOTATION: plan.job_name})
        for pod_set in plan.pod_sets:
            pod_spec(pod_set.template).setdefault("schedulerName", SCHEDULER_NAME)

    def render(self, plan: Plan) -> list[dict[str, Any]]:
        policy = plan.pod_group
        if policy is None or policy.scheduler != self.name:
            return []
        spec: dict[str, Any] = {"minMember": policy.min_member}
        if policy.min_resources:
            spec["minResources"] = dict(policy.min_resources)
        if policy.queue:
            spec["queue"] = policy.queue
        spec.update(copy.deepcopy(policy.extra))
        return [pod_group_object(plan, VOLCANO_API_VERSION, spec)]
