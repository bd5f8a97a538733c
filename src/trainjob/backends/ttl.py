"""``ttlSecondsAfterFinished`` for TrainJobs, as the annotation both backends read.

Kubeflow Trainer v1's PyTorchJob had ``spec.runPolicy.ttlSecondsAfterFinished``; v2's TrainJob has no such
field. This project takes it as an annotation rather than a spec field, so a job that uses it still validates
against Kubeflow Trainer's own CRD and runs unchanged on a cluster without this operator::

    metadata:
      annotations:
        trainjob/ttl-seconds-after-finished: "3600"   # remove the job and its logs an hour after it ends

A job is finished when it is ``Complete`` or ``Failed`` (a suspended job is not). The local backend removes
expired jobs (:mod:`trainjob.backends.local.client.ttl`); on Kubernetes the operator decides with
:func:`trainjob.backends.kubernetes.ttl.ttl_remaining`. ``trainjob gc`` removes expired jobs on demand.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainjob.constants import TTL_ANNOTATION
from trainjob.errors import ValidationError

__all__ = ["MAX_TTL_SECONDS", "TTL_ANNOTATION", "seconds_left", "ttl_seconds"]
#: Kubernetes keeps the field in an int32 on Jobs; the same bound keeps ``finished + ttl`` sensible here.
MAX_TTL_SECONDS = 2**31 - 1


def ttl_seconds(annotations: Mapping[str, str] | None) -> int | None:
    """The job's TTL in seconds (``>= 0``), ``None`` when not set; ``ValidationError`` naming the annotation."""
    value = (annotations or {}).get(TTL_ANNOTATION)
    if value is None:
        return None
    text = str(value).strip()
    if not text.isdigit() or int(text) > MAX_TTL_SECONDS:
        raise ValidationError(
            f"metadata.annotations[{TTL_ANNOTATION}]",
            f"must be a whole number of seconds from 0 to {MAX_TTL_SECONDS}, got {value!r}",
        )
    return int(text)


def seconds_left(finished_at: float | None, ttl: int | None, now: float) -> float | None:
    """Seconds until a job that finished at ``finished_at`` expires (``<= 0``: expired); ``None`` when it never
    does (no TTL, or not finished)."""
    if ttl is None or finished_at is None:
        return None
    return finished_at + ttl - now
