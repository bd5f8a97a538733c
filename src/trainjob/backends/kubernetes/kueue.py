"""Kueue (``kueue.x-k8s.io``) in front of trainjob's operator: the queue labels, the objects a platform team starts
from, and where a waiting job stands.

Kueue admits TrainJobs through its TrainJob integration: a job labelled ``kueue.x-k8s.io/queue-name`` is created
suspended by Kueue's webhook, gets a Workload, and is resumed (with the node selectors and tolerations of the flavor
it was admitted to, in ``podTemplateOverrides``) when its ClusterQueue has quota; a preempted job is suspended again.
The operator only follows ``spec.suspend``; this module is what ``trainjob`` itself says about queues::

    objects = queue_manifests(QueueSetup(namespace="ml-team", local_queue="team", quotas={"cpu": "16"}))
    waiting = queue_state(api, job)   # "Queued (position 2 in LocalQueue team, waiting for cpu)" or None
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainjob.constants import KUEUE_PRIORITY_CLASS_LABEL as PRIORITY_CLASS_LABEL
from trainjob.constants import KUEUE_QUEUE_NAME_LABEL as QUEUE_LABEL
from trainjob.errors import ValidationError

__all__ = ["PRIORITY_CLASS_LABEL", "QUEUE_LABEL", "QueueSetup", "check_name", "parse_node_label", "parse_toleration",
           "queue_manifests", "queue_state", "waiting_for"]
API_VERSION = "kueue.x-k8s.io/v1beta1"
GROUP = "kueue.x-k8s.io"
#: Quota keys ``trainjob install --kueue`` takes, and the resource each one is.
RESOURCES = {"cpu": "cpu", "memory": "memory", "gpu": "nvidia.com/gpu"}
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class QueueSetup:
    """What ``trainjob install --kueue`` makes: one ResourceFlavor, one ClusterQueue with ``quotas`` of it, and a
    LocalQueue in ``namespace`` pointing at the ClusterQueue."""

    namespace: str = "default"
    local_queue: str = "default"
    cluster_queue: str = "cluster-queue"
    flavor: str = "default-flavor"
    #: Resource name (``cpu``, ``memory``, ``nvidia.com/gpu``) -> nominal quota.
    quotas: dict[str, str] = field(default_factory=lambda: {"cpu": "8", "memory": "32Gi"})
    #: Labels of the nodes this flavor stands for: admitted pods get them as their node selector.
    node_labels: dict[str, str] = field(default_factory=dict)
    #: Tolerations admitted pods get (the taints of those nodes).
    tolerations: list[dict[str, str]] = field(default_factory=list)
    #: A job of higher priority preempts (suspends) running jobs of lower priority in the ClusterQueue.
    preempt_lower_priority: bool = False

    def validate(self) -> None:
        for what, value in (("--namespace", self.namespace), ("--queue", self.local_queue),
                            ("--cluster-queue", self.cluster_queue), ("--flavor", self.flavor)):
            check_name(what, value)
        if not self.quotas:
            raise ValidationError("", "no quota: give at least one of --cpu, --memory, --gpu above 0")


def check_name(what: str, value: str) -> str:
    """``value`` when it is a name Kueue takes (a DNS label); else a :class:`ValidationError` naming ``what``."""
    if not _NAME.match(value):
        raise ValidationError(what, "must be a DNS label (lower-case letters, digits and '-', starting and ending "
                              f"with a letter or digit, at most 63 characters), got {value!r}")
    return value


def parse_toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE]:EFFECT`` (kubectl taint's words) -> a toleration of that taint."""
    key_value, sep, effect = text.rpartition(":")
    if not sep or effect not in _EFFECTS or not key_value:
        raise ValidationError("--toleration", f"expected KEY[=VALUE]:EFFECT with EFFECT one of {', '.join(_EFFECTS)} "
                              f"(for example gpu=true:NoSchedule), got {text!r}")
    key, eq, value = key_value.partition("=")
    toleration = {"key": key, "operator": "Equal" if eq else "Exists", "effect": effect}
    if eq:
        toleration["value"] = value
    return toleration


def parse_node_label(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise ValidationError("--node-label", f"expected KEY=VALUE (a label the flavor's nodes carry), got {text!r}")
    return key, value


def queue_manifests(setup: QueueSetup) -> list[dict[str, Any]]:
    """ResourceFlavor, ClusterQueue and LocalQueue, in the order they must be created."""
    setup.validate()
    flavor: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
                              "metadata": {"name": setup.flavor}, "spec": {}}
    if setup.node_labels:
        flavor["spec"]["nodeLabels"] = dict(setup.node_labels)
    if setup.tolerations:
        flavor["spec"]["tolerations"] = list(setup.tolerations)
    resources = list(setup.quotas)
    cluster_queue: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": setup.cluster_queue},
        "spec": {
            "namespaceSelector": {},  # every namespace may point a LocalQueue here
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{
                "coveredResources": resources,
                "flavors": [{"name": setup.flavor, "resources": [
                    {"name": name, "nominalQuota": quota} for name, quota in setup.quotas.items()
                ]}],
            }],
        },
    }
    if setup.preempt_lower_priority:
        cluster_queue["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
    local_queue = {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": setup.local_queue, "namespace": setup.namespace},
        "spec": {"clusterQueue": setup.cluster_queue},
    }
    return [flavor, cluster_queue, local_queue]


# -- where a waiting job stands ----------------------------------------------------------------------------------


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def _is_true(obj: dict[str, Any], type_: str) -> bool:
    cond = _condition(obj, type_)
    return cond is not None and cond.get("status") == "True"


def owned_workload(workloads: list[dict[str, Any]], job: dict[str, Any]) -> dict[str, Any] | None:
    """The Workload Kueue made for ``job`` (its owner reference names the job's uid)."""
    uid = job["metadata"].get("uid")
    for workload in workloads:
        for ref in workload["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "TrainJob" and ref.get("uid") == uid:
                return workload
    return None


def _pending(workload: dict[str, Any]) -> bool:
    return not (_is_true(workload, "QuotaReserved") or _is_true(workload, "Admitted")
                or _is_true(workload, "Finished")) and (workload.get("spec") or {}).get("active", True) is not False


def _order(workload: dict[str, Any]) -> tuple[int, str, str]:
    """Kueue's order within a queue: higher priority first, then the older (or longer-evicted) first."""
    evicted = _condition(workload, "Evicted")
    since = (evicted or {}).get("lastTransitionTime") if evicted and evicted.get("status") == "True" else None
    return (-int((workload.get("spec") or {}).get("priority") or 0),
            since or workload["metadata"].get("creationTimestamp") or "", workload["metadata"]["name"])


_INSUFFICIENT = re.compile(r"insufficient (?:unused )?quota for ([\w./-]+)")


def waiting_for(workload: dict[str, Any]) -> str | None:
    """The resources Kueue says the workload waits for (``cpu``, ``cpu, memory``), or its own words when it waits
    for something else (an inactive ClusterQueue, a missing LocalQueue)."""
    cond = _condition(workload, "QuotaReserved")
    message = (cond or {}).get("message") or ""
    resources = list(dict.fromkeys(_INSUFFICIENT.findall(message)))
    if resources:
        return ", ".join(resources)
    return message.rstrip(".") or None


def queue_state(job: dict[str, Any], workloads: list[dict[str, Any]]) -> str | None:
    """``Queued (position N in LocalQueue X, waiting for cpu)`` for a job Kueue has not admitted yet, from the
    Workloads of its namespace; ``None`` when the job is not queued through Kueue, or is admitted."""
    labels = job["metadata"].get("labels") or {}
    queue = labels.get(QUEUE_LABEL)
    if not queue:
        return None
    workload = owned_workload(workloads, job)
    if workload is None:
        return f"Queued (in LocalQueue {queue}, no Workload yet: is Kueue running?)"
    if not _pending(workload):
        return None
    peers = sorted((w for w in workloads if (w.get("spec") or {}).get("queueName") == queue and _pending(w)),
                   key=_order)
    position = next(i for i, w in enumerate(peers, 1) if w["metadata"]["uid"] == workload["metadata"]["uid"])
    reason = waiting_for(workload)
    return f"Queued (position {position} in LocalQueue {queue}" + (f", waiting for {reason})" if reason else ")")
