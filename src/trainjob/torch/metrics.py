"""Training metrics from rank 0, to stdout and to the job's metrics file.

The local backend sets ``TRAINJOB_METRICS_FILE`` in every process; each :func:`report` on global rank 0 appends
one JSON object per line, which ``trainjob get`` and ``trainjob list`` read for progress, ETA and the last loss::

    {"time": 1763712000.5, "step": 120, "total_steps": 1000, "metrics": {"loss": 0.4312, "lr": 0.001}}

Without the variable, metrics only go to stdout. Other ranks do nothing, so call it unconditionally::

    report({"loss": loss, "lr": scheduler.get_last_lr()[0]}, step=step, total_steps=total_steps)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping

import torch

from trainjob.errors import ValidationError
from trainjob.torch.env import global_rank

__all__ = ["METRICS_FILE_ENV", "report"]

METRICS_FILE_ENV = "TRAINJOB_METRICS_FILE"


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


def _format(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


def report(metrics: Mapping[str, object], step: int | None = None, total_steps: int | None = None) -> None:
    """Record ``metrics`` (name -> number or one-element tensor) for ``step`` of ``total_steps`` on rank 0."""
    step = _optional_step("step", step)
    total_steps = _optional_step("total_steps", total_steps)
    if global_rank() != 0:
        return
    values = {str(name): _as_float(str(name), value) for name, value in metrics.items()}
    progress = "" if step is None else f"step {step}" + ("" if total_steps is None else f"/{total_steps}") + " "
    print(progress + " ".join(f"{k}={_format(v)}" for k, v in values.items()), flush=True)
    path = os.environ.get(METRICS_FILE_ENV)
    if not path:
        return
    # NaN and infinity are written as null: JSON has no spelling for them.
    record = {
        "time": time.time(),
        "step": step,
        "total_steps": total_steps,
        "metrics": {k: (v if math.isfinite(v) else None) for k, v in values.items()},
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
