"""The stall watchdog's rules, for both backends: when a running job that makes no progress has stalled, and what
follows.

Progress is a report from rank 0 (``trainjob.torch.report`` or ``update_trainjob_status``: :mod:`trainjob.progress`).
The watchdog is armed by the first report of each run of the node group: before it, nothing says how fast the job
goes (start-up, data loading and compilation take what they take), and a job that never reports is not watched.
Once armed, the job has stalled when no report came for longer than its limit (:meth:`ProgressClock.overdue`):

=====================================  ==========================================================================
``trainjob/stall-timeout``             the limit
=====================================  ==========================================================================
not set                                10 x the longest interval between two reports so far, at least 60 s
                                       (:data:`INTERVAL_FACTOR`, :data:`FLOOR_SECONDS`): checkpoints and
                                       evaluations that ran between reports raise it
``600``, ``90s``, ``10m``, ``1h30m``   exactly that, whatever the step times
``off``                                none: the job is not watched
=====================================  ==========================================================================

What follows a stall is ``trainjob/stall-action``:

===========  ===================================================================================================
``restart``  stop the node group and start it again; the training script resumes from its checkpoint. Restarts
             count against ``elasticPolicy.maxRestarts``; a stall with none left fails the job. Refused on a job
             without restarts (``maxRestarts`` unset or 0). On Kubernetes the pods are evicted and the Job
             controller replaces them, and the budget is the JobSet's ``failurePolicy.maxRestarts``, shared with
             its own restarts
``fail``     stop the nodes; the job fails with reason ``Stalled``
not set      ``restart`` for a job with restarts (``elasticPolicy.maxRestarts >= 1``; on Kubernetes
             ``failurePolicy.maxRestarts >= 1``, as the built-in runtimes have), else ``fail``: what a failed node does
===========  ===================================================================================================

Both annotations are read from the TrainJob, else from its runtime (so a runtime can set them for all its jobs)::

    metadata:
      annotations:
        trainjob/stall-timeout: "10m"
        trainjob/stall-action: fail

Before it acts, a backend collects every rank's Python stacks and names the ranks that are not in the collective
their peers wait in, and the frame they are in (:mod:`trainjob.backends.stacks`), in a ``Stalled`` event and the
job's message.

>>> policy = stall_policy({"trainjob/stall-timeout": "90s"})
>>> policy.timeout, policy.action
(90.0, 'fail')
>>> clock = ProgressClock()
>>> clock.saw([100.0, 102.0, 103.0])
>>> clock.overdue(StallPolicy(), now=160.0) is None, clock.overdue(StallPolicy(), now=164.0)
(True, (61.0, 60.0))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainjob.constants import (
    STALL_ACTION_ANNOTATION,
    STALL_FLOOR_SECONDS,
    STALL_INTERVAL_FACTOR,
    STALL_TIMEOUT_ANNOTATION,
)
from trainjob.errors import ValidationError

if TYPE_CHECKING:
    from trainjob.backends.base import CheckedJob

__all__ = [
    "FLOOR_SECONDS",
    "INTERVAL_FACTOR",
    "STALL_ACTIONS",
    "ProgressClock",
    "StallPolicy",
    "checked_stall_policy",
    "dump_setting",
    "parse_stall_timeout",
    "stall_policy",
]

#: The least limit derived from a job's own pace.
FLOOR_SECONDS = STALL_FLOOR_SECONDS
#: A derived limit is this many times the longest interval seen between two reports.
INTERVAL_FACTOR = STALL_INTERVAL_FACTOR
STALL_ACTIONS = ("restart", "fail")
_DURATION = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$")
_ACCEPTED_TIMEOUTS = 'a duration ("600" seconds, "90s", "10m", "1h30m") greater than 0, or "off"'


@dataclass(frozen=True)
class StallPolicy:
    """A job's stall settings: ``timeout`` set explicitly (``None``: derived from the job's pace), ``watched``
    (``False``: ``stall-timeout: off``), ``action`` ``fail`` or ``restart``."""

    timeout: float | None = None
    watched: bool = True
    action: str = "fail"

    def limit(self, longest_interval: float | None) -> float | None:
        """Seconds without a report that make a stall, given the longest interval between reports seen so far."""
        if not self.watched:
            return None
        if self.timeout is not None:
            return self.timeout
        return max(FLOOR_SECONDS, INTERVAL_FACTOR * (longest_interval or 0.0))

    def explain(self, longest_interval: float | None) -> str:
        """Where the limit comes from, for messages: ``trainjob/stall-timeout`` or the job's pace."""
        if self.timeout is not None:
            return STALL_TIMEOUT_ANNOTATION
        derived = INTERVAL_FACTOR * (longest_interval or 0.0)
        if derived <= FLOOR_SECONDS:
            return f"the floor; reports came at most {longest_interval or 0.0:.3g} s apart"
        return f"{INTERVAL_FACTOR:g} x the longest interval between reports, {longest_interval:.3g} s"

    def to_dict(self) -> dict[str, Any]:
        return {"timeout": self.timeout, "watched": self.watched, "action": self.action}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> StallPolicy:
        return cls(**dict(data)) if data else cls()


def dump_setting(policy: StallPolicy) -> str:
    """``TRAINJOB_STALL_DUMP`` for a job watched by ``policy``: half its explicit limit, ``auto`` (half the derived
    rule, :func:`trainjob.stall_dumps.dump_after`), or ``off``."""
    if not policy.watched:
        return "off"
    return "auto" if policy.timeout is None else f"{policy.timeout / 2:g}"


def parse_stall_timeout(value: str, field: str = f"metadata.annotations[{STALL_TIMEOUT_ANNOTATION}]") -> float | None:
    """Seconds from ``600``, ``90s``, ``10m``, ``1h30m``; ``None`` for ``off``. ``ValidationError`` on ``field``.

    >>> parse_stall_timeout("1h30m"), parse_stall_timeout("off")
    (5400.0, None)
    """
    text = str(value).strip().lower()
    if text == "off":
        return None
    seconds: float | None = None
    try:
        seconds = float(text)
    except ValueError:
        match = _DURATION.match(text)
        if text and match and any(match.groupdict().values()):
            seconds = sum(float(match[unit] or 0) * factor for unit, factor in (("h", 3600), ("m", 60), ("s", 1)))
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise ValidationError(field, f"must be {_ACCEPTED_TIMEOUTS}, got {value!r}")
    return seconds


def stall_policy(
    annotations: Mapping[str, str] | None,
    runtime_annotations: Mapping[str, str] | None = None,
    *,
    max_restarts: int = 0,
    runtime_name: str = "the runtime",
) -> StallPolicy:
    """The stall settings of a job with ``annotations`` on a runtime with ``runtime_annotations`` (the job's win);
    ``max_restarts`` is the job's restart budget (``elasticPolicy.maxRestarts``). ``ValidationError`` naming the
    annotation (and the runtime, when it came from there) and what is accepted."""
    job, runtime = annotations or {}, runtime_annotations or {}

    def pick(key: str) -> tuple[str | None, str]:
        if key in job:
            return job[key], f"metadata.annotations[{key}]"
        if key in runtime:
            return runtime[key], f"{runtime_name}: metadata.annotations[{key}]"
        return None, ""

    timeout_text, timeout_field = pick(STALL_TIMEOUT_ANNOTATION)
    timeout = parse_stall_timeout(timeout_text, timeout_field) if timeout_text is not None else None
    watched = timeout_text is None or timeout is not None
    action_text, action_field = pick(STALL_ACTION_ANNOTATION)
    if action_text is None:
        action = "restart" if max_restarts >= 1 else "fail"
    else:
        action = str(action_text).strip().lower()
        if action not in STALL_ACTIONS:
            raise ValidationError(action_field, f"must be restart or fail, got {action_text!r}")
        if action == "restart" and max_restarts < 1:
            raise ValidationError(
                action_field,
                "restart needs restarts to spend: set the runtime's elasticPolicy.maxRestarts to 1 or more, "
                "or use fail",
            )
    return StallPolicy(timeout=timeout, watched=watched, action=action)


def checked_stall_policy(checked: CheckedJob) -> StallPolicy:
    """The stall settings of a job as a backend checked it: its annotations, its runtime's, its restart budget."""
    runtime, elastic = checked.runtime, checked.plan.elastic
    return stall_policy(
        checked.trainjob.metadata.annotations,
        runtime.metadata.annotations if runtime is not None else None,
        max_restarts=elastic.max_restarts if elastic is not None else 0,
        runtime_name=f"{runtime.kind} {runtime.metadata.name}" if runtime is not None else "the runtime",
    )


class ProgressClock:
    """When the job last reported and the longest interval between its reports, for one run of the node group.

    ``saw`` takes the times of new reports (Unix seconds, as the reports carry them); ``reset`` disarms it until
    the next report (a restarted or resized node group, or a stall already handled)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.longest: float | None = None

    def saw(self, times: Iterable[float]) -> None:
        for when in times:
            if self.last is not None and when >= self.last:
                self.longest = max(self.longest or 0.0, when - self.last)
            self.last = when if self.last is None else max(self.last, when)

    def reset(self) -> None:
        self.last = None
        self.longest = None

    def overdue(self, policy: StallPolicy, now: float) -> tuple[float, float] | None:
        """``(seconds since the last report, the limit)`` once the job has been silent past its limit, else
        ``None`` (not armed yet, not watched, or in time). A limit derived from the job's pace needs two reports
        (one interval) first: a job that reported once has shown no pace to hold it to."""
        if self.last is None or (policy.timeout is None and self.longest is None):
            return None
        limit = policy.limit(self.longest)
        silent = now - self.last
        if limit is None or silent <= limit:
            return None
        return silent, limit
