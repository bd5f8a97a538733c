"""Reconcile one TrainJob: runtime snapshot -> Plan -> JobSet (+ PodGroup) -> status. Idempotent, restart-safe.

A pass reads the TrainJob, its JobSet and its runtime from the operator's watch cache (:mod:`.cache`) and writes
what differs; it asks the API server for pods and their logs only to explain a failure or a restart, to name a
stalled job's stuck ranks, to look at pods still not running after 10 s (:mod:`.pod_start`), and to read progress
where no status endpoint receives it (or the job is elastic). What this process remembers of a job (its announced
JobSet, its progress clock, when its status was last written, when to look at its starting pods)
only saves requests or times a stall: a restarted operator, or the replica that takes over, does the right thing::

    api = KubeApi(load_api_client(KubernetesBackendConfig()))
    reconciler = Reconciler(api, SnapshotSigner(load_or_create_key(api, "trainjob-system")), cache=cache)
    again_in = reconciler.reconcile("ml-team", "mnist")   # seconds until the next pass is due, or None

:meth:`Reconciler.reconcile` orchestrates; each step is one collaborator's:

1. a job that is gone, being deleted or managed by another controller (``spec.managedBy``) is left alone; a
   finished one is deleted once its ``trainjob/ttl-seconds-after-finished`` passed (:mod:`.ttl`);
2. its children, the JobSet and PodGroup, are made from a signed runtime snapshot and kept suspended or resumed as
   the job says (:mod:`.children`);
3. the status is derived from the JobSet (:mod:`.status`); a new failure gets its root cause (:mod:`.rootcause`);
   restarts of the node group become ``Restarting`` events (:mod:`.job_events`); past ``activeDeadlineSeconds``
   the job fails and its JobSet is deleted; so does a job whose pods cannot start (an image that cannot be
   pulled, a container that cannot be created) past a grace (:mod:`.pod_start`); pods the scheduler cannot place
   are named in an ``Unschedulable`` condition, the job not failed (:mod:`.placement`);
4. a pod of a running group that Kubernetes disrupted (evicted, preempted, its node gone) takes the group's other
   pods down with it, so that it restarts together and uncounted (:mod:`.disruptions`); a suspension marks the pods
   it stops first (:mod:`.children`);
5. a running job is watched for stalls (:mod:`.stall_watch`); its progress, pushed to the status endpoint
   (:mod:`.status_server`), is read from node 0's log when there is none, and an elastic job's pod logs are read
   every :data:`~.progress.RESYNC_SECONDS` for ``Resized`` events (:mod:`.progress`);
6. the status is written as a merge patch, pod-count bursts settled into one write (:mod:`.status_writer`).

A job that cannot run (unknown runtime, invalid spec) gets ``Failed`` with the reason, a message naming the field
and what to change, and a ``Warning`` Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from trainjob.backends.kubernetes import progress
from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.cache import CachedReads, ObjectCache
from trainjob.backends.kubernetes.children import Children, delete_children
from trainjob.backends.kubernetes.job_events import JobEvents
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.placement import PlacementWatch, without_condition
from trainjob.backends.kubernetes.pod_start import PodStartWatch
from trainjob.backends.kubernetes.resources import CONTROLLER_NAME, JOBSET_NAME_LABEL, TRAINJOBS
from trainjob.backends.kubernetes.rootcause import root_cause
from trainjob.backends.kubernetes.snapshot import SnapshotSigner
from trainjob.backends.kubernetes.stall_watch import CollectiveReports, StallWatch
from trainjob.backends.kubernetes.status_server import StatusEndpoint
from trainjob.backends.kubernetes.status_writer import StatusWriter
from trainjob.backends.kubernetes.ttl import ttl_remaining
from trainjob.backends.kubernetes.views import trainer_name, trainer_pods
from trainjob.errors import NotFoundError, TrainJobError

log = logging.getLogger("trainjob.operator")


def is_managed_here(job: dict[str, Any]) -> bool:
    """Whether this operator reconciles ``job``: ``spec.managedBy`` absent or naming this controller."""
    return (job.get("spec") or {}).get("managedBy") in (None, "", CONTROLLER_NAME)


class Reconciler:
    """Converges TrainJobs through a :class:`KubeApi`; ``clock`` is injectable for deadline tests.

    ``cache``: the watches' objects (TrainJobs, JobSets, runtimes), read instead of the API server.
    ``status_endpoint``: where the pods push their progress (:mod:`.status_server`); ``None``: it is read from node
    0's log. ``pending_progress``: a job's pushed report still waiting to be written
    (:meth:`.status_server.StatusServer.pending_report`), as a job's last report may arrive within the endpoint's
    write interval, just before the job finishes. ``collective_reports``: the ranks' collectives reports, which hold
    a job that does not report progress to its collectives (:class:`.stall_watch.CollectiveReports`)."""

    def __init__(self, api: KubeApi, signer: SnapshotSigner, clock: Callable[[], float] = time.time,
                 cache: ObjectCache | None = None, status_endpoint: StatusEndpoint | None = None,
                 pending_progress: Callable[[str, str], dict[str, Any] | None] | None = None,
                 collective_reports: CollectiveReports | None = None) -> None:
        self.api = api
        self.clock = clock
        self.status_endpoint = status_endpoint
        self.pending_progress = pending_progress
        self.reads = CachedReads(api, cache)
        self.writer = StatusWriter(api, self.reads, clock)
        self.events = JobEvents(api, self.reads)
        self.children = Children(api, signer, self.reads, self.writer, self.events, status_endpoint)
        self.stalls = StallWatch(api, self.reads, self.writer, collective_reports)
        self.pod_starts = PodStartWatch(api, self.writer, cache.pod_counts if cache is not None else None)
        self.placement = PlacementWatch(api)
        #: pods being deleted per JobSet, from the watched child Jobs: when to look for a disrupted pod
        self.terminating = cache.terminating if cache is not None else None

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass over TrainJob ``namespace/name``; returns seconds until the next pass is due, if any."""
        job = self.reads.read(TRAINJOBS, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp") or not is_managed_here(job):
            self._forget(namespace, name)
            return None
        status: dict[str, Any] = dict(job.get("status") or {})
        now = self.clock()
        if st.finished_condition(status) is not None:
            self._forget(namespace, name)
            return self._expire(job, now)
        jobset, again_in = self.children.ensure(job, status, now)
        if jobset is None:
            return again_in
        spec = job.get("spec") or {}
        suspend, trainer = bool(spec.get("suspend")), trainer_name(jobset)
        new = self._derive(job, status, jobset, now)
        remaining = st.deadline_remaining(suspend, jobset, spec.get("activeDeadlineSeconds"), now)
        if remaining is not None and remaining <= 0 and st.finished_condition(new) is None:
            self._fail_past_deadline(job, status, new, now)
            return None
        if not suspend and st.finished_condition(new) is None:
            start_in = self.pod_starts.watch(job, status, new, jobset, now)
            if start_in is not None and start_in <= 0:
                return None  # its pods cannot start: failed, and its JobSet deleted
            new, place_in = self.placement.watch(job, new, jobset, now)  # pods not placed: said, not failed
            remaining = _sooner(remaining, _sooner(start_in, place_in))
        else:
            self.pod_starts.forget(namespace, name)
            self.placement.forget(namespace, name)
            new = without_condition(new)
        running = not suspend and _trainer_started(jobset, trainer)
        if running and st.finished_condition(new) is None and self._disrupting(namespace, name, jobset, trainer):
            self.children.disruptions.spread(job, jobset, now)  # the group restarts together, uncounted
        if running and st.finished_condition(new) is None:
            stall_in = self.stalls.watch(job, status, new, jobset, now)
            if stall_in is not None and stall_in <= 0:
                return None  # stalled: failed, and its JobSet deleted
            remaining = _sooner(remaining, stall_in)
        else:  # suspended, finished, or its pods replaced: unarmed until a new report
            self.stalls.unarm(namespace, name)
        polled = self.status_endpoint is None or progress.is_elastic(jobset, trainer)
        if running and polled:
            new = self._observe_trainer(job, new, jobset, trainer)
        new = self._with_last_report(namespace, name, status, new)
        settle = self.writer.settling(namespace, name, status, new, now)
        if settle is not None:  # only pod counts moved, just after a write: one write for the burst, shortly
            return _sooner(remaining, settle)
        self.writer.write(namespace, name, status, new)
        if st.finished_condition(new) is not None:
            self._forget(namespace, name)
            return self._expire({**job, "status": new}, now)
        return remaining if suspend or not polled else _sooner(remaining, progress.RESYNC_SECONDS)

    def _disrupting(self, namespace: str, name: str, jobset: dict[str, Any], trainer: str) -> bool:
        """Whether a pod of a static (non-elastic) trainer group is being deleted: then a disruption may have to
        take its peers down with it (:mod:`.disruptions`). Read from the watched Jobs; never without a cache."""
        return self.terminating is not None and self.terminating(namespace, name) > 0 \
            and not progress.is_elastic(jobset, trainer)

    def _forget(self, namespace: str, name: str) -> None:
        """Drop what this process remembered of a job that finished or went."""
        self.events.forget(namespace, name)
        self.writer.forget(namespace, name)
        self.stalls.forget(namespace, name)
        self.pod_starts.forget(namespace, name)
        self.placement.forget(namespace, name)

    def _derive(self, job: dict[str, Any], status: dict[str, Any], jobset: dict[str, Any],
                now: float) -> dict[str, Any]:
        """The status the JobSet gives the job: a new failure explained by its root cause, a restart of the node
        group reported as an event."""
        new = st.derive_status(status, bool((job.get("spec") or {}).get("suspend")), jobset, now)
        if st.is_true(new, st.FAILED) and not st.is_true(status, st.FAILED):
            return self._with_root_cause(job, new, now)
        if st.finished_condition(new) is None:
            self.events.report_restarts(job, jobset)
        return new

    def _with_root_cause(self, job: dict[str, Any], status: dict[str, Any], now: float) -> dict[str, Any]:
        """Put the failing node, rank and exception in front of the JobSet's generic failure message."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            pods = self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}")
            cause = root_cause(pods, lambda pod, container: self.api.read_log(namespace, pod, container))
        except TrainJobError as exc:
            log.warning("cannot read the pods of failed TrainJob %s/%s: %s", namespace, name, exc)
            return status
        if cause is None:
            return status
        cond = st.find_condition(status, st.FAILED) or {}
        message = f"{cause} ({cond.get('message') or 'the JobSet failed'})"
        return st.set_condition(status, st.FAILED, True, cond.get("reason") or "JobSetFailed", message, now)

    def _fail_past_deadline(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any], now: float) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        message = (
            f"the job ran longer than spec.activeDeadlineSeconds={job['spec']['activeDeadlineSeconds']}s; "
            "its JobSet was deleted (raise the deadline to let it run longer)"
        )
        # Children first: were Failed written first and the delete then refused (a 503), the next pass would find
        # a finished job and leave its JobSet running.
        delete_children(self.api, namespace, name)
        self.writer.write(namespace, name, old, st.failed(new, "DeadlineExceeded", message, now))
        self.api.post_event(job, "Warning", "DeadlineExceeded", message)

    def _observe_trainer(self, job: dict[str, Any], status: dict[str, Any], jobset: dict[str, Any],
                         trainer: str) -> dict[str, Any]:
        """``status`` with ``trainerStatus`` from the last progress line of node 0's log (without a status
        endpoint); an elastic job's resizes (printed by its rank 0, on whichever node) become ``Resized`` events."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            pods = trainer_pods(self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"), trainer)
            read = self.events.report_resizes(job, list(pods.values())) if progress.is_elastic(jobset, trainer) else {}
            pod = pods.get(0)
            if pod is None or not progress.should_read_progress(job, pod):  # job: the status before this pass
                return status
            if self.status_endpoint is not None:  # pushed to the status endpoint, not read from the log
                return status
            text = read.get(pod["metadata"]["name"]) or progress.read_log_tail(self.api, namespace, pod)
        except NotFoundError:
            return status
        except TrainJobError as exc:  # progress is best effort: the job's state does not depend on it
            log.warning("cannot read the progress of TrainJob %s/%s: %s", namespace, name, exc)
            return status
        trainer_status = progress.trainer_status_from_log(text)
        if trainer_status is None or trainer_status == status.get("trainerStatus"):
            return status
        return {**status, "trainerStatus": trainer_status}

    def _with_last_report(self, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """``new`` with the report still waiting at the status endpoint, when ``new`` is the status that finishes
        the job (that report is written with it)."""
        if self.pending_progress is None or st.finished_condition(new) is None or \
                st.finished_condition(old) is not None:
            return new
        last = self.pending_progress(namespace, name)
        return new if last is None else {**new, "trainerStatus": last}

    def _expire(self, job: dict[str, Any], now: float) -> float | None:
        """Delete a finished job past its TTL; else the seconds until it is due (``None``: it has none)."""
        left = ttl_remaining(job, now)
        if left is None or left > 0:
            return left
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if self.api.delete(TRAINJOBS, namespace, name, propagation="Background"):
            log.info("deleted TrainJob %s/%s: finished more than its ttl-seconds-after-finished ago", namespace, name)
        return None


def _sooner(first: float | None, second: float | None) -> float | None:
    """The earlier of two "again in" times (``None``: not due)."""
    return first if second is None else second if first is None else min(first, second)


def _trainer_started(jobset: dict[str, Any], trainer: str) -> bool:
    """Whether any pod of the trainer replicated job has run (so node 0 may have logged progress)."""
    for entry in (jobset.get("status") or {}).get("replicatedJobsStatus") or []:
        if entry.get("name") == trainer and any(entry.get(k) for k in ("active", "ready", "succeeded", "failed")):
            return True
    return False
