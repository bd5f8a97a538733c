"""Finished local jobs past their ``trainjob/ttl-seconds-after-finished`` (:mod:`trainjob.backends.ttl`).

There is no controller running between commands on this machine, so expired jobs are removed (with their logs
and metrics) by whoever looks next: every listing and every submit (:meth:`.backend.LocalBackend.list_jobs`,
``trainjob list``, ``trainjob run``), ``trainjob ui`` every few seconds while it runs, and ``trainjob gc``.
Reading one job by name does not remove it, so waiting for a job with a short TTL still sees it finish::

    for name in expired_jobs(store, time.time()):
        backend.delete_job(name)
"""

from __future__ import annotations

from trainjob.backends.local.store import Store
from trainjob.sdk import types


def expired_jobs(store: Store, now: float) -> list[str]:
    """Names of finished jobs whose TTL has run out at ``now``, oldest first."""
    rows = store._db.execute(
        "SELECT name FROM jobs WHERE ttl_seconds IS NOT NULL AND finished IS NOT NULL AND status IN (?, ?) "
        "AND finished + ttl_seconds <= ? ORDER BY finished",
        (types.COMPLETE, types.FAILED, now),
    )
    return [row[0] for row in rows]
