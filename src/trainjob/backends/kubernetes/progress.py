"""A TrainJob's ``status.trainerStatus`` on Kubernetes (Kubeflow Trainer v2.2 shape) when it is read from a
log, and an elastic job's resizes.

Global rank 0 prints one line for every ``report`` or ``update_trainjob_status`` call (``step 120/1000
loss=0.43``, ``progress 42% eta 120s loss=0.43``: :mod:`trainjob.progress`). With the operator's status endpoint
(:mod:`.status_server`, as ``trainjob install`` deploys it) the ranks push their progress there and nothing here
is used for progress; without it the operator reads the end of node 0's log with timestamps and patches the
status when what it says changed::

    pod = trainer_pods(pods).get(0)                        # views.trainer_pods: node-0's pod
    if should_read_progress(job, pod):
        status = trainer_status_from_log(read_log_tail(api, namespace, pod))   # None: no progress line

``lastUpdatedTime`` is the time the line was written (from the log's timestamps), so reading the same log twice
gives the same status and no patch: the reconcile stays idempotent.

An elastic job's rank 0 (:mod:`trainjob.torch.elastic`) also prints ``[trainjob] resized 3 -> 2 nodes (world size
3 -> 2), resuming at step 40`` whenever it resumes at another size. Rank 0 need not run on node 0 after a resize, so
the operator reads every running trainer pod's log of an elastic job every :data:`RESYNC_SECONDS`, endpoint or not;
:func:`new_resizes` turns the lines written after the job's :data:`RESIZE_ANNOTATION` into ``Resized`` events,
oldest first (:mod:`.job_events`), and the annotation moves to the newest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.views import trainer_container
from trainjob.constants import RESIZE_ANNOTATION
from trainjob.progress import (
    progress_of_records,
    records_from_log,
    stamp_seconds,
    stamped_lines,
    trainer_status,
)

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.kubeapi import KubeApi

#: How much of node-0's log is read: enough for the last report and a step rate, little enough to read often.
LOG_TAIL_LINES = 500
#: How often a running job's progress is read (a requeue interval for the operator).
RESYNC_SECONDS = 10.0


def trainer_status_from_log(text: str) -> dict[str, Any] | None:
    """``status.trainerStatus`` from a log read with timestamps; ``None`` when it holds no progress line. Metrics
    are the last line's, text values included (Kubeflow's metrics are strings)."""
    records = records_from_log(text)
    return trainer_status(progress_of_records(records), records[-1]["metrics"] if records else None)


def read_log_tail(api: KubeApi, namespace: str, pod: dict[str, Any]) -> str:
    """The last :data:`LOG_TAIL_LINES` lines of a trainer pod's log, with the times they were written."""
    return api.read_pod_log(namespace, pod["metadata"]["name"], container=trainer_container(pod),
                            timestamps=True, tail_lines=LOG_TAIL_LINES)


def should_read_progress(job: dict[str, Any], pod: dict[str, Any] | None) -> bool:
    """Whether node-0's log may hold news: the job is not finished yet (the reconcile that finishes it still reads,
    as its status is written at the end), and node-0's pod has started."""
    conditions = (job.get("status") or {}).get("conditions") or []
    if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
        return False
    phase = ((pod or {}).get("status") or {}).get("phase")
    return phase in ("Running", "Succeeded", "Failed")


_RESIZED = re.compile(r"^\[trainjob\] resized (\d+) -> (\d+) nodes\b(.*)$")


def resizes_from_logs(texts: Iterable[str]) -> list[tuple[str, str]]:
    """``(time, "Resized 3 -> 2 nodes (...)")`` for every resize line in logs read with timestamps, oldest first.

    >>> resizes_from_logs(["2026-11-23T09:00:05.5Z [rank0]: [trainjob] resized 3 -> 2 nodes (world size 3 -> 2), "
    ...                    "resuming at step 40", "2026-11-23T09:00:06Z step 41 loss=0.5"])
    [('2026-11-23T09:00:05.5Z', 'Resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 40')]
    """
    found: dict[tuple[str, str], float] = {}
    for text in texts:
        for stamp, line in stamped_lines(text):
            resized = _RESIZED.match(line.strip())
            if resized is not None:
                message = f"Resized {resized[1]} -> {resized[2]} nodes{resized[3].rstrip()}"
                found.setdefault((stamp, message), stamp_seconds(stamp))
    return sorted(found, key=lambda key: found[key])


def new_resizes(job: dict[str, Any], resizes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The resizes written after the one ``job``'s :data:`RESIZE_ANNOTATION` records (all when it has none)."""
    last = ((job.get("metadata") or {}).get("annotations") or {}).get(RESIZE_ANNOTATION)
    try:
        since = stamp_seconds(last) if last else None
    except ValueError:
        since = None
    return [(stamp, message) for stamp, message in resizes if since is None or stamp_seconds(stamp) > since]


def is_elastic(jobset: dict[str, Any], trainer: str) -> bool:
    """Whether the trainer's nodes rendezvous elastically (``PET_NNODES`` is a ``min:max`` range)."""
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if rj.get("name") != trainer:
            continue
        pod_spec = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod_spec.get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == "PET_NNODES" and ":" in str(env.get("value") or ""):
                    return True
    return False
