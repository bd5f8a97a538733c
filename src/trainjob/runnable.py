"""A clock for limits that guard against a hang, not against slowness: the time a group of processes could run.

On a machine busier than its cores (test sessions side by side, a control plane beside its jobs) a process may wait
for a CPU for seconds at a time. A wall-clock limit then ends work that was only waiting for its turn. The limits
that count :class:`RunnableClock` end a hang at the same time as before (blocked processes do not wait for a CPU),
and give processes that queue for the cores the time they could not use::

    clock = RunnableClock(lambda: [proc.pid])
    while proc.poll() is None and clock.read() < 30:
        time.sleep(0.1)
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable

#: However busy the machine, a limit counted by :class:`RunnableClock` ends by this many times its length.
MAX_STRETCH = 8.0
#: How often :class:`RunnableTimeline` reads the processes' schedstat, and how many readings it keeps (a day's).
TIMELINE_SAMPLE_SECONDS = 1.0
TIMELINE_SAMPLES = 86_400


def _run_delay(pid: int) -> float | None:
    """Seconds the process's main thread has spent runnable but waiting for a CPU (Linux's schedstat), or None."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class RunnableClock:
    """Seconds since start that a group of processes could use: wall-clock time less the time the most-starved of
    them spent runnable and waiting for a CPU. Processes that are all blocked (a hang on a collective, a sleep)
    leave the clock running at wall-clock speed; processes that queue for the cores slow it down. It never runs
    slower than 1/:data:`MAX_STRETCH` of wall-clock time. Where schedstat is missing it is the wall clock.

    ``pids`` returns the processes to watch at each reading (the live ranks, a launcher's process tree)."""

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids
        self._last = time.monotonic()
        self._delays = self._sample()
        self.elapsed = 0.0

    def _sample(self) -> dict[int, float]:
        delays = {pid: _run_delay(pid) for pid in self._pids()}
        return {pid: delay for pid, delay in delays.items() if delay is not None}

    def read(self) -> float:
        now = time.monotonic()
        wall = now - self._last
        self._last = now
        delays = self._sample()
        waited = max((delay - self._delays[pid] for pid, delay in delays.items() if pid in self._delays), default=0.0)
        self._delays = delays
        self.elapsed += max(wall - waited, wall / MAX_STRETCH)
        return self.elapsed


class RunnableTimeline:
    """Wall-clock times (Unix seconds) mapped to the seconds the processes ``pids`` returns could run.

    ``sample(now)`` is called as time passes (at most every :data:`TIMELINE_SAMPLE_SECONDS` it reads them);
    ``elapsed(since, now)`` is the runnable time between two wall-clock times: wall-clock speed outside the readings,
    interpolated between them. Without ``pids`` it is the wall clock."""

    def __init__(self, pids: Callable[[], Iterable[int]] | None = None) -> None:
        self.clock = RunnableClock(pids) if pids is not None else None
        self.times: list[float] = []
        self.runnable: list[float] = []

    def sample(self, now: float) -> None:
        if self.clock is None or (self.times and now - self.times[-1] < TIMELINE_SAMPLE_SECONDS):
            return
        if self.times and now < self.times[-1]:  # the wall clock was set back: start the readings again
            self.times, self.runnable = [], []
        self.times.append(now)
        self.runnable.append(self.clock.read())
        if len(self.times) > TIMELINE_SAMPLES:
            del self.times[: len(self.times) - TIMELINE_SAMPLES]
            del self.runnable[: len(self.runnable) - TIMELINE_SAMPLES]

    def at(self, when: float) -> float:
        """The runnable clock's reading at wall-clock time ``when``."""
        times, runnable = self.times, self.runnable
        if not times:
            return when
        if when <= times[0]:
            return runnable[0] - (times[0] - when)
        if when >= times[-1]:
            return runnable[-1] + (when - times[-1])
        i = bisect.bisect_right(times, when)
        t0, t1, r0, r1 = times[i - 1], times[i], runnable[i - 1], runnable[i]
        return r0 + (r1 - r0) * (when - t0) / (t1 - t0) if t1 > t0 else r0

    def elapsed(self, since: float, now: float) -> float:
        return self.at(now) - self.at(since)
