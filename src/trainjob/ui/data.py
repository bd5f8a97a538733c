"""What the dashboard shows, as JSON-ready dicts, from any backend (local processes or Kubernetes).

Everything goes through the backend's methods: the job list is ``list_summaries`` (on the local backend the
store's summary tuples, ten thousand jobs in a few tens of milliseconds), metrics are ``metric_records``
(incremental, ``after`` an id: every record on the local backend, the reported progress one point per change
elsewhere, which the page accumulates into a curve while it watches) and logs are ``logs(..., until=...)``,
stopping as soon as the browser goes away.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from trainjob.sdk import types

#: The list shows at most this many jobs (newest first) of those matching its filter; counts cover them all.
DEFAULT_LIST_LIMIT = 200
MAX_LIST_LIMIT = 2000


def _seconds(value: Any) -> float | None:
    return None if value is None else value.timestamp()


def _row(job: types.JobSummary) -> dict[str, Any]:
    return {"name": job.name, "status": job.status, "nodes": job.num_nodes, "procs": job.num_proc_per_node,
            "runtime": job.runtime, "created": job.created, "started": job.started, "finished": job.finished,
            "step": job.step, "total_steps": job.total_steps, "loss": job.loss, "eta": job.eta_seconds}


class Dashboard:
    """The dashboard's view of one backend; one instance serves every request (it is thread-safe)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.local = backend.backend_name == "local"

    @property
    def backend_name(self) -> str:
        return self.backend.backend_name

    # the job list

    def jobs(self, query: str = "", status: str = "", limit: int = DEFAULT_LIST_LIMIT) -> dict[str, Any]:
        """The newest ``limit`` jobs whose name contains ``query`` and whose status is ``status`` (any when
        empty), with counts per status of every job. Rows are built for the jobs shown only."""
        jobs = self.backend.list_summaries()
        statuses = [job.status for job in jobs]
        names = [job.name for job in jobs]
        query = query.strip().lower()
        limit = max(1, min(limit, MAX_LIST_LIMIT))
        matching = [i for i in range(len(jobs) - 1, -1, -1) if (not status or statuses[i] == status) and query in names[i]]
        return {"backend": self.backend_name, "now": time.time(), "total": len(jobs), "counts": dict(Counter(statuses)),
                "matching": len(matching), "jobs": [_row(jobs[i]) for i in matching[:limit]]}

    # one job

    def job(self, name: str) -> dict[str, Any]:
        job = self.backend.get_job(name)
        events = self.backend.get_job_events(name)
        progress = job.progress
        return {
            **_row(types.JobSummary.of(job)),
            "backend": self.backend_name,
            "now": time.time(),
            "reason": job.reason,
            "message": job.message,
            "restarts": job.restarts,
            "metrics": dict(progress.metrics) if progress else {},
            "steps": [{"name": s.name, "status": s.status} for s in job.steps],
            "events": [
                {"time": _seconds(e.event_time), "type": e.type, "reason": e.reason,
                 "object": f"{e.involved_object_kind}/{e.involved_object_name}", "message": e.message}
                for e in events
            ],
            "resource": job.resource,
            "world_size": job.num_nodes * (job.num_proc_per_node or 1),
        }

    def metrics(self, name: str, after: float = 0) -> dict[str, Any]:
        """Metric records newer than ``after`` (an id from an earlier answer): ``{"records": [...], "last": id}``."""
        records = self.backend.metric_records(name, after)
        last = records[-1]["id"] if records else after
        return {"records": records, "last": last}

    def follow_logs(self, name: str, node: int | None, rank: int | None, follow: bool, stopped: threading.Event,
                    on_poll: Callable[[], None] = lambda: None) -> Iterator[types.LogLine]:
        """The job's log lines (one node or rank, or all), following while it runs until ``stopped`` is set;
        ``on_poll`` is called each time the files were read to their end (local backend)."""

        def until() -> bool:
            on_poll()
            return stopped.is_set()

        return self.backend.logs(name, node=node, rank=rank, follow=follow, until=until)

    # actions

    def suspend(self, name: str) -> None:
        self.backend.suspend_job(name)

    def resume(self, name: str) -> None:
        self.backend.resume_job(name)

    def delete(self, name: str) -> None:
        self.backend.delete_job(name)
