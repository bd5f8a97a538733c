"""Pods that cannot start: a job whose image cannot be pulled (a typo in the tag, a private registry without a pull
secret) or whose container cannot be created (a missing Secret or ConfigMap) fails, naming the image, the node and
what the node was told, instead of waiting in ``ImagePullBackOff`` for ever.

The JobSet's status is the cheap signal: a replicated job with more active child Jobs than ready ones has pods not
yet running. Only a job that stays so for :data:`LOOK_AFTER_SECONDS` gets its pods listed (again after 10, 20,
40, then every 60 s while it lasts; every 10 s once one cannot start), and not while each such replicated job has
more pods made or more pods up than at the last check: a thousand pods being made and coming up on a busy cluster
are slow, not stuck, and the look waits until their counts stop growing. The counts are the child Jobs' own
(made: ``status.active`` + ``succeeded`` + ``failed``; up: ``status.ready`` + ``succeeded`` + ``failed``, since a pod
that finished was up: pods that run briefly leave few active or ready at any time while the rest come up), which the
operator's watch of them keeps (:meth:`.cache.ObjectCache.pod_counts`);
the built-in runtimes make one child Job of ``numNodes`` pods, whose JobSet counts one active Job and no ready one
until the last pod is up. Without them (no cache, or the watch has not delivered them yet), the JobSet's counts of
child Jobs stand in. The pods listed are only those on a node and not running
(:data:`ON_A_NODE_NOT_RUNNING`: a pod still waiting for the scheduler has no container to fail). They are listed as
``kubectl get pods`` lists them, as the API server's printed ``Table`` (name, ``STATUS``, node: some 150 bytes a
pod, where the pod itself is some 5 KiB), so a job of a thousand nodes costs a look over a thousand short rows; only
pods whose ``STATUS`` is one of :data:`CANNOT_START` (``Init:`` too) are read whole, :data:`READ_AT_MOST` of them,
for the message. A pod waiting so longer than the grace (:data:`GRACE_SECONDS`, or the TrainJob's
``trainjob/pod-start-grace-seconds`` annotation) fails the job: its JobSet is deleted, ``Failed`` says
``reason: PodCannotStart`` and the message, and a ``Warning`` Event repeats it. An image that is merely slow to pull
waits as ``ContainerCreating``, which is not a failure at any age.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.children import delete_children
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.resources import JOBSET_NAME_LABEL, PODS
from trainjob.backends.kubernetes.status_writer import StatusWriter
from trainjob.errors import TrainJobError

log = logging.getLogger("trainjob.operator")

#: Waiting reasons the kubelet gives a container that will not start without a change to the job or the cluster.
CANNOT_START = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
})
#: How long a pod may wait for one of :data:`CANNOT_START` before its job fails. The kubelet retries a pull with a
#: back-off of 10, 20, 40 s...: 30 s covers a registry that answers again after a blip, and names a wrong tag within
#: a minute of the job's start.
GRACE_SECONDS = 30.0
#: Pods not running this long after the JobSet says so are looked at (and again at this interval).
LOOK_AFTER_SECONDS = 10.0
#: The field selector of the pods looked at: scheduled, and Pending (every reason of :data:`CANNOT_START` keeps a pod
#: Pending, a crash-looping init container included).
ON_A_NODE_NOT_RUNNING = "status.phase=Pending,spec.nodeName!="
#: A TrainJob annotation: the grace in seconds for this job (0: fail at the first sight).
GRACE_ANNOTATION = "trainjob/pod-start-grace-seconds"
REASON = "PodCannotStart"
#: How many of the pods that cannot start are read whole, to name their image and what the kubelet was told.
READ_AT_MOST = 3


#: The longest wait between two looks at pods that are slow to start for no reason of :data:`CANNOT_START` (waiting
#: for a node, pulling a large image): the interval doubles from :data:`LOOK_AFTER_SECONDS` up to this.
LOOK_AT_MOST_EVERY = 60.0


@dataclass
class _Seen:
    next_look: float
    #: Pods (else child Jobs) made and up per replicated job at the last check.
    counts: dict[str, tuple[int, int]]
    interval: float = LOOK_AFTER_SECONDS
    failing_since: float | None = None


def pods_not_starting(pods: Iterable[dict[str, Any]]) -> list[str]:
    """One line per container of ``pods`` waiting for a :data:`CANNOT_START` reason: the pod, its node, the
    container, its image, the reason and what the kubelet was told (the registry's answer, for a pull)."""
    lines = []
    for pod in pods:
        status = pod.get("status") or {}
        images = {c["name"]: c.get("image", "?") for c in [*(pod["spec"].get("initContainers") or []),
                                                            *pod["spec"].get("containers", [])]}
        for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in CANNOT_START:
                node = pod["spec"].get("nodeName") or "no node"
                said = (waiting.get("message") or "").strip()
                lines.append(f"pod {pod['metadata']['name']} on node {node}: container {container['name']} "
                             f"(image {images.get(container['name'], container.get('image', '?'))}): "
                             f"{waiting['reason']}" + (f": {said}" if said else ""))
    return lines


def cannot_start(printed: object) -> bool:
    """Whether a pod's printed ``STATUS`` (``ImagePullBackOff``, ``Init:CrashLoopBackOff``) is one of
    :data:`CANNOT_START`."""
    return isinstance(printed, str) and printed.removeprefix("Init:") in CANNOT_START


@dataclass
class Stuck:
    """What one look found: a line per container that cannot start, of the pods read whole, and how many more
    pods the listing showed so."""

    lines: list[str]
    unread: int = 0
    #: The printed STATUS of the pods that cannot start (``ImagePullBackOff``, ``Init:CrashLoopBackOff``).
    statuses: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.lines) or self.unread > 0

    def message(self) -> str:
        if not self.lines:  # those read had started meanwhile
            return f"{self.unread} of its pods showed {', '.join(sorted(self.statuses))}"
        more = len(self.lines) - 1 + self.unread
        return self.lines[0] + (f" (and {more} more)" if more > 0 else "")


def annotation_seconds(job: dict[str, Any], annotation: str, default: float) -> float:
    """The job's ``annotation`` when it reads as seconds >= 0, else ``default``."""
    value = ((job.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        seconds = float(value) if value is not None else default
    except ValueError:
        return default
    return seconds if seconds >= 0 else default


def grace_seconds(job: dict[str, Any]) -> float:
    """The job's grace: :data:`GRACE_ANNOTATION` when it reads as seconds >= 0, else :data:`GRACE_SECONDS`."""
    return annotation_seconds(job, GRACE_ANNOTATION, GRACE_SECONDS)


def starting(jobset: dict[str, Any]) -> bool:
    """Whether the JobSet has child Jobs with pods not yet ready (active > ready in a replicated job)."""
    return any((entry.get("active") or 0) > (entry.get("ready") or 0)
               for entry in (jobset.get("status") or {}).get("replicatedJobsStatus") or [])


def _counts(jobset: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Child Jobs made and up per replicated job: active + succeeded + failed, and ready + succeeded + failed."""
    counts = {}
    for entry in (jobset.get("status") or {}).get("replicatedJobsStatus") or []:
        done = (entry.get("succeeded") or 0) + (entry.get("failed") or 0)
        counts[str(entry.get("name"))] = ((entry.get("active") or 0) + done, (entry.get("ready") or 0) + done)
    return counts


#: Pods made and up per replicated job of a JobSet (namespace, name), from its child Jobs; empty if unknown.
PodCounts = Callable[[str, str], dict[str, tuple[int, int]]]


def _coming_up(now: dict[str, tuple[int, int]], before: dict[str, tuple[int, int]]) -> bool:
    """Whether every replicated job with pods not yet up has more pods (or child Jobs) made or more up ``now`` than
    ``before`` (its pods are still being made, or coming up). Finished pods count as up: pods that run for seconds
    leave few active or ready at any time while the rest keep coming up."""
    return all(now[name][0] > before.get(name, (0, 0))[0] or now[name][1] > before.get(name, (0, 0))[1]
               for name, (made, up) in now.items() if made > up)


class PodStartWatch:
    """Fails jobs whose pods cannot start (see the module's docstring); remembers, per job, when to look at its
    starting pods next and since when one has been failing to start."""

    def __init__(self, api: KubeApi, writer: StatusWriter, pod_counts: PodCounts | None = None) -> None:
        self.api = api
        self.writer = writer
        self.pod_counts = pod_counts
        self._seen: dict[tuple[str, str], _Seen] = {}

    def _counts(self, key: tuple[str, str], jobset: dict[str, Any]) -> dict[str, tuple[int, int]]:
        """Pods made and up per replicated job, where the child Jobs say; the JobSet's child Jobs else."""
        jobs = _counts(jobset)
        pods = self.pod_counts(*key) if self.pod_counts is not None else {}
        return {name: pods.get(name, counts) for name, counts in jobs.items()}

    def watch(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any], jobset: dict[str, Any],
              now: float) -> float | None:
        """Seconds until this job's pods are to be looked at again (``None``: all started); <= 0 when the job
        was failed (its status written, its JobSet deleted)."""
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        if not starting(jobset):
            self._seen.pop(key, None)
            return None
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen(next_look=now + LOOK_AFTER_SECONDS, counts=self._counts(key, jobset))
        if now < seen.next_look:
            return seen.next_look - now
        counts = self._counts(key, jobset)
        coming_up, seen.counts = _coming_up(counts, seen.counts), counts
        if coming_up and seen.failing_since is None:  # slow, not stuck: check the count again, list nothing
            seen.next_look = now + LOOK_AFTER_SECONDS
            return LOOK_AFTER_SECONDS
        try:
            stuck: Stuck | None = self.look(*key)
        except TrainJobError as exc:
            log.warning("cannot list the pods of TrainJob %s/%s: %s", *key, exc)
            stuck = None
        if not stuck:  # slow, not stuck (or not known): look again later, less often
            if stuck is not None:
                seen.failing_since = None
            seen.next_look = now + seen.interval
            seen.interval = min(seen.interval * 2, LOOK_AT_MOST_EVERY)
            return seen.next_look - now
        if seen.failing_since is None:
            seen.failing_since = now
        left = grace_seconds(job) - (now - seen.failing_since)
        if left > 0:
            seen.next_look = now + min(left, LOOK_AFTER_SECONDS)
            return seen.next_look - now
        self._fail(job, old, new, stuck, now)
        return 0.0

    def look(self, namespace: str, name: str) -> Stuck:
        """The job's pods on a node and not running, as printed rows; those that cannot start read whole (at most
        :data:`READ_AT_MOST`), for their lines."""
        rows = [row for page in self.api.table_in_pages(PODS, namespace, f"{JOBSET_NAME_LABEL}={name}",
                                                        ON_A_NODE_NOT_RUNNING)
                for row in page if cannot_start(row.get("Status"))]
        pods = [pod for pod in (self.api.read_pod(namespace, str(row.get("Name"))) for row in rows[:READ_AT_MOST])
                if pod]
        return Stuck(pods_not_starting(pods), unread=max(len(rows) - READ_AT_MOST, 0),
                     statuses=frozenset(str(row["Status"]) for row in rows))

    def forget(self, namespace: str, name: str) -> None:
        self._seen.pop((namespace, name), None)

    def _fail(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any], stuck: Stuck,
              now: float) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        message = (f"{stuck.message()}; its pods could not start for {grace_seconds(job):g} s, so the job failed and "
                   f"its JobSet was deleted (fix the image or its pull secret, then create the job again)")
        delete_children(self.api, namespace, name)  # first: the pods stop pulling, as for a deadline
        self.writer.write(namespace, name, old, st.failed(new, REASON, message, now))
        self.api.post_event(job, "Warning", REASON, message)
        self.forget(namespace, name)
        log.info("TrainJob %s/%s failed: %s", namespace, name, message)
