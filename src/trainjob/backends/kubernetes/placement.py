"""Pods the scheduler cannot place are named in the job's status, never failed: capacity may come.

A job asking for more than any node has (seed 000's ``cpu: "2"`` per node on 2-CPU nodes) leaves its pods
``Pending`` with ``PodScheduled=False`` (reason ``Unschedulable``, and the scheduler's words:
``0/2 nodes are available: 2 Insufficient cpu. ...``), while the TrainJob itself said nothing. While the job's
pods are starting (its JobSet has active pods not ready) and it is not suspended, the operator lists its pods that
have no node (the API server filters: :data:`NO_NODE`) every :data:`LOOK_EVERY_SECONDS`. Once one has been
unschedulable for :data:`GRACE_SECONDS` (the TrainJob's ``trainjob/unschedulable-grace-seconds`` annotation changes
it), the job gets the condition ``Unschedulable=True`` (reason
``PodsUnschedulable``) whose message says how many pods, since when, and what the scheduler said of the first;
a ``Warning`` event repeats each new message. ``kubectl get trainjobs`` shows ``Unschedulable`` as its STATE,
``trainjob get``/``describe`` and the SDK show the job ``Created`` with that reason and message. The condition goes
once every pod is placed (or the job is suspended or finished): the Kubeflow SDK reports a job ``Running`` only
while it has no condition.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.pod_start import annotation_seconds, starting
from trainjob.backends.kubernetes.resources import JOBSET_NAME_LABEL
from trainjob.backends.kubernetes.views import parse_time
from trainjob.constants import UNSCHEDULABLE
from trainjob.errors import TrainJobError

log = logging.getLogger("trainjob.operator")

REASON = "PodsUnschedulable"
#: How long a pod may stay unschedulable before the job says so (the scheduler retries as nodes change; a job
#: that merely waits for a pod of another job to finish is not worth a word).
GRACE_SECONDS = 30.0
#: A TrainJob annotation: the grace in seconds for this job (0: say so at the first look).
GRACE_ANNOTATION = "trainjob/unschedulable-grace-seconds"
#: How often a starting job's unplaced pods are looked at.
LOOK_EVERY_SECONDS = 10.0
#: The pods looked at: not bound to a node, not finished.
NO_NODE = "status.phase=Pending,spec.nodeName="


def unschedulable(pods: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The pods the scheduler said it cannot place, with that ``PodScheduled`` condition, longest waiting first."""
    found = []
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                    and condition.get("reason") == "Unschedulable":
                found.append((pod, condition))
    epoch = datetime.datetime.max.replace(tzinfo=datetime.UTC)
    return sorted(found, key=lambda pair: parse_time(pair[1].get("lastTransitionTime")) or epoch)


def placement_message(stuck: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """``2 pod(s) not placed since 2026-12-07T10:00:05Z: 0/2 nodes are available: 2 Insufficient cpu. (pod
    mnist-node-0-0-x); the job waits for capacity, it is not failed``: stable while nothing changes, so the
    condition is written once."""
    pod, condition = stuck[0]
    said = " ".join(str(condition.get("message") or "no reason given").split())
    return (f"{len(stuck)} pod(s) not placed since {condition.get('lastTransitionTime', '?')}: {said} (pod "
            f"{pod['metadata']['name']}); the job waits for capacity, it is not failed")


def grace_seconds(job: dict[str, Any]) -> float:
    """The job's grace: :data:`GRACE_ANNOTATION` when it reads as seconds >= 0, else :data:`GRACE_SECONDS`."""
    return annotation_seconds(job, GRACE_ANNOTATION, GRACE_SECONDS)


def without_condition(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` without the ``Unschedulable`` condition (``status`` itself when it has none)."""
    return status if st.find_condition(status, UNSCHEDULABLE) is None else st.remove_condition(status, UNSCHEDULABLE)


class PlacementWatch:
    """Names a starting job's unschedulable pods in its status (see the module's docstring); remembers, per job,
    when to look next."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._next: dict[tuple[str, str], float] = {}

    def forget(self, namespace: str, name: str) -> None:
        self._next.pop((namespace, name), None)

    def watch(self, job: dict[str, Any], new: dict[str, Any], jobset: dict[str, Any],
              now: float) -> tuple[dict[str, Any], float | None]:
        """``new`` with the ``Unschedulable`` condition set or removed, and the seconds until the next look."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        if not starting(jobset):
            self._next.pop(key, None)
            return without_condition(new), None
        due = self._next.setdefault(key, now + LOOK_EVERY_SECONDS)  # none can have waited the grace yet
        if now < due:
            return new, due - now
        self._next[key] = now + LOOK_EVERY_SECONDS
        try:
            pods = self.api.list_pods(key[0], f"{JOBSET_NAME_LABEL}={key[1]}", field_selector=NO_NODE)
        except TrainJobError as exc:
            log.warning("cannot list the pods of TrainJob %s/%s: %s", *key, exc)
            return new, LOOK_EVERY_SECONDS
        stuck = [(pod, cond) for pod, cond in unschedulable(pods)
                 if (since := parse_time(cond.get("lastTransitionTime"))) is not None
                 and now - since.timestamp() >= grace_seconds(job)]
        if not stuck:
            return without_condition(new), LOOK_EVERY_SECONDS
        message = placement_message(stuck)
        before = st.find_condition(new, UNSCHEDULABLE)
        if before is None or before.get("message") != message:
            self.api.post_event(job, "Warning", REASON, message)
        return st.set_condition(new, UNSCHEDULABLE, True, REASON, message, now), LOOK_EVERY_SECONDS
