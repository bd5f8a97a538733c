"""Ray Train's reports, to the job: a Ray Train callback that needs no change to the training script.

Node 0 (:mod:`trainjob.ray.node`) starts the driver with ``RAY_TRAIN_CALLBACKS`` naming
:class:`TrainjobReportCallback`, which Ray Train loads in the driver and runs in its controller, on the driver's
node. After every ``train.report`` of all workers it appends the metrics of world rank 0 as one JSON line to
``TRAINJOB_RAY_REPORTS_FILE`` (Ray loads callbacks named in ``RAY_TRAIN_CALLBACKS`` only if they are its
``ReportCallback``s, a developer API of the pinned Ray); node 0 reads the lines (:func:`read_reports`) and reports each with
:func:`trainjob.torch.report` (the step is the report's number, 1 for the first), so it reaches what the job's
other progress reaches: the ``step 3 loss=0.41`` line in node 0's log (``status.trainerStatus`` on Kubernetes),
the job's metrics file (``trainjob get``, the dashboard) and the status endpoint when the job has one.

Checkpoints stay Ray's: where they go (``storage_path``), how many are kept (``num_to_keep``) and in which order
(``checkpoint_score_attribute``) are Ray Train's to decide; the callback only passes the checkpoint's path on.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

from ray.train.v2._internal.execution.callback import ReportCallback

from trainjob.ray import REPORTS_FILE_ENV


class TrainjobReportCallback(ReportCallback):
    """Appends world rank 0's metrics of each report to ``$TRAINJOB_RAY_REPORTS_FILE`` (nothing without it)."""

    def __init__(self) -> None:
        self.path = os.environ.get(REPORTS_FILE_ENV)
        self.count = 0

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self.count += 1
        checkpoint = getattr(training_report, "checkpoint", None)
        if not self.path or not metrics:
            return
        values = {str(k): float(v) for k, v in metrics[0].items() if _is_number(v)}
        record: dict[str, Any] = {"step": self.count, "metrics": values}
        if checkpoint is not None:
            record["checkpoint"] = getattr(checkpoint, "path", str(checkpoint))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_reports(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete records of ``path`` after byte ``offset``, and the offset after them (a line still being
    written is left for the next call)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return list(_records(data[:end])), offset + end


def _records(data: bytes) -> Iterator[dict[str, Any]]:
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record
