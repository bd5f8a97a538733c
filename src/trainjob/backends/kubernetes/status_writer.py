"""Writes a TrainJob's status: merge patches of what changed, pod-count bursts settled into one write.

The reconciler derives the status (:mod:`.status`); this module writes it::

    writer = StatusWriter(api, CachedReads(api, cache), clock=time.time)
    writer.jobset_created("ml", "mnist")                     # its JobSet's first counts settle like a write's
    wait = writer.settling("ml", "mnist", old, new, now)   # seconds to hold a pod-count-only change back, or None
    if wait is None:
        writer.write("ml", "mnist", old, new)              # one PATCH of trainjobs/status; nothing when equal, or
                                                           # when only counts that are all still zero came
    writer.fail(job, status, "InvalidTrainJob", message, now)   # Failed with a reason, and a Warning Event
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.cache import CachedReads
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.resources import TRAINJOBS

log = logging.getLogger("trainjob.operator")

#: Pod counts (``jobsStatus``) of one job are written at most this often, counted from its last status write or
#: its JobSet's creation: a burst of JobSet updates while its pods start becomes one write. Conditions are written
#: at once.
STATUS_SETTLE_SECONDS = 1.0
_REMEMBERED = 50_000  # jobs whose last write time is kept; past it the oldest half is forgotten


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns status ``old`` into ``new``: changed fields, ``null`` for a gone
    one, and within an object that changed (``trainerStatus``) ``null`` for the fields it no longer has.

    >>> merge_patch({"a": 1, "t": {"p": 5, "m": []}}, {"t": {"p": 6}})
    {'t': {'m': None, 'p': 6}, 'a': None}
    """
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict):
            patch[k] = {**{gone: None for gone in old[k] if gone not in v}, **v}
    patch.update({k: None for k in old if k not in new})
    return patch


def counts_say_nothing(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether ``new`` differs from ``old`` only in ``jobsStatus`` and neither has a Job counted in it: a new
    JobSet first lists its replicated jobs with every count at zero, which tells a user nothing the job's
    ``JobSetCreated`` event did not, and the counts that follow within seconds are written anyway. Counts that drop
    back to zero (pods replaced) are written: the old ones said something.

    >>> counts_say_nothing({}, {"jobsStatus": [{"name": "node", "active": 0, "ready": 0}]})
    True
    >>> counts_say_nothing({}, {"jobsStatus": [{"name": "node", "active": 1}]})
    False
    >>> counts_say_nothing({"jobsStatus": [{"name": "node", "active": 1}]}, {"jobsStatus": [{"name": "node"}]})
    False
    """
    if {k: v for k, v in new.items() if k != "jobsStatus"} != {k: v for k, v in old.items() if k != "jobsStatus"}:
        return False
    return not any(isinstance(value, int) and value > 0
                   for status in (old, new) for entry in status.get("jobsStatus") or [] for value in entry.values())


class StatusWriter:
    """Patches TrainJob statuses through ``api``; remembers when it last wrote each job's (by ``clock``)."""

    def __init__(self, api: KubeApi, reads: CachedReads, clock: Callable[[], float]) -> None:
        self.api = api
        self.reads = reads
        self.clock = clock
        self._written: dict[tuple[str, str], float] = {}

    def settling(self, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any],
                 now: float) -> float | None:
        """Seconds to wait before writing ``new`` when it differs from ``old`` only in ``jobsStatus`` (pods
        starting or ending one by one, which JobSet reports in bursts) and the job's status was written less than
        :data:`STATUS_SETTLE_SECONDS` ago (or its JobSet created: :meth:`jobset_created`); ``None``: write now.
        Conditions are never held back."""
        if new == old or {k: v for k, v in new.items() if k != "jobsStatus"} != \
                {k: v for k, v in old.items() if k != "jobsStatus"}:
            return None
        last = self._written.get((namespace, name))
        if last is None or now - last >= STATUS_SETTLE_SECONDS:
            return None
        return STATUS_SETTLE_SECONDS - (now - last)

    def jobset_created(self, namespace: str, name: str) -> None:
        """The job's JobSet was just created: the counts its status fills in next (jobs, then pods, within a
        second) settle into one write, as after a status write."""
        self._remember(namespace, name)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the write time of a job that finished or went."""
        self._written.pop((namespace, name), None)

    def _remember(self, namespace: str, name: str) -> None:
        self._written[(namespace, name)] = self.clock()
        if len(self._written) > _REMEMBERED:
            for key in sorted(self._written, key=self._written.__getitem__)[:_REMEMBERED // 2]:
                del self._written[key]

    def write(self, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Patch the job's status from ``old`` to ``new`` (:func:`merge_patch`); nothing when they are equal, or when
        they differ only in ``jobsStatus`` and neither has a count above zero (:func:`counts_say_nothing`)."""
        if new == old or counts_say_nothing(old, new):
            return
        self._remember(namespace, name)
        self.reads.stored(TRAINJOBS, self.api.patch_status(TRAINJOBS, namespace, name, merge_patch(old, new)))

    def fail(self, job: dict[str, Any], status: dict[str, Any], reason: str, message: str, now: float) -> None:
        """Write ``Failed`` with ``reason`` and ``message`` and post them as a ``Warning`` Event."""
        meta = job["metadata"]
        self.write(meta["namespace"], meta["name"], status, st.failed(status, reason, message, now))
        self.api.post_event(job, "Warning", reason, message)
        log.info("TrainJob %s/%s failed: %s: %s", meta["namespace"], meta["name"], reason, message)
