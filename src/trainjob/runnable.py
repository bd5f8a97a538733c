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

import time
from collections.abc import Callable, Iterable

#: However busy the machine, a limit counted by :class:`RunnableClock` ends by this many times its length.
MAX_STRETCH = 8.0


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
