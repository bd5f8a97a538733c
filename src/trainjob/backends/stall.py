"""The stall watch's rules, for both backends: when a running job that makes no progress has stalled, and what
follows.

Two signals say a job makes progress:

- **Reports** from rank 0 (``trainjob.torch.report`` or ``update_trainjob_status``: :mod:`trainjob.progress`). The
  first report of each run of the node group arms the stall watch on them: before it, nothing says how fast the job
  goes (start-up, data loading and compilation take what they take). Once armed, the job has stalled when no report
  came for longer than its limit (:meth:`ProgressClock.overdue`). Where reports come, they are the only signal.
- **Collectives**, for a job that does not report: each rank says when a collective it took part in last completed
  and since when one it entered has been waiting (:class:`RankCollectives`; on the local backend every rank's
  ``sitecustomize`` reads it from torch's flight recorder, which sees the collectives DDP issues from C++ too:
  :mod:`trainjob.backends.local.worker_site.sitecustomize`). The job has stalled when a rank has waited in a
  collective longer than the limit while no collective completed on any rank (:func:`collectives_overdue`). A job
  whose ranks started no collective yet, or in which no rank waits (every rank computing, however long), is not
  stalled: rank 0 evaluating while the others wait at a barrier is a stall only once it lasts past the limit.

=====================================  ==============================================  =============================
``trainjob/stall-timeout``             the limit of a job that reports                 of a job that does not report
=====================================  ==============================================  =============================
not set                                10 x the longest interval between two reports   5 minutes
                                       so far, at least 60 s: checkpoints and          (:data:`COLLECTIVE_LIMIT`)
                                       evaluations that ran between reports raise it
                                       (:data:`INTERVAL_FACTOR`,
                                       :data:`FLOOR_SECONDS`)
``600``, ``90s``, ``10m``, ``1h30m``   exactly that, whatever the step times           exactly that
``off``                                none: the job is not watched                    none
=====================================  ==============================================  =============================

Five minutes, for a job that does not report, because nothing says how long its ranks may wait for one another by
design (rank 0 evaluating, saving a checkpoint or preparing data while the others wait at a barrier often takes
minutes), yet it is half NCCL's own timeout (10 minutes; gloo's is 30), so the stuck rank is named before the
collective times out and blames a rank that only waited. By default such a stall is only announced (below), so a
phase that outlasts it by design costs a warning, not the job.

What follows a stall is ``trainjob/stall-action``:

===========  ===================================================================================================
``restart``  stop the node group and start it again; the training script resumes from its checkpoint. Restarts
             count against ``elasticPolicy.maxRestarts``; a stall with none left fails the job. Refused on a job
             without restarts (``maxRestarts`` unset or 0). On Kubernetes the pods are evicted and the Job
             controller replaces them, and the budget is the JobSet's ``failurePolicy.maxRestarts``, shared with
             its own restarts
``fail``     stop the nodes; the job fails with reason ``Stalled``
not set      a job that reports: ``restart`` for a job with restarts (``elasticPolicy.maxRestarts >= 1``; on
             Kubernetes ``failurePolicy.maxRestarts >= 1``, as the built-in runtimes have), else ``fail``, what a
             failed node does. A job that does not report: a ``Stalled`` Warning event (and the job's message),
             repeated every limit while the stall lasts; the job runs on, and a ``StallEnded`` event follows when
             collectives complete again (:attr:`StallPolicy.collective_action`)
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
>>> policy.timeout, policy.action, policy.collective_action
(90.0, 'fail', 'warn')
>>> clock = ProgressClock()
>>> clock.saw([100.0, 102.0, 103.0])
>>> clock.overdue(StallPolicy(), now=160.0) is None, clock.overdue(StallPolicy(), now=164.0)
(True, (61.0, 60.0))
>>> ranks = [RankCollectives(0, completed_at=100.0, waiting_since=101.0), RankCollectives(1, 100.0, None)]
>>> collectives_overdue(ranks, policy, now=150.0), collectives_overdue(ranks, policy, now=192.0)
(None, (91.0, 90.0))
"""

from __future__ import annotations

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
from trainjob.units import duration_seconds

if TYPE_CHECKING:
    from trainjob.backends.base import CheckedJob

__all__ = [
    "COLLECTIVE_LIMIT",
    "FLOOR_SECONDS",
    "INTERVAL_FACTOR",
    "RUNS_ON",
    "STALL_ACTIONS",
    "ProgressClock",
    "RankCollectives",
    "StallPolicy",
    "checked_stall_policy",
    "collective_stall_message",
    "collectives_overdue",
    "collectives_silence",
    "dump_setting",
    "parse_stall_timeout",
    "ranks_text",
    "seconds_text",
    "stall_policy",
]

#: The least limit derived from a job's own pace.
FLOOR_SECONDS = STALL_FLOOR_SECONDS
#: A derived limit is this many times the longest interval seen between two reports.
INTERVAL_FACTOR = STALL_INTERVAL_FACTOR
#: The limit for a job that does not report: how long a rank may wait in a collective while none completes.
COLLECTIVE_LIMIT = 300.0
STALL_ACTIONS = ("restart", "fail")
_ACCEPTED_TIMEOUTS = 'a duration ("600" seconds, "90s", "10m", "1h30m") greater than 0, or "off"'


@dataclass(frozen=True)
class StallPolicy:
    """A job's stall settings: ``timeout`` set explicitly (``None``: derived from the job's pace), ``watched``
    (``False``: ``stall-timeout: off``), ``action`` ``fail`` or ``restart``, ``action_chosen``: by
    ``trainjob/stall-action`` (else the default)."""

    timeout: float | None = None
    watched: bool = True
    action: str = "fail"
    action_chosen: bool = False

    @property
    def collective_action(self) -> str:
        """What follows a stall of a job that does not report: ``warn`` unless ``trainjob/stall-action`` chose."""
        return self.action if self.action_chosen else "warn"

    def collective_limit(self) -> float | None:
        """Seconds a rank may wait in a collective while none completes, in a job that does not report."""
        if not self.watched:
            return None
        return self.timeout if self.timeout is not None else COLLECTIVE_LIMIT

    def explain_collective(self) -> str:
        """Where the limit of a job that does not report comes from, for messages."""
        return STALL_TIMEOUT_ANNOTATION if self.timeout is not None else "the default for a job that does not report"

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
        return {"timeout": self.timeout, "watched": self.watched, "action": self.action,
                "action_chosen": self.action_chosen}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> StallPolicy:
        return cls(**dict(data)) if data else cls()


def dump_setting(policy: StallPolicy) -> str:
    """``TRAINJOB_STALL_DUMP`` for a job watched by ``policy``: half its explicit limit, ``auto`` (half the derived
    rule, :func:`trainjob.log_stacks.stacks_after`), or ``off``."""
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
        seconds = duration_seconds(text)
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
    return StallPolicy(timeout=timeout, watched=watched, action=action, action_chosen=action_text is not None)


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


@dataclass(frozen=True)
class RankCollectives:
    """What one rank's collectives did, by the clock of the machine that runs it (Unix seconds): when it last saw
    one complete (``None``: none yet) and since when one it entered has been waiting (``None``: it waits in none)."""

    rank: int
    completed_at: float | None
    waiting_since: float | None


def collectives_overdue(
    ranks: Iterable[RankCollectives], policy: StallPolicy, now: float
) -> tuple[float, float] | None:
    """``(seconds a rank has waited in a collective while none completed anywhere, the limit)`` once that passes
    the limit, else ``None`` (no rank waits, none started a collective, not watched, or in time).

    >>> waits = [RankCollectives(0, 100.0, 130.0), RankCollectives(1, 125.0, None)]
    >>> collectives_overdue(waits, StallPolicy(timeout=60.0), now=191.0)  # rank 0 waits since 130
    (61.0, 60.0)
    >>> collectives_overdue([RankCollectives(0, 100.0, None)], StallPolicy(timeout=60.0), now=1e9) is None
    True
    """
    limit = policy.collective_limit()
    silent = collectives_silence(ranks, now)
    if limit is None or silent is None:
        return None
    return (silent, limit) if silent > limit else None


def collectives_silence(ranks: Iterable[RankCollectives], now: float) -> float | None:
    """Seconds a rank has waited in a collective while none completed anywhere; ``None`` when no rank waits.

    >>> collectives_silence([RankCollectives(0, 100.0, 130.0), RankCollectives(1, 125.0, None)], now=191.0)
    61.0
    """
    ranks = list(ranks)
    waiting = [r.waiting_since for r in ranks if r.waiting_since is not None]
    if not waiting:
        return None
    completed = [r.completed_at for r in ranks if r.completed_at is not None]
    return now - max([min(waiting), *completed])


#: What a warning about a stall of a job that does not report ends with: it runs on.
RUNS_ON = "; the job runs on (trainjob/stall-action: fail or restart acts on a stall)"


def seconds_text(value: float) -> str:
    """Seconds for messages: ``12.5 s``, ``301 s``."""
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


def ranks_text(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 0, 2``."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def collective_stall_message(ranks: Iterable[RankCollectives], silent: float, limit: float, policy: StallPolicy,
                             stuck: str, wall: str = "") -> str:
    """What a stall of a job that does not report says, on both backends; ``stuck`` names the stuck ranks and
    their frames (:attr:`trainjob.backends.stacks.StuckRanks.summary`); ``wall`` follows the silence (the local
    backend's note of the wall-clock time, when it counted less).

    >>> ranks = [RankCollectives(0, 100.0, 101.0), RankCollectives(1, 100.0, None)]
    >>> collective_stall_message(ranks, 61.0, 60.0, StallPolicy(timeout=60.0), "rank 1 is in time.sleep")
    'no collective completed for 61.0 s while rank 0 waits in one (limit 60.0 s: trainjob/stall-timeout): rank 1 is in time.sleep'
    """
    waiting = sorted(r.rank for r in ranks if r.waiting_since is not None)
    return (f"no collective completed for {seconds_text(silent)}{wall} while {ranks_text(waiting)} "
            f"{'waits' if len(waiting) == 1 else 'wait'} in one (limit {seconds_text(limit)}: "
            f"{policy.explain_collective()}): {stuck}")
