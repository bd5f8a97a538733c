"""The Events the operator posts about a running TrainJob: its JobSet created, its node group restarting, its
elastic node group resized. Each is posted once: what was reported is kept on the job (an annotation) or in the
Event's name, so a restarted operator or the replica that takes over posts nothing twice::

    events = JobEvents(api, CachedReads(api, cache))
    events.announce(job, jobset)              # JobSetCreated, named after the JobSet's uid
    events.report_restarts(job, jobset)       # Restarting: "attempt 2 of 4: node-1 rank 1: ValueError: ..."
    texts = events.report_resizes(job, pods)  # Resized: "Resized 3 -> 2 nodes ..."; the log tails it read
"""

from __future__ import annotations

import logging
from typing import Any

from trainjob.backends.kubernetes import progress
from trainjob.backends.kubernetes.cache import CachedReads
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.resources import JOBSET_NAME_LABEL, TRAINJOBS
from trainjob.backends.kubernetes.rootcause import root_cause
from trainjob.constants import RESTARTS_REPORTED_ANNOTATION
from trainjob.errors import NotFoundError, TrainJobError

log = logging.getLogger("trainjob.operator")

#: How many restarts of the JobSet (``status.restarts``) the operator has reported as ``Restarting`` events.
RESTARTS_ANNOTATION = RESTARTS_REPORTED_ANNOTATION


class JobEvents:
    """Posts a TrainJob's Events through ``api``; remembers which JobSet (uid) it announced, by job."""

    def __init__(self, api: KubeApi, reads: CachedReads) -> None:
        self.api = api
        self.reads = reads
        self._announced: dict[tuple[str, str], str] = {}

    def announce(self, job: dict[str, Any], jobset: dict[str, Any]) -> None:
        """The ``JobSetCreated`` event, named after the JobSet's uid: posting it again after a crash (or from the
        replica that took over) finds it there, so a job never has two, and never none."""
        name, uid = job["metadata"]["name"], jobset["metadata"].get("uid")
        self.api.post_event(job, "Normal", "JobSetCreated", f"created JobSet {name}",
                            name=f"{name}.{uid}" if uid else None)
        if uid:
            self._announced[(job["metadata"]["namespace"], name)] = uid

    def announce_if_missed(self, job: dict[str, Any], status: dict[str, Any], jobset: dict[str, Any]) -> None:
        """:meth:`announce` a JobSet that a pass (this replica's or another's) made but ended before announcing:
        the job has no status yet and this process announced no JobSet of that uid."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        if not status and self._announced.get(key) != jobset["metadata"].get("uid"):
            self.announce(job, jobset)

    def forget(self, namespace: str, name: str) -> None:
        """Drop what this process remembered of a job that finished or went."""
        self._announced.pop((namespace, name), None)

    def report_restarts(self, job: dict[str, Any], jobset: dict[str, Any]) -> None:
        """A ``Restarting`` Warning for each restart of the node group JobSet made (``status.restarts``) since the
        last one reported, naming the attempt and, while the failed pods are still there, why; the count reported
        is kept in the job's :data:`RESTARTS_ANNOTATION`, so no condition appears while the job runs."""
        restarts = int((jobset.get("status") or {}).get("restarts") or 0)
        meta = job["metadata"]
        reported = (meta.get("annotations") or {}).get(RESTARTS_ANNOTATION, "0")
        if restarts <= (int(reported) if reported.isdigit() else 0):
            return
        namespace, name = meta["namespace"], meta["name"]
        try:
            pods = self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}")
            cause = root_cause(pods, lambda pod, container: self.api.read_log(namespace, pod, container))
        except TrainJobError as exc:  # the event is best effort: the restart happens either way
            log.warning("cannot read the pods of restarting TrainJob %s/%s: %s", namespace, name, exc)
            cause = None
        limit = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts")
        of = f" of {int(limit) + 1}" if limit is not None else ""
        why = cause or "a Job of the node group failed"
        self.api.post_event(job, "Warning", "Restarting", f"attempt {restarts + 1}{of}: {why}")
        self._annotate(job, RESTARTS_ANNOTATION, str(restarts))

    def report_resizes(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, str]:
        """Post a ``Resized`` event for every resize the running trainer pods logged since the last one reported
        (:func:`.progress.new_resizes`; a shrink is a Warning); the log tails read, by pod name."""
        texts: dict[str, str] = {}
        for pod in pods:
            if ((pod.get("status") or {}).get("phase")) != "Running":
                continue
            try:
                texts[pod["metadata"]["name"]] = progress.read_log_tail(self.api, job["metadata"]["namespace"], pod)
            except NotFoundError:
                continue
        resizes = progress.new_resizes(job, progress.resizes_from_logs(texts.values()))
        for _, message in resizes:
            self.api.post_event(job, "Normal" if _grew(message) else "Warning", "Resized", message)
        if resizes:
            self._annotate(job, progress.RESIZE_ANNOTATION, resizes[-1][0])
        return texts

    def _annotate(self, job: dict[str, Any], key: str, value: str) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        self.reads.stored(TRAINJOBS, self.api.patch(TRAINJOBS, namespace, name, {"metadata": {"annotations": {key: value}}}))


def _grew(message: str) -> bool | None:
    """Whether ``Resized A -> B nodes ...`` grew the job (``None`` when the numbers cannot be read)."""
    words = message.split()
    try:
        return int(words[3]) > int(words[1])
    except (IndexError, ValueError):
        return None
