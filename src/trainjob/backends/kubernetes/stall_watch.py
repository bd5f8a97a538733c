"""The stall watch on Kubernetes: the rules of :mod:`trainjob.backends.stall` applied to a running TrainJob.

A report counts when this process sees a new ``status.trainerStatus`` arrive, by its own clock (the pods' clocks,
which stamp ``lastUpdatedTime``, may be off by any amount). A job that never reports is held to its collectives
instead, where its image has trainjob: each rank posts how long ago its collectives last completed and how long one
has waited (:mod:`trainjob.pod_site`; the endpoint keeps them, :meth:`.status_server.StatusServer.collectives`),
and the job has stalled when a rank waited past the limit while none completed
(:func:`~trainjob.backends.stall.collectives_overdue`). Once a job is overdue, the ``Stalled`` event names the
stuck ranks from the stacks each rank wrote to its log (:mod:`trainjob.torch.rank_stacks`, :mod:`trainjob.pod_site`,
:func:`trainjob.log_stacks.stacks_in_log`), then, for a job that reports:

==========================================  =================================================================
``trainjob/stall-action``                   what the watch does
==========================================  =================================================================
``restart``, restarts left                  counts the restart in :data:`STALL_RESTARTS_ANNOTATION` first, then
                                            evicts the pods (the Job controller replaces them as it does
                                            preempted ones); unarmed until the new node group reports
``restart``, none left; ``fail``            deletes the JobSet and fails the job (reason ``Stalled``)
an invalid ``trainjob/stall-timeout``       fails the job (reason ``InvalidStallTimeout``)
==========================================  =================================================================

For a job held to its collectives, the ``Stalled`` Warning is repeated every limit while the stall lasts and a
``StallEnded`` event follows when collectives complete again; ``trainjob/stall-action`` set to ``fail`` or
``restart`` acts as above instead (:attr:`~trainjob.backends.stall.StallPolicy.collective_action`).

The budget is the JobSet's ``failurePolicy.maxRestarts``, shared with its own restarts::

    watch = StallWatch(api, CachedReads(api, cache), writer)
    due_in = watch.watch(job, old_status, new_status, jobset, now)   # seconds until overdue; None: not watched;
                                                                      # <= 0: the job was failed
    watch.unarm("ml", "mnist")                                        # suspended, or its pods replaced
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.cache import CachedReads
from trainjob.backends.kubernetes.children import delete_children
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.resources import JOBSET_NAME_LABEL, TRAINJOBS
from trainjob.backends.kubernetes.status_writer import StatusWriter
from trainjob.backends.kubernetes.views import trainer_container, trainer_name, trainer_pods
from trainjob.backends.stacks import RankStacks, find_stuck_ranks
from trainjob.backends.stall import (
    RUNS_ON,
    ProgressClock,
    RankCollectives,
    StallPolicy,
    collective_stall_message,
    collectives_overdue,
    seconds_text,
    stall_policy,
)
from trainjob.constants import LAUNCH_ANNOTATION, STALL_RESTARTS_ANNOTATION
from trainjob.errors import TrainJobError, ValidationError
from trainjob.log_stacks import stacks_in_log

log = logging.getLogger("trainjob.operator")

#: The longest a job held to its collectives goes unchecked while none of its ranks waits in one.
COLLECTIVES_RECHECK_SECONDS = 30.0


class CollectiveReports(Protocol):
    """Where the ranks' collectives reports are kept (:class:`.status_server.StatusServer`)."""

    def collectives(self, namespace: str, name: str) -> list[RankCollectives]: ...

    def forget_collectives(self, namespace: str, name: str) -> None: ...


class StallWatch:
    """Watches running TrainJobs for stalls; keeps each one's progress clock: (job uid, the last ``trainerStatus``
    seen, its :class:`~trainjob.backends.stall.ProgressClock`), forgotten when the job finishes or goes."""

    def __init__(self, api: KubeApi, reads: CachedReads, writer: StatusWriter,
                 reports: CollectiveReports | None = None) -> None:
        self.api = api
        self.reads = reads
        self.writer = writer
        self.reports = reports
        self._clocks: dict[tuple[str, str], tuple[str, dict[str, Any] | None, ProgressClock]] = {}
        #: Jobs held to their collectives that were warned of a stall: (when it began, warnings so far).
        self._warned: dict[tuple[str, str], tuple[float, int]] = {}

    def watch(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any], jobset: dict[str, Any],
              now: float) -> float | None:
        """Seconds until the running job would be overdue; ``None`` when it is not watched (no report yet,
        ``trainjob/stall-timeout: off``, or its node group just restarted); ``0`` after failing it. ``old`` is
        the status as stored, ``new`` as this pass derived it."""
        meta = job["metadata"]
        budget = int(((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts") or 0)
        try:
            policy = stall_policy(meta.get("annotations"), max_restarts=budget)
        except ValidationError as exc:  # checked at submit by trainjob; a job made another way is told here
            self.writer.fail(job, old, "InvalidStallTimeout", f"{exc} (fix the annotation and create the job again)",
                             now)
            return 0.0
        clock = self._saw(job, new.get("trainerStatus") or {}, now)
        if clock.last is None and self.reports is not None:  # no report yet: held to its collectives, if any
            return self._watch_collectives(job, old, new, jobset, policy, now)
        overdue = clock.overdue(policy, now)
        if overdue is None:
            limit = policy.limit(clock.longest)
            armed = clock.last is not None and (policy.timeout is not None or clock.longest is not None)
            return clock.last + limit - now + 0.5 if armed and limit is not None and clock.last is not None else None
        silent, limit = overdue
        stuck = f"no progress for {silent:.1f} s (limit {limit:.1f} s: {policy.explain(clock.longest)}): the job is stuck"
        named = self._name_stuck_ranks(meta["namespace"], meta["name"], jobset)
        stuck += f": {named}" if named else " (no rank wrote its stacks to its log)"
        restarted = int((meta.get("annotations") or {}).get(STALL_RESTARTS_ANNOTATION, "0") or 0)
        spent = restarted + int((jobset.get("status") or {}).get("restarts") or 0)
        if policy.action == "restart" and spent < budget:
            self._restart(job, new, stuck, restarted, spent, budget)
            return None
        if policy.action == "restart":
            stuck += f"; no restart left ({spent} of {budget} spent)"
        self._fail(job, old, new, f"{stuck}; its JobSet was deleted", now)
        return 0.0

    def unarm(self, namespace: str, name: str) -> None:
        """The job is suspended or its pods replaced: not watched until a new report arrives."""
        self._forget_collectives(namespace, name)
        if (namespace, name) in self._clocks:
            seen_uid, seen, _ = self._clocks[(namespace, name)]
            self._clocks[(namespace, name)] = (seen_uid, seen, ProgressClock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop the clock of a job that finished or went."""
        self._clocks.pop((namespace, name), None)
        self._forget_collectives(namespace, name)

    def _forget_collectives(self, namespace: str, name: str) -> None:
        self._warned.pop((namespace, name), None)
        if self.reports is not None:
            self.reports.forget_collectives(namespace, name)

    def _watch_collectives(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any],
                           jobset: dict[str, Any], policy: StallPolicy, now: float) -> float | None:
        """:meth:`watch` for a job that has not reported: by its ranks' collectives reports (none yet: not
        watched; the first one queues the job)."""
        assert self.reports is not None
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        ranks = self.reports.collectives(*key)
        limit = policy.collective_limit()
        if limit is None or not ranks:
            return None
        recheck = min(max(limit / 4, 1.0), COLLECTIVES_RECHECK_SECONDS)
        overdue = collectives_overdue(ranks, policy, now)
        if overdue is None:
            warned = self._warned.pop(key, None)
            if warned is not None:
                self.api.post_event(job, "Normal", "StallEnded", "collectives complete again, after a stall of "
                                                                 f"{seconds_text(now - warned[0])}")
                log.info("TrainJob %s/%s: collectives complete again", *key)
            waiting = [r.waiting_since for r in ranks if r.waiting_since is not None]
            if not waiting:
                return recheck  # no rank waits now: its next reports say when one starts to
            since = max([min(waiting), *(r.completed_at for r in ranks if r.completed_at is not None)])
            return min(max(since + limit - now, 0.0) + 0.5, recheck)
        silent, limit = overdue
        began, warnings = self._warned.get(key, (now - silent, 0))
        if policy.collective_action == "warn" and warnings and silent <= limit * (warnings + 1):
            return limit * (warnings + 1) - silent + 0.5  # warned of already: again once it lasted another limit
        named = self._name_stuck_ranks(key[0], key[1], jobset)
        stuck = collective_stall_message(ranks, silent, limit, policy,
                                         named or "no rank wrote its stacks to its log")
        if policy.collective_action == "warn":
            self._warned[key] = (began, warnings + 1)
            self.api.post_event(job, "Warning", "Stalled", stuck + RUNS_ON)
            log.info("TrainJob %s/%s stalled: %s", key[0], key[1], stuck)
            return limit + 0.5
        restarted = int((meta.get("annotations") or {}).get(STALL_RESTARTS_ANNOTATION, "0") or 0)
        spent = restarted + int((jobset.get("status") or {}).get("restarts") or 0)
        budget = int(((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts") or 0)
        if policy.action == "restart" and spent < budget:
            self._restart(job, new, stuck, restarted, spent, budget)
            self._forget_collectives(*key)
            return None
        if policy.action == "restart":
            stuck += f"; no restart left ({spent} of {budget} spent)"
        self._fail(job, old, new, f"{stuck}; its JobSet was deleted", now)
        return 0.0

    def _saw(self, job: dict[str, Any], trainer_status: dict[str, Any], now: float) -> ProgressClock:
        """The job's clock, ticked when ``trainer_status`` is a report this process had not seen."""
        meta = job["metadata"]
        key, uid = (meta["namespace"], meta["name"]), meta.get("uid", "")
        seen_uid, seen, clock = self._clocks.get(key) or (uid, None, ProgressClock())
        if seen_uid != uid:  # a namesake of a job that went
            seen, clock = None, ProgressClock()
        if trainer_status.get("lastUpdatedTime") and trainer_status != seen:
            clock.saw([now])
            seen = trainer_status
        self._clocks[key] = (uid, seen, clock)
        return clock

    def _restart(self, job: dict[str, Any], new: dict[str, Any], stuck: str, restarted: int, spent: int,
                 budget: int) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        # the count first: were the pods evicted and the count then lost, the next stall would restart again past
        # the budget
        count = {"metadata": {"annotations": {STALL_RESTARTS_ANNOTATION: str(restarted + 1)}}}
        self.reads.stored(TRAINJOBS, self.api.patch(TRAINJOBS, namespace, name, count))
        self.api.post_event(job, "Warning", "Stalled", f"{stuck}; restarting its node group (restart {spent + 1} of "
                                                       f"{budget}), from its last checkpoint when the script keeps one")
        for pod in self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"):
            if not pod["metadata"].get("deletionTimestamp") and \
                    (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                self.api.evict(namespace, pod["metadata"]["name"])
        # unarmed until the new group reports: the last report of the old one does not count
        self._clocks[(namespace, name)] = (job["metadata"].get("uid", ""), new.get("trainerStatus") or {},
                                           ProgressClock())
        log.info("TrainJob %s/%s stalled: node group restarted (%d of %d)", namespace, name, spent + 1, budget)

    def _fail(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any], message: str, now: float) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        self._clocks.pop((namespace, name), None)
        delete_children(self.api, namespace, name)
        self.writer.write(namespace, name, old, st.failed(new, "Stalled", message, now))
        self.api.post_event(job, "Warning", "Stalled", message)

    def _name_stuck_ranks(self, namespace: str, name: str, jobset: dict[str, Any]) -> str | None:
        """Which ranks the stalled job waits for, and where they are, from the stacks the ranks wrote to their
        pods' logs; ``None`` when none did."""
        dumps: dict[int, str] = {}
        try:
            pods = trainer_pods(self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"), trainer_name(jobset))
            for pod in pods.values():
                if (pod.get("status") or {}).get("phase") == "Running":
                    dumps.update(stacks_in_log(self.api.read_log(namespace, pod, trainer_container(pod),
                                                                tail_lines=5000)))
        except TrainJobError as exc:  # the stacks are best effort: the stall is acted on either way
            log.warning("cannot read the stacks of stalled TrainJob %s/%s: %s", namespace, name, exc)
        if not dumps:
            return None
        summary = find_stuck_ranks([RankStacks(rank, text) for rank, text in sorted(dumps.items())]).summary
        # A static job's ranks are all known: one that wrote nothing is named first, as the likeliest culprit.
        launch = json.loads(((jobset.get("metadata") or {}).get("annotations") or {}).get(LAUNCH_ANNOTATION) or "{}")
        if launch.get("elastic") or not launch.get("numNodes") or not launch.get("numProcPerNode"):
            return summary
        silent = sorted(set(range(int(launch["numNodes"]) * int(launch["numProcPerNode"]))) - set(dumps))
        if not silent:
            return summary
        which = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {', '.join(map(str, silent))}"
        return (f"{which} wrote no stacks (a rank writes them when it reports through trainjob.torch.report, or, in "
                f"an image with trainjob, when its collectives stop; not while it holds the GIL); of the others: "
                f"{summary}")
