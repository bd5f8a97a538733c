"""Training metrics and progress from rank 0, to stdout and to the job's metrics file.

The local backend sets ``TRAINJOB_METRICS_FILE`` in every process; each :func:`report` on global rank 0 appends
one JSON object per line, which ``trainjob get`` and ``trainjob list`` read for progress, ETA and the last loss::

    {"time": 1763712000.5, "step": 120, "total_steps": 1000, "metrics": {"loss": 0.4312, "lr": 0.001}}

:func:`update_trainjob_status` is the Kubeflow SDK's in-job progress call (percent done, seconds left, metrics).
Both print a progress line (the lines and records: :mod:`trainjob.progress`) and, on Kubernetes with the operator's
status endpoint set (``KUBEFLOW_TRAINER_SERVER_URL``), POST the TrainJob's ``status.trainerStatus`` to it; without
the endpoint the operator reads the line from node 0's log (:mod:`trainjob.backends.kubernetes.progress`).

Without the variable, metrics only go to stdout. With ``TRAINJOB_TENSORBOARD=1`` they also go to TensorBoard
event files, one run per job (:mod:`trainjob.torch.tensorboard`). Other ranks do nothing, so call it unconditionally::

    report({"loss": loss, "lr": scheduler.get_last_lr()[0]}, step=step, total_steps=total_steps)
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping

import torch

from trainjob.constants import METRICS_FILE_ENV
from trainjob.errors import ValidationError
from trainjob.progress import (
    MAX_METRICS,
    numeric_metrics,
    progress_line,
    progress_of_records,
    step_line,
    trainer_status,
)
from trainjob.torch import kubeflow_status, rank_stacks, tensorboard
from trainjob.torch.env import global_rank

__all__ = ["METRICS_FILE_ENV", "report", "update_trainjob_status"]

_log = logging.getLogger(__name__)


def _as_float(name: str, value: object) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValidationError(f"metrics.{name}", f"must be a number or a one-element tensor, got shape {tuple(value.shape)}")
        return float(value.detach().item())
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"metrics.{name}", f"must be a number or a one-element tensor, got {value!r}")
    return float(value)


def _optional_step(field: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(field, f"must be an integer >= 0 or None, got {value!r}")
    return value


def report(metrics: Mapping[str, object], step: int | None = None, total_steps: int | None = None) -> None:
    """Record ``metrics`` (name -> number or one-element tensor) for ``step`` of ``total_steps`` on rank 0."""
    step = _optional_step("step", step)
    total_steps = _optional_step("total_steps", total_steps)
    rank_stacks.beat()  # every rank: on Kubernetes a rank that stops reporting dumps its own stacks
    if global_rank() != 0:
        return
    values = {str(name): _as_float(str(name), value) for name, value in metrics.items()}
    print(step_line(step, total_steps, values), flush=True)
    tensorboard.write_scalars(values, step)  # only with TRAINJOB_TENSORBOARD=1 (trainjob.torch.tensorboard)
    record = {"step": step, "total_steps": total_steps, "metrics": values}
    _append_record(record)
    if os.environ.get(kubeflow_status.SERVER_URL_ENV):  # the operator's status endpoint: the same numbers
        _reported.append({"time": time.time(), **record})
        del _reported[1:-1]  # the first (for the rate) and the newest
        status = trainer_status(progress_of_records(_reported))
        if status is not None:
            kubeflow_status.send(status.get("progressPercentage"), status.get("estimatedRemainingSeconds"), values)


#: The first and the newest of this process's reports (for the step rate the time left is estimated from).
_reported: list[dict[str, object]] = []


def _append_record(record: dict[str, object]) -> bool:
    """Append ``record`` (with the time) to the job's metrics file; ``False`` where there is none (not a local job)."""
    path = os.environ.get(METRICS_FILE_ENV)
    if not path:
        return False
    metrics = record["metrics"]
    # NaN and infinity are written as null: JSON has no spelling for them.
    record = {"time": time.time(), **record, "metrics": {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()  # type: ignore[union-attr]
    }}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
    return True


def update_trainjob_status(
    progress_percent: int | None = None,
    estimated_remaining_seconds: int | None = None,
    metrics: Mapping[str, float | int | str] | None = None,
) -> bool:
    """Report training progress for the job's status, as the Kubeflow SDK's ``update_trainjob_status`` does.

    On global rank 0 (other ranks return ``False``): prints ``progress 42% eta 120s loss=0.43``, which
    ``trainjob get`` / ``list`` show; in a local job the record goes to the job's metrics file. Where
    ``KUBEFLOW_TRAINER_SERVER_URL`` is set (this operator's status endpoint, or Kubeflow Trainer's) it is sent there
    as the TrainJob's ``status.trainerStatus`` (Kubeflow v2.2 shape), at most once every 5 s, as the Kubeflow SDK
    sends it (:mod:`trainjob.torch.kubeflow_status`); without it the operator reads the printed line. Like the Kubeflow SDK's, it never raises: bad values are logged and
    ``False`` returned. Returns ``True`` on rank 0 once the update is reported::

        update_trainjob_status(progress_percent=42, estimated_remaining_seconds=120, metrics={"loss": 0.43})
    """
    try:
        if global_rank() != 0:
            return False
        percent = _optional_int("progress_percent", progress_percent, 0, 100)
        remaining = _optional_int("estimated_remaining_seconds", estimated_remaining_seconds, 0, None)
        values = {str(k): _metric_value(str(k), v) for k, v in list((metrics or {}).items())[:MAX_METRICS]}
        print(progress_line(percent, remaining, values), flush=True)
        # The job's record keeps the numbers (text values are in the line): ``trainjob get`` shows numbers.
        _append_record({"progress_percent": percent, "estimated_remaining_seconds": remaining,
                        "metrics": numeric_metrics(values)})
        kubeflow_status.send(percent, remaining, values)
        return True
    except Exception as exc:  # the Kubeflow SDK's contract: safe to call anywhere, never raises
        _log.warning("update_trainjob_status: %s", exc)
        return False


def _optional_int(name: str, value: object, low: int, high: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(name, f"must be a number or None, got {value!r}")
    return int(max(low, value if high is None else min(high, value)))


def _metric_value(name: str, value: object) -> float | str:
    if isinstance(value, str):
        return value
    return _as_float(name, value)
