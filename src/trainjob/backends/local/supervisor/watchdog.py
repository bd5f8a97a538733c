"""The supervisor's stall watchdog: a running job that stops reporting progress is caught and the rank it waits for
named, by the rules of :mod:`trainjob.backends.stall`.

The supervisor feeds it the times of the progress records it ingests and asks :meth:`StallWatchdog.check` on every
round of its watch. Once the job is silent past its limit, the watchdog dumps every rank's stacks
(:mod:`~trainjob.backends.local.stacks`), writes them all to ``stall-stacks.txt`` in the job's directory, and
returns the :class:`Stall`, whose message names the ranks not in the collective their peers wait in and the
frame they are in::

    no progress for 4.3 s (limit 4.0 s: trainjob/stall-timeout): rank 1 is not in the all_reduce that rank 0 waits
    in: rank 1 is in __getitem__ (train.py:21); every rank's stacks: .../stall-stacks.txt

The supervisor records it as a ``Stalled`` event and the job's message, then fails the job or restarts its node
group (``trainjob/stall-action``). The watchdog is disarmed until the next report whenever the node group starts
again or changes size (:meth:`StallWatchdog.reset`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainjob.backends.local.stacks import dump_stacks
from trainjob.backends.stacks import StuckRanks, find_stuck_ranks, format_stacks
from trainjob.backends.stall import ProgressClock, StallPolicy

__all__ = ["STACKS_FILE", "Stall", "StallWatchdog"]

#: Where, in the job's directory, the stacks of a stall are kept.
STACKS_FILE = "stall-stacks.txt"


@dataclass
class Stall:
    """A stall: how long the job was silent, its limit, what the stacks showed, and the message that says it."""

    silent: float
    limit: float
    stuck: StuckRanks
    message: str


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 100 else f"{value:.0f} s"


class StallWatchdog:
    """Watches one job's progress: ``StallWatchdog(job_dir, spec.stall)``."""

    def __init__(self, job_dir: Path, policy: StallPolicy) -> None:
        self.job_dir = job_dir
        self.policy = policy
        self.clock = ProgressClock()

    def saw(self, times: Iterable[float]) -> None:
        """Progress was reported at ``times`` (Unix seconds)."""
        self.clock.saw(times)

    def reset(self) -> None:
        """Disarm until the next report: the node group started again or changed size."""
        self.clock.reset()

    def check(self, now: float) -> Stall | None:
        """The stall, once the job has been silent past its limit (stacks collected); else ``None``."""
        overdue = self.clock.overdue(self.policy, now)
        if overdue is None:
            return None
        silent, limit = overdue
        why = self.policy.explain(self.clock.longest)
        self.clock.reset()  # one stall is handled once
        stacks = dump_stacks(self.job_dir)
        stuck = find_stuck_ranks(stacks)
        saved = self.job_dir / STACKS_FILE
        try:
            saved.write_text(format_stacks(stacks), encoding="utf-8")
            kept = f"; every rank's stacks: {saved}"
        except OSError:
            kept = ""
        message = f"no progress for {_seconds(silent)} (limit {_seconds(limit)}: {why}): {stuck.summary}{kept}"
        return Stall(silent=silent, limit=limit, stuck=stuck, message=message)
