"""A TrainJob's ``status.trainerStatus`` on Kubernetes (Kubeflow Trainer v2.2 shape), from its node-0 log.

Global rank 0 runs on node 0 and prints one line for every ``report`` or ``update_trainjob_status`` call
(``step 120/1000 loss=0.43``, ``progress 42% eta 120s loss=0.43``: :mod:`trainjob.progress`). The operator reads
the end of that pod's log with timestamps and patches the status when what it says changed; nothing in the pods
needs credentials or a route to the operator. Pure functions: the operator fetches, these decide::

    pod = trainer_pods(pods).get(0)                        # views.trainer_pods: node-0's pod
    if should_read_progress(job, pod):
        text = core.read_namespaced_pod_log(pod_name, namespace, container="node", timestamps=True,
                                            tail_lines=LOG_TAIL_LINES)
        patch = trainer_status_patch(job, text)            # None: nothing new
        if patch is not None:
            patch the TrainJob's status subresource with it (a merge patch)

``lastUpdatedTime`` is the time the line was written (from the log's timestamps), so reading the same log twice
gives the same status and no patch: the reconcile stays idempotent.
"""

from __future__ import annotations

from typing import Any

from trainjob.progress import progress_of_records, records_from_log, trainer_status

#: How much of node-0's log is read: enough for the last report and a step rate, little enough to read often.
LOG_TAIL_LINES = 500
#: How often a running job's progress is read (a requeue interval for the operator).
RESYNC_SECONDS = 10.0


def trainer_status_from_log(text: str) -> dict[str, Any] | None:
    """``status.trainerStatus`` from a log read with timestamps; ``None`` when it holds no progress line. Metrics
    are the last line's, text values included (Kubeflow's metrics are strings)."""
    records = records_from_log(text)
    return trainer_status(progress_of_records(records), records[-1]["metrics"] if records else None)


def should_read_progress(job: dict[str, Any], pod: dict[str, Any] | None) -> bool:
    """Whether node-0's log may hold news: the job is not finished yet (the reconcile that finishes it still reads,
    as its status is written at the end), and node-0's pod has started."""
    conditions = (job.get("status") or {}).get("conditions") or []
    if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
        return False
    phase = ((pod or {}).get("status") or {}).get("phase")
    return phase in ("Running", "Succeeded", "Failed")


def trainer_status_patch(job: dict[str, Any], text: str) -> dict[str, Any] | None:
    """The status merge patch that sets ``trainerStatus`` from node-0's log, or ``None`` when it would change
    nothing (no progress line, or the same status as now)."""
    status = trainer_status_from_log(text)
    if status is None or status == (job.get("status") or {}).get("trainerStatus"):
        return None
    return {"status": {"trainerStatus": status}}
