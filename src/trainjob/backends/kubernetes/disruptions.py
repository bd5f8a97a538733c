"""Pods stopped from outside are disruptions, never failures: suspension and a disrupted node group.

A node group's pods end in two ways that look alike to the Job controller: the training code failed, or something
outside stopped the pod (a suspension, Kueue's preemption, an eviction, a drain, a node taken away). torchrun exits
1 on the SIGTERM a stopped pod gets (its agent re-raises the signal as an exception), the code an uncaught
exception gives; the built-in runtimes' ``podFailurePolicy`` fails the Job at once on exit code 1 and ignores a pod
marked ``DisruptionTarget``. The Job controller applies that policy to every failed pod it still sees, even of a
suspended Job: a pod deleted by the suspension that reached ``Failed`` (exit 1) before it was removed failed the
Job, and the JobSet with it. Kubernetes marks the pods it evicts, preempts or loses ``DisruptionTarget``; nothing
marks the pods a suspension deletes. So the operator does, as Kubernetes' own components do before they delete a
pod:

- **Suspension** (:meth:`Disruptions.before_suspend`): every pod of the job still running gets
  ``DisruptionTarget=True`` (reason ``TrainJobSuspended``) before the JobSet is suspended, and once more after, for a
  pod made meanwhile. The Job controller then ignores their exits, whatever the code.
- **A disrupted pod takes its group down with it** (:meth:`Disruptions.spread`): a static torchrun group cannot
  take one new node back (its peers' collectives fail, exit 1, and that fails their Jobs). When a pod of a running,
  non-elastic trainer is marked ``DisruptionTarget`` by Kubernetes, the other pods that were running with it are
  marked (reason ``PeerDisrupted``) and deleted; each Job replaces its pod, uncounted, and the group starts again
  from its last checkpoint, without spending one of the JobSet's ``maxRestarts``. A ``Disrupted`` event says what
  happened; the job's ``trainjob/disruptions`` annotation counts these restarts (``trainjob describe`` shows them). An elastic group shrinks and grows by itself (torchrun's rendezvous) and is left to do so.

The decisions are pure functions of the pods (:func:`unmarked`, :func:`group_disruption`), table-tested.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.resources import JOBSET_NAME_LABEL, PODS, TRAINJOBS
from trainjob.backends.kubernetes.views import parse_time, trainer_name
from trainjob.constants import DISRUPTIONS_ANNOTATION, REPLICATED_JOB_LABEL
from trainjob.errors import TrainJobError

log = logging.getLogger("trainjob.operator")

DISRUPTION_TARGET = "DisruptionTarget"
#: The reasons this operator gives the condition; Kubernetes' own are ``EvictionByEvictionAPI``,
#: ``PreemptionByScheduler``, ``DeletionByTaintManager``, ``DeletionByPodGC``, ``TerminationByKubelet``.
SUSPENDED_REASON = "TrainJobSuspended"
PEER_REASON = "PeerDisrupted"
OUR_REASONS = (SUSPENDED_REASON, PEER_REASON)
#: Kubernetes' reasons in words, for the event.
_REASON_WORDS = {
    "EvictionByEvictionAPI": "evicted (the Eviction API: a drain, or a disruption budget's controller)",
    "PreemptionByScheduler": "preempted by the scheduler for a pod of higher priority",
    "DeletionByTaintManager": "deleted by a NoExecute taint on its node",
    "DeletionByPodGC": "deleted because its node is gone",
    "TerminationByKubelet": "stopped by its node's kubelet (node pressure or a shutdown)",
}


def is_finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def disruption(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's ``DisruptionTarget`` condition when it is ``True``."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == DISRUPTION_TARGET and condition.get("status") == "True":
            return condition
    return None


def unmarked(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods a suspension must mark: not finished, not marked ``DisruptionTarget`` already."""
    return [pod for pod in pods if not is_finished(pod) and disruption(pod) is None]


@dataclass(frozen=True)
class GroupDisruption:
    """A pod Kubernetes disrupted (``cause``, its condition) and the peers that ran with it, still to stop."""

    cause: dict[str, Any]
    condition: dict[str, Any]
    peers: list[dict[str, Any]]


def group_disruption(pods: list[dict[str, Any]]) -> GroupDisruption | None:
    """The first pod (by the condition's time) that Kubernetes marked ``DisruptionTarget``, with the unmarked pods
    made before that moment: its group, which must restart with it. A peer that already failed (its collectives
    broke when the disrupted pod stopped) is among them: marked before the Job controller counts it, its exit is
    ignored too. The pods made after it are the replacements (``None`` when there is no peer to mark)."""
    disrupted = [(pod, cond) for pod in pods if (cond := disruption(pod)) is not None
                 and cond.get("reason") not in OUR_REASONS]
    if not disrupted:
        return None
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    cause, condition = min(disrupted, key=lambda pair: parse_time(pair[1].get("lastTransitionTime")) or epoch)
    since = parse_time(condition.get("lastTransitionTime"))
    peers = [pod for pod in pods if pod is not cause and since is not None and disruption(pod) is None
             and (pod.get("status") or {}).get("phase") != "Succeeded"
             and (made := parse_time((pod.get("metadata") or {}).get("creationTimestamp"))) is not None
             and made < since]
    return GroupDisruption(cause, condition, peers) if peers else None


def condition(reason: str, message: str, now: float) -> dict[str, Any]:
    when = datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": DISRUPTION_TARGET, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": when}


def reason_in_words(reason: str | None) -> str:
    return _REASON_WORDS.get(reason or "", f"disrupted ({reason or 'no reason given'})")


def disruption_hazards(jobset: dict[str, Any]) -> list[str]:
    """Why a stopped pod of this JobSet could fail the job: a replicated job whose ``podFailurePolicy`` fails the Job
    on an exit code before (or without) a rule that ignores ``DisruptionTarget`` pods. The job keeps the policy (it
    is its runtime's, or its ``runtimePatches``'); the operator says so in a Warning event."""
    hazards = []
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        policy = (((rj.get("template") or {}).get("spec") or {}).get("podFailurePolicy") or {})
        for index, rule in enumerate(policy.get("rules") or []):
            conditions = rule.get("onPodConditions") or []
            if rule.get("action") == "Ignore" and any(c.get("type") == DISRUPTION_TARGET for c in conditions):
                break
            if rule.get("action") == "FailJob" and (rule.get("onExitCodes") or conditions):
                hazards.append(
                    f"replicatedJobs[{rj.get('name')}].podFailurePolicy.rules[{index}] fails the job on "
                    f"{'an exit code' if rule.get('onExitCodes') else 'a pod condition'} before any rule ignores "
                    "DisruptionTarget pods: a suspension, a preemption or an eviction can then fail the job "
                    "(torchrun exits 1 on SIGTERM); put {action: Ignore, onPodConditions: [{type: DisruptionTarget, "
                    "status: \"True\"}]} first, as the built-in torch-distributed runtime does")
                break
    return hazards


class Disruptions:
    """Marks a job's pods before a suspension stops them, and restarts a node group one of whose pods Kubernetes
    disrupted (see the module's docstring)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def _pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        meta = job["metadata"]
        return self.api.list_pods(meta["namespace"], f"{JOBSET_NAME_LABEL}={meta['name']}")

    def before_suspend(self, job: dict[str, Any], now: float) -> int:
        """Mark every unfinished pod of the job ``DisruptionTarget`` (``TrainJobSuspended``); how many were."""
        try:
            pods = unmarked(self._pods(job))
        except TrainJobError as exc:
            log.warning("cannot list the pods of TrainJob %s/%s before suspending it: %s",
                        job["metadata"]["namespace"], job["metadata"]["name"], exc)
            return 0
        mark = condition(SUSPENDED_REASON, "the TrainJob was suspended (spec.suspend: true); its pods stop and are "
                                           "made again when it resumes", now)
        return sum(self._mark(pod, mark) for pod in pods)

    def spread(self, job: dict[str, Any], jobset: dict[str, Any], now: float) -> GroupDisruption | None:
        """When Kubernetes disrupted a pod of the trainer's group, stop the peers that ran with it (marked, then
        deleted) and say so in a ``Disrupted`` event; the disruption found, if any."""
        try:
            trainer = trainer_name(jobset)
            pods = [pod for pod in self._pods(job)
                    if ((pod.get("metadata") or {}).get("labels") or {}).get(REPLICATED_JOB_LABEL) == trainer]
        except TrainJobError as exc:
            log.warning("cannot list the pods of TrainJob %s/%s: %s", job["metadata"]["namespace"],
                        job["metadata"]["name"], exc)
            return None
        found = group_disruption(pods)
        if found is None:
            return None
        cause = found.cause["metadata"]["name"]
        what = reason_in_words(found.condition.get("reason"))
        mark = condition(PEER_REASON, f"pod {cause} of its node group was {what}; the group restarts together", now)
        namespace = job["metadata"]["namespace"]
        # counted first (restarts after a disruption, not against maxRestarts): were the peers stopped and the
        # count then lost, the restart would go unsaid
        count = int((job["metadata"].get("annotations") or {}).get(DISRUPTIONS_ANNOTATION, "0") or 0) + 1
        self.api.patch(TRAINJOBS, namespace, job["metadata"]["name"],
                       {"metadata": {"annotations": {DISRUPTIONS_ANNOTATION: str(count)}}})
        stopped = [pod for pod in found.peers if self._mark(pod, mark)]
        for pod in stopped:
            if not is_finished(pod):
                self.api.delete(PODS, namespace, pod["metadata"]["name"], propagation="Background")
        stopped_names = [pod["metadata"]["name"] for pod in stopped]
        if stopped:
            self.api.post_event(job, "Warning", "Disrupted",
                                f"pod {cause} was {what}; stopping the other {len(stopped)} pod(s) of its node group "
                                f"({', '.join(stopped_names)}) so that it restarts together, from its last checkpoint "
                                "when the script keeps one; a disruption does not count against maxRestarts")
            log.info("TrainJob %s/%s: pod %s disrupted (%s); restarting its node group", namespace,
                     job["metadata"]["name"], cause, found.condition.get("reason"))
        return found

    def _mark(self, pod: dict[str, Any], mark: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        try:
            return self.api.add_pod_condition(meta["namespace"], meta["name"], mark)
        except TrainJobError as exc:
            log.warning("cannot mark pod %s/%s %s: %s", meta["namespace"], meta["name"], DISRUPTION_TARGET, exc)
            return False
