"""Training progress, from a training process to a job's status: the record, the log line, ``trainerStatus``.

Rank 0 reports progress with :func:`trainjob.torch.report` or the Kubeflow SDK's
:func:`~trainjob.torch.metrics.update_trainjob_status`. Each call prints one line and, in a local job, appends
one JSON record to ``TRAINJOB_METRICS_FILE``:

==========================  =====================================================================================
call                        line on stdout, then record
``report``                  ``step 120/1000 loss=0.4312 lr=0.001``
                            ``{"time": t, "step": 120, "total_steps": 1000, "metrics": {"loss": 0.4312, ...}}``
``update_trainjob_status``  ``progress 42% eta 120s loss=0.4312``
                            ``{"time": t, "progress_percent": 42, "estimated_remaining_seconds": 120,
                            "metrics": {"loss": 0.4312}}``
==========================  =====================================================================================

The local backend keeps the records; on Kubernetes, the lines of node-0's log are the records
(:func:`records_from_log`, read by :mod:`trainjob.backends.kubernetes.progress`). Either way the job's progress is
:func:`progress_of_records`, shown by ``trainjob get`` / ``list`` and written as Kubeflow Trainer's
``status.trainerStatus`` (the v2.2 shape, :func:`trainer_status`)::

    {"progressPercentage": 42, "estimatedRemainingSeconds": 120,
     "metrics": [{"name": "loss", "value": "0.4312"}], "lastUpdatedTime": "2026-11-23T09:23:48Z"}

A ``progress`` record says everything about progress (a field it leaves out is unknown from then on, as a
Kubeflow status update replaces the previous one); a ``step`` record gives the percentage as step / total steps and
the time left at the rate seen since the first step record.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainjob.rootcause import strip_rank_prefixes


@dataclass
class Progress:
    """Training progress from what rank 0 reports (``trainjob.torch.report``, ``update_trainjob_status``)."""

    step: int | None = None
    total_steps: int | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    updated: datetime | None = None
    #: Seconds left: as reported (``update_trainjob_status``), else at the step rate observed so far.
    eta_seconds: float | None = None
    #: Percent done as reported (``update_trainjob_status(progress_percent=...)``); else from the steps.
    percent: float | None = None

    @property
    def fraction(self) -> float | None:
        """How much is done, 0 to 1: the reported percentage, else step / total steps; ``None`` when unknown."""
        if self.percent is not None:
            return max(0.0, min(1.0, self.percent / 100))
        if self.step is None or not self.total_steps:
            return None
        return min(1.0, self.step / self.total_steps)


#: Kubeflow Trainer's limits on ``trainerStatus.metrics``: entries, and characters of a name or a value.
MAX_METRICS = 256
MAX_METRIC_CHARS = 64
_INT32_MAX = 2**31 - 1

_PAIR = r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S+)'
_PAIRS = rf"((?: {_PAIR})*)"
_STEP_LINE = re.compile(r"^step (\d+)(?:/(\d+))?" + _PAIRS + "$")
_PROGRESS_LINE = re.compile(r"^progress (?:(\d{1,3})%|-)(?: eta (\d+)s)?" + _PAIRS + "$")
# ``kubectl logs --timestamps`` (and the API's ``timestamps=true``) put an RFC 3339 time before each line.
_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) ")


def format_value(value: object) -> str:
    """A metric value as a line shows it: ``0.4312``, ``nan``, or a string without spaces."""
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c == "=" for c in text) else text


def _pairs(metrics: Mapping[str, object]) -> str:
    return "".join(f" {name}={format_value(value)}" for name, value in metrics.items())


def step_line(step: int | None, total_steps: int | None, metrics: Mapping[str, object]) -> str:
    """What ``report`` prints: ``step 120/1000 loss=0.4312`` (``loss=0.4312`` without a step)."""
    if step is None:
        return _pairs(metrics).lstrip()
    return f"step {step}" + ("" if total_steps is None else f"/{total_steps}") + _pairs(metrics)


def progress_line(percent: int | None, remaining: int | None, metrics: Mapping[str, object]) -> str:
    """What ``update_trainjob_status`` prints: ``progress 42% eta 120s loss=0.4312`` (``progress -`` if unknown)."""
    head = "progress " + ("-" if percent is None else f"{percent}%")
    return head + ("" if remaining is None else f" eta {remaining}s") + _pairs(metrics)


def _parse_value(text: str) -> float | str | None:
    if text.startswith('"'):
        try:
            return str(json.loads(text))
        except ValueError:
            return text
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else None


def _parse_pairs(text: str) -> dict[str, float | str | None]:
    return {match[1]: _parse_value(match[2]) for match in re.finditer(_PAIR, text)}


def parse_line(line: str) -> dict[str, Any] | None:
    """The record (without its time) a ``step ...`` or ``progress ...`` line stands for; ``None`` for other lines."""
    if match := _STEP_LINE.match(line):
        return {"step": int(match[1]), "total_steps": int(match[2]) if match[2] else None,
                "metrics": _parse_pairs(match[3])}
    if match := _PROGRESS_LINE.match(line):
        return {"progress_percent": min(100, int(match[1])) if match[1] else None,
                "estimated_remaining_seconds": int(match[2]) if match[2] else None,
                "metrics": _parse_pairs(match[3])}
    return None


def stamped_lines(text: str) -> Iterator[tuple[str, str]]:
    """``(timestamp, line)`` for each line of a log read with timestamps, rank prefixes (``[rank0]: ``) removed;
    lines without a time are skipped."""
    for raw in text.splitlines():
        stamp = _TIMESTAMP.match(raw)
        if stamp is not None:
            yield stamp[1], strip_rank_prefixes(raw[stamp.end() :])


def stamp_seconds(stamp: str) -> float:
    """Unix time of an RFC 3339 timestamp as the API server writes them (``Z``, up to nanoseconds)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def records_from_log(text: str) -> list[dict[str, Any]]:
    """The progress records in a log read with timestamps (lines without a time are skipped: no record is
    useful without one); rank prefixes (``[rank0]: ``) are allowed."""
    records = []
    for stamp, line in stamped_lines(text):
        record = parse_line(line)
        if record is not None:
            record["time"] = stamp_seconds(stamp)
            records.append(record)
    return records


def remaining_seconds(
    step: int | None, total: int | None, first_step: int | None, first_time: float | None, last_time: float | None
) -> float | None:
    """Seconds left for ``total - step`` steps at the rate seen between the first and the last step record."""
    if step is None or not total or first_step is None or first_time is None or last_time is None:
        return None
    if step <= first_step or last_time <= first_time:
        return None
    return max(0.0, (total - step) * (last_time - first_time) / (step - first_step))


def _number(value: object) -> float | None:
    value = _parse_value(value) if isinstance(value, str) else value
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def numeric_metrics(metrics: Mapping[str, object] | None) -> dict[str, float | None]:
    """The metrics that are numbers (``None`` stands for NaN); text values are left to the logs."""
    out: dict[str, float | None] = {}
    for name, value in (metrics or {}).items():
        number = _number(value)
        if number is not None or value is None or str(value).lower() == "nan":
            out[str(name)] = number
    return out


def progress_of_records(records: Iterable[Mapping[str, Any]]) -> Progress | None:
    """The progress the records say (oldest first), as ``trainjob get`` shows it; ``None`` without records."""
    progress: Progress | None = None
    first: tuple[int, float] | None = None
    for record in records:
        progress = progress or Progress()
        progress.updated = datetime.fromtimestamp(record["time"], UTC)
        progress.metrics = numeric_metrics(record.get("metrics"))
        if "progress_percent" in record:
            progress.percent = record.get("progress_percent")
            progress.eta_seconds = record.get("estimated_remaining_seconds")
            continue
        progress.step, progress.total_steps = record.get("step"), record.get("total_steps")
        if first is None and progress.step is not None:
            first = (progress.step, record["time"])
        progress.percent = None
        progress.eta_seconds = remaining_seconds(
            progress.step, progress.total_steps, *(first or (None, None)), record["time"]
        )
    return progress


def _status_value(value: object) -> str:
    return value if isinstance(value, str) else format_value(value)


def trainer_status(progress: Progress | None, metrics: Mapping[str, object] | None = None) -> dict[str, Any] | None:
    """Kubeflow Trainer's ``status.trainerStatus`` (v2.2) for ``progress``; ``metrics`` (default: the progress's)
    may hold strings, as Kubeflow's do. ``None`` when nothing was reported."""
    if progress is None or progress.updated is None:
        return None
    status: dict[str, Any] = {}
    fraction = progress.fraction
    if fraction is not None:
        status["progressPercentage"] = max(0, min(100, int(fraction * 100)))
    if progress.eta_seconds is not None:
        status["estimatedRemainingSeconds"] = max(0, min(_INT32_MAX, int(progress.eta_seconds)))
    values = progress.metrics if metrics is None else metrics
    entries = [
        {"name": str(name)[:MAX_METRIC_CHARS], "value": _status_value(value)[:MAX_METRIC_CHARS]}
        for name, value in list(values.items())[:MAX_METRICS]
        if value is not None and str(name)
    ]
    if entries:
        status["metrics"] = entries
    status["lastUpdatedTime"] = progress.updated.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return status


def progress_of_trainer_status(status: Mapping[str, Any] | None) -> Progress | None:
    """``status.trainerStatus`` (Kubeflow v2.2 shape) as a :class:`Progress` (the SDK's, :mod:`trainjob.sdk.types`)."""
    if not status or not status.get("lastUpdatedTime"):
        return None
    updated = datetime.fromisoformat(str(status["lastUpdatedTime"]).replace("Z", "+00:00"))
    percent = status.get("progressPercentage")
    return Progress(
        percent=float(percent) if isinstance(percent, int | float) else None,
        metrics=numeric_metrics({m["name"]: m.get("value") for m in status.get("metrics") or [] if m.get("name")}),
        updated=updated,
        eta_seconds=status.get("estimatedRemainingSeconds"),
    )
