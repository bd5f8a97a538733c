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
from trainjob.runtime.gang import GangPlugin, label_pods
from trainjob.runtime.plan import PodGroupPolicy
from trainjob.runtime.plugin import Context
from trainjob.runtime.template import pod_spec

SCHEDULER_NAME = "volcano"


class VolcanoPlugin(GangPlugin):
    """Phases: pod group policy (the requirement, annotation and scheduler name), render (the PodGroup)."""

    name = "volcano"
    api_version = VOLCANO_API_VERSION

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        source = ctx.runtime.spec.pod_group_policy.volcano  # type: ignore[union-attr]
        queue = (ctx.trainjob.metadata.annotations or {}).get(VOLCANO_QUEUE_ANNOTATION) or plan.annotations.get(
            VOLCANO_QUEUE_ANNOTATION
        )
        extra = {}
        if source.network_topology is not None:
            extra["networkTopology"] = source.network_topology.to_dict()
        plan.pod_group = self.gang_policy(plan, queue=queue, extra=extra)
        label_pods(plan.pod_sets, annotations={VOLCANO_GROUP_NAME_ANNOTATION: plan.job_name})
        for pod_set in plan.pod_sets:
            pod_spec(pod_set.template).setdefault("schedulerName", SCHEDULER_NAME)

    def pod_group_spec(self, policy: PodGroupPolicy) -> dict[str, Any]:
        return {**({"queue": policy.queue} if policy.queue else {}), **copy.deepcopy(policy.extra)}
