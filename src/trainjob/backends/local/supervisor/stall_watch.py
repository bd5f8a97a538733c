"""The supervisor's stall watch: a running job that stops making progress is caught and the rank it waits for
named, by the rules of :mod:`trainjob.backends.stall`.

The supervisor feeds it the times of the progress records it ingests and asks :meth:`StallWatch.check` on every
round of its watch. A job that reports is held to its reports; one that does not, to its collectives: every
rank's ``sitecustomize`` writes when its collectives last completed and since when one waits
(``stacks/collectives-rank-<RANK>-<pid>.json``, read by :func:`rank_collectives`). Once the job is past its limit,
the stall watch dumps every rank's stacks (:mod:`~trainjob.backends.local.stacks`), writes them all to
``stall-stacks.txt`` in the job's directory, and returns the :class:`Stall`, whose message names the ranks not in
the collective their peers wait in and the frame they are in::

    no progress for 4.3 s (limit 4.0 s: trainjob/stall-timeout): rank 1 is not in the all_reduce that rank 0 waits
    in: rank 1 is in __getitem__ (train.py:21); every rank's stacks: .../stall-stacks.txt

The supervisor acts on :attr:`Stall.action`: ``fail`` or ``restart`` (a ``Stalled`` event and the job's message,
then the job fails or its node group restarts), or ``warn`` (a stall of a job that does not report, with no
``trainjob/stall-action``: a ``Stalled`` Warning event and the job's message, again every limit while the stall
lasts, then a :class:`StallEnded` once collectives complete again). The stall watch is disarmed until the next report
or collective whenever the node group starts again or changes size (:meth:`StallWatch.reset`).

A stall is a hang, not slowness: the silence is counted in the time the job's processes could run
(:class:`~trainjob.runnable.RunnableTimeline`, by :class:`~trainjob.runnable.RunnableClock`). Ranks that are blocked (a hang in a
collective, a sleep) leave it at wall-clock speed; on a machine busier than its cores, the seconds a rank waited for a
CPU are not counted against it (up to :data:`~trainjob.runnable.MAX_STRETCH` times the limit). A message whose count
differs from the wall clock says both.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainjob.backends.local.stacks import STACKS_DIR, dump_stacks
from trainjob.backends.stacks import StuckRanks, find_stuck_ranks, format_stacks
from trainjob.backends.stall import (
    RUNS_ON,
    ProgressClock,
    RankCollectives,
    StallPolicy,
    collective_stall_message,
    collectives_overdue,
    collectives_silence,
    seconds_text,
)
from trainjob.runnable import RunnableTimeline

__all__ = ["STACKS_FILE", "Stall", "StallEnded", "StallWatch", "rank_collectives"]

#: Where, in the job's directory, the stacks of a stall are kept.
STACKS_FILE = "stall-stacks.txt"
#: How often the ranks' collectives files are read (the ranks rewrite them at most every half second).
COLLECTIVES_READ_SECONDS = 0.5


@dataclass
class Stall:
    """A stall: how long the job was silent, its limit, what the stacks showed, the message that says it, and what
    follows (``fail``, ``restart`` or ``warn``)."""

    silent: float
    limit: float
    stuck: StuckRanks
    message: str
    action: str = "fail"


@dataclass
class StallEnded:
    """Collectives complete again after a stall that was only warned of: how long it lasted, and the sentence."""

    lasted: float
    message: str


def rank_collectives(job_dir: Path) -> list[RankCollectives]:
    """What the live ranks of the job wrote about their collectives, in rank order (a rank of an earlier run of
    the node group is gone: its file is removed)."""
    found: dict[int, RankCollectives] = {}
    directory = job_dir / STACKS_DIR
    for path in sorted(directory.glob("collectives-rank-*.json")) if directory.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads(path.read_text(encoding="utf-8"))
            # A rank in a container names its pid there; a new run's ranks write files of their own either way.
            if not psutil.pid_exists(int(data["pid"])):
                path.unlink()
                continue
            rank = int(data["rank"])
            found[rank] = RankCollectives(rank, data["completed_at"], data["waiting_since"])
    return [found[rank] for rank in sorted(found)]


class StallWatch:
    """Watches one job's progress: ``StallWatch(job_dir, spec.stall, pids)``, ``pids`` returning the job's
    processes (the silence is counted in the time they could run; without it, in wall-clock time)."""

    def __init__(self, job_dir: Path, policy: StallPolicy, pids: Callable[[], Iterable[int]] | None = None) -> None:
        self.job_dir = job_dir
        self.policy = policy
        self.timeline = RunnableTimeline(pids)
        self.clock = ProgressClock()
        self.next_read = 0.0
        #: The stall of a job that does not report that is being warned of: when it began, and warnings so far.
        self.warned_since: float | None = None
        self.warnings = 0

    def saw(self, times: Iterable[float]) -> None:
        """Progress was reported at ``times`` (Unix seconds)."""
        self.clock.saw(times)

    def reset(self) -> None:
        """Disarm until the next report: the node group started again or changed size."""
        self.clock.reset()
        self.warned_since, self.warnings = None, 0

    def check(self, now: float) -> Stall | StallEnded | None:
        """The stall, once the job is past its limit (stacks collected); a warned stall's end; else ``None``."""
        self.timeline.sample(now)
        if self.clock.last is not None:
            return self._check_reports(now)
        if now < self.next_read:
            return None
        self.next_read = now + COLLECTIVES_READ_SECONDS
        return self._check_collectives(now)

    def _check_reports(self, now: float) -> Stall | None:
        last = self.clock.last
        assert last is not None
        overdue = self.clock.overdue(self.policy, last + self.timeline.elapsed(last, now))
        if overdue is None:
            return None
        silent, limit = overdue
        why = self.policy.explain(self.clock.longest)
        self.clock.reset()  # one stall is handled once
        stuck, kept = self._stacks()
        message = (f"no progress for {seconds_text(silent)}{_wall_text(silent, now - last)} "
                   f"(limit {seconds_text(limit)}: {why}): {stuck.summary}{kept}")
        return Stall(silent=silent, limit=limit, stuck=stuck, message=message, action=self.policy.action)

    def _check_collectives(self, now: float) -> Stall | StallEnded | None:
        seen = rank_collectives(self.job_dir)
        # the ranks' times on the runnable clock's axis: a silence is the time they could have run in it
        at = self.timeline.at
        ranks = [RankCollectives(r.rank, None if r.completed_at is None else at(r.completed_at),
                                 None if r.waiting_since is None else at(r.waiting_since)) for r in seen]
        now_wall, now = now, at(now)
        overdue = collectives_overdue(ranks, self.policy, now)
        if overdue is None:
            if self.warned_since is None:
                return None
            lasted = now - self.warned_since
            self.warned_since, self.warnings = None, 0
            return StallEnded(lasted, f"collectives complete again, after a stall of {seconds_text(lasted)}")
        silent, limit = overdue
        if self.warnings and silent <= limit * (self.warnings + 1):
            return None  # warned of already: again once it has lasted another limit
        action = self.policy.collective_action
        stuck, kept = self._stacks()
        wall = collectives_silence(seen, now_wall) or silent
        message = collective_stall_message(ranks, silent, limit, self.policy, f"{stuck.summary}{kept}",
                                           _wall_text(silent, wall))
        if action == "warn":
            self.warned_since = self.warned_since or now - silent
            self.warnings += 1
            message += RUNS_ON
        else:
            self.reset()  # one stall is handled once
        return Stall(silent=silent, limit=limit, stuck=stuck, message=message, action=action)

    def _stacks(self) -> tuple[StuckRanks, str]:
        """Every rank's stacks, kept in :data:`STACKS_FILE`: what they show, and where they are kept."""
        stacks = dump_stacks(self.job_dir)
        saved = self.job_dir / STACKS_FILE
        try:
            saved.write_text(format_stacks(stacks), encoding="utf-8")
            kept = f"; every rank's stacks: {saved}"
        except OSError:
            kept = ""
        return find_stuck_ranks(stacks), kept


def _wall_text(counted: float, wall: float) -> str:
    """`` (30.2 s of wall-clock time, the ranks waiting for a CPU)`` when the runnable count is well below the wall
    clock's, else nothing.

    >>> _wall_text(5.1, 30.2)
    ' (30.2 s of wall-clock time, the ranks waiting for a CPU)'
    >>> _wall_text(5.1, 5.3)
    ''
    """
    if wall <= counted * 1.1 + 0.5:
        return ""
    return f" ({seconds_text(wall)} of wall-clock time, the ranks waiting for a CPU)"
