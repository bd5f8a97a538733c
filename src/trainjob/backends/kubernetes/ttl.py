"""When the operator should delete a finished TrainJob: ``trainjob/ttl-seconds-after-finished`` on Kubernetes.

A pure decision over the TrainJob object as the API server returns it, so the reconciler stays the one place
that talks to the API server::

    left = ttl_remaining(trainjob, time.time())
    if left is not None and left <= 0:
        ...  # delete the TrainJob (its JobSet and PodGroup go with it through their owner references)
    elif left is not None:
        ...  # look again in ``left`` seconds

The clock starts at the ``lastTransitionTime`` of the job's ``Complete`` or ``Failed`` condition. A job whose
annotation is not a valid TTL is never deleted by it (``ttl_remaining`` gives ``None``): the operator does not
delete what it cannot read, and the annotation is checked at submit by the client.
"""

from __future__ import annotations

from typing import Any

from trainjob.backends.kubernetes.status import finished_condition, parse_timestamp
from trainjob.backends.ttl import seconds_left, ttl_seconds
from trainjob.errors import ValidationError

__all__ = ["ttl_remaining"]


def ttl_remaining(trainjob: dict[str, Any], now: float) -> float | None:
    """Seconds until ``trainjob`` should be deleted (``<= 0``: now); ``None`` when it has no TTL, has not
    finished, or its TTL or finish time cannot be read."""
    try:
        ttl = ttl_seconds((trainjob.get("metadata") or {}).get("annotations"))
    except ValidationError:
        return None
    if ttl is None:
        return None
    condition = finished_condition(trainjob.get("status") or {})
    if condition is None or not condition.get("lastTransitionTime"):
        return None
    try:
        finished_at = parse_timestamp(condition["lastTransitionTime"])
    except ValueError:
        return None
    return seconds_left(finished_at, ttl, now)
