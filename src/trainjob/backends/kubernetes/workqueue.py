"""A work queue of object keys, as controllers use: deduplicated, delayed, retried with backoff.

A key waiting in the queue is queued once however many events arrive for it; a key being worked on is never
handed to a second worker (it is queued again when events arrived meanwhile)::

    queue = WorkQueue()
    queue.add(("default", "mnist"))               # now
    queue.add(("default", "mnist"), after=30.0)   # and in 30 s (the earlier time wins)
    await queue.run_workers(handle, workers=4)    # handle(key) -> seconds until due again, or None
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger("trainjob.operator")

Handler = Callable[[Hashable], Awaitable[float | None]]


class WorkQueue:
    """Keys due at a time; :meth:`run_workers` processes them until cancelled."""

    def __init__(self, max_backoff: float = 60.0,
                 on_take: Callable[[Hashable, float], None] | None = None) -> None:
        self._due: dict[Hashable, float] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._order = itertools.count()
        self._busy: set[Hashable] = set()
        self._requeue_when_done: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._changed = asyncio.Event()
        self.max_backoff = max_backoff
        #: Called with the key and how long it waited past its due time, when a worker takes it (metrics).
        self.on_take = on_take

    def add(self, key: Hashable, after: float = 0.0) -> None:
        """Process ``key`` in ``after`` seconds, or sooner when it is due sooner already."""
        at = time.monotonic() + max(after, 0.0)
        if key in self._due and self._due[key] <= at:
            return
        self._due[key] = at
        heapq.heappush(self._heap, (at, next(self._order), key))
        self._changed.set()

    def __len__(self) -> int:
        return len(self._due)

    async def _next(self) -> Hashable:
        while True:
            now = time.monotonic()
            while self._heap:
                at, _, key = self._heap[0]
                if self._due.get(key) != at:  # superseded by an earlier add
                    heapq.heappop(self._heap)
                    continue
                if key in self._busy:  # retried after the worker holding it finishes
                    heapq.heappop(self._heap)
                    del self._due[key]
                    self._requeue_when_done.add(key)
                    continue
                if at > now:
                    break
                heapq.heappop(self._heap)
                del self._due[key]
                self._busy.add(key)
                if self.on_take is not None:
                    self.on_take(key, now - at)
                return key
            self._changed.clear()
            timeout = self._heap[0][0] - now if self._heap else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    async def _work(self, handle: Handler) -> None:
        while True:
            key = await self._next()
            again: float | None
            try:
                again = await handle(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                again = min(0.5 * 2 ** (failures - 1), self.max_backoff)
                log.warning(
                    "reconciling %s failed (attempt %d, retrying in %.1fs): %s", key, failures, again, exc
                )
            finally:
                self._busy.discard(key)
            if key in self._requeue_when_done:
                self._requeue_when_done.discard(key)
                self.add(key)
            if again is not None:
                self.add(key, again)

    async def run_workers(self, handle: Handler, workers: int = 4) -> None:
        """Run ``workers`` concurrent workers calling ``handle(key)`` until cancelled."""
        await asyncio.gather(*(self._work(handle) for _ in range(workers)))
