"""The volcano plugin: gang scheduling with Volcano.

Every pod gets the annotation ``scheduling.k8s.io/group-name: {job}`` and, when its template names no scheduler,
``schedulerName: volcano``. The plan asks for a ``scheduling.volcano.sh/v1beta1`` PodGroup named after the job with
``minMember`` = all pods, ``minResources`` = their summed requests, the queue from the TrainJob's
``scheduling.volcano.sh/queue-name`` annotation and the runtime's ``networkTopology``.
"""

from __future__ import annotations

from trainjob.runtime.framework import Context, Plugin
from trainjob.runtime.gang import gang_resources, gang_size, label_pods
from trainjob.runtime.plan import PodGroupPolicy
from trainjob.runtime.template import pod_spec

GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
SCHEDULER_NAME = "volcano"


class VolcanoPlugin(Plugin):
    name = "volcano"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.pod_group_policy
        return policy is not None and policy.volcano is not None

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        source = ctx.runtime.spec.pod_group_policy.volcano  # type: ignore[union-attr]
        queue = (ctx.trainjob.metadata.annotations or {}).get(QUEUE_ANNOTATION) or plan.annotations.get(
            QUEUE_ANNOTATION
        )
        extra = {}
        if source.network_topology is not None:
            extra["networkTopology"] = source.network_topology.to_dict()
        plan.pod_group = PodGroupPolicy(
            scheduler="volcano",
            min_member=gang_size(plan.pod_sets, plan.elastic),
            min_resources=gang_resources(plan.pod_sets, plan.elastic),
            queue=queue,
            extra=extra,
        )
        label_pods(plan.pod_sets, annotations={GROUP_NAME_ANNOTATION: plan.job_name})
        for pod_set in plan.pod_sets:
            pod_spec(pod_set.template).setdefault("schedulerName", SCHEDULER_NAME)
