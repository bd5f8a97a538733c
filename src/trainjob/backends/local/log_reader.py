"""Node logs of local jobs as readers stream them: merged across nodes by time, across rotations and restarts.

The files are the ones :mod:`trainjob.backends.local.log_writer` describes. What processes print after a
``[trainjob] node-<i> stopping: <why>`` line (torchrun's SIGTERM tracebacks) is not a crash, and readers hide it
behind one summary line.

:func:`read_logs` yields :class:`~trainjob.sdk.types.LogLine` objects, reading in chunks (memory stays bounded
whatever the log's size), merging nodes by time, following rotations and restarts while the job runs, and starting
with a ``[trainjob: N bytes of earlier output dropped]`` line when something was dropped::

    for line in read_logs(job_dir, nodes=[0, 1], follow=True, finished=lambda: job_is_done()):
        print(line)          # node-1/rank-3 | epoch 2 loss 0.41
    read_logs(job_dir, [0, 1], tail=20, since=time.time() - 300)   # the last 20 lines of the last 5 minutes
"""

from __future__ import annotations

import contextlib
import heapq
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from trainjob.backends.local.log_writer import (
    TIME_RECORD,
    TIMES_HEADER,
    TIMES_MAGIC,
    dropped_bytes,
    node_log_path,
    rotated_log_path,
    times_path,
)
from trainjob.backends.log_selection import parse_line
from trainjob.sdk.types import LogLine

_CHUNK_BYTES = 1024 * 1024
#: A longer line is shown in pieces, so one line without a break cannot take unbounded memory.
MAX_LINE_BYTES = 1024 * 1024
_TIMES_RETRY_SECONDS = 0.2
# The writer's STOP_MARKER and ATTEMPT_MARKER lines.
_STOP_MARKER = re.compile(r"^\[trainjob\] node-\d+ stopping: ")
_ATTEMPT_MARKER = re.compile(r"^\[trainjob\] node-\d+: attempt started")


def dropped_line(count: int) -> str:
    return f"[trainjob: {count} bytes of earlier output dropped]"


class _Times:
    """The write times of one open log file, read forward as its lines are read (offsets never go back)."""

    def __init__(self, log_file: IO[bytes], candidates: list[Path]) -> None:
        self.inode = _inode(log_file)
        self.candidates = candidates
        self.file: IO[bytes] | None = None
        self.next_try = 0.0
        self.buffer = b""
        self.current: float | None = None
        self.pending: tuple[int, float] | None = None

    def time_at(self, offset: int) -> float | None:
        """When the byte at ``offset`` was written (to :data:`~trainjob.backends.local.log_writer.TIME_RESOLUTION`); ``None`` when not recorded."""
        if self.file is None and not self._open():
            return self.current
        while True:
            if self.pending is None:
                self.pending = self._read_record()
                if self.pending is None:
                    break
            if self.pending[0] > offset:
                break
            self.current = self.pending[1]
            self.pending = None
        return self.current

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def _open(self) -> bool:
        now = time.monotonic()
        if now < self.next_try:
            return False
        self.next_try = now + _TIMES_RETRY_SECONDS
        for path in self.candidates:
            f = _open(path)
            if f is None:
                continue
            header = f.read(TIMES_HEADER.size)
            if len(header) == TIMES_HEADER.size and TIMES_HEADER.unpack(header) == (TIMES_MAGIC, self.inode):
                self.file = f
                return True
            f.close()
        return False

    def _read_record(self) -> tuple[int, float] | None:
        assert self.file is not None
        self.buffer += self.file.read(TIME_RECORD.size - len(self.buffer))
        if len(self.buffer) < TIME_RECORD.size:
            return None
        record, self.buffer = TIME_RECORD.unpack(self.buffer), b""
        return record


class _OpenLog:
    """One log file being read: where its next unread byte is, and its write times."""

    def __init__(self, file: IO[bytes], times: _Times) -> None:
        self.file, self.times, self.offset = file, times, 0

    def close(self) -> None:
        self.file.close()
        self.times.close()


class _NodeStream:
    """One node's log as one stream of ``(time, line)``: ``.1`` then the current file, across rotations and
    restarts, in chunks. Shutdown output after a stop line is counted instead of shown (unless ``stop_output``)."""

    def __init__(self, job_dir: Path, node: int, previous: bool = False, stop_output: bool = False) -> None:
        self.job_dir, self.node, self.previous = job_dir, node, previous
        self.path = node_log_path(job_dir, node, previous)
        self.rotated = rotated_log_path(job_dir, node, previous)
        self.stop_output = stop_output
        self.queue: list[IO[bytes]] = []
        self.log: _OpenLog | None = None
        self.pending = b""
        self.pending_time: float | None = None
        self.opened = False
        self.hidden = 0
        self.hiding = False
        self.last_time: float | None = None

    def start(self) -> Iterator[tuple[float | None, str]]:
        """The dropped-output line, if any; opens the files that exist now (consistently across a rotation)."""
        self.opened = True
        count = dropped_bytes(self.job_dir, self.node, self.previous)
        for _ in range(5):
            previous, current = _open(self.rotated), _open(self.path)
            if _path_inode(self.rotated) == (_inode(previous) if previous is not None else None):
                break  # no rotation between the two opens
            for f in (previous, current):
                if f is not None:
                    f.close()
        self.queue = [f for f in (previous, current) if f is not None]
        if self.queue:
            self.log = self._wrap(self.queue.pop(0))
        if count:
            yield None, dropped_line(count)

    def lines(self, final: bool) -> Iterator[tuple[float | None, str]]:
        """Complete lines readable now; with ``final`` also the last line without a line break."""
        for when, text in self._raw_lines(final):
            if when is not None:
                self.last_time = when
            if self.hiding:
                if _ATTEMPT_MARKER.match(text):
                    yield from self._end_hiding()
                else:
                    self.hidden += 1
                    continue
            elif not self.stop_output and _STOP_MARKER.match(text):
                self.hiding = True
            yield when, text
        if final and self.hiding:
            yield from self._end_hiding()

    def _end_hiding(self) -> Iterator[tuple[float | None, str]]:
        self.hiding = False
        if self.hidden:
            yield self.last_time, (f"[trainjob: {self.hidden} line(s) of shutdown output after the stop are hidden; "
                                   "--stop-output shows them]")
        self.hidden = 0

    def _raw_lines(self, final: bool) -> Iterator[tuple[float | None, str]]:
        if not self.opened:
            yield from self.start()
        while True:
            log = self.log
            chunk = log.file.read(_CHUNK_BYTES) if log is not None else b""
            if not chunk:
                if self._advance():
                    continue
                break
            assert log is not None
            start = log.offset
            log.offset += len(chunk)
            parts = chunk.split(b"\n")
            tail = parts.pop()
            for raw in parts:
                if not self.pending:
                    self.pending_time = log.times.time_at(start)
                line, self.pending = self.pending + raw, b""
                start += len(raw) + 1
                yield self.pending_time, line.decode("utf-8", errors="replace")
            if tail:
                if not self.pending:
                    self.pending_time = log.times.time_at(start)
                self.pending += tail
            if len(self.pending) > MAX_LINE_BYTES:
                yield self.pending_time, self.pending.decode("utf-8", errors="replace")
                self.pending = b""
        if final and self.pending:
            yield self.pending_time, self.pending.decode("utf-8", errors="replace")
            self.pending = b""

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        for f in self.queue:
            f.close()

    def _wrap(self, f: IO[bytes]) -> _OpenLog:
        candidates = [times_path(self.path), times_path(self.rotated)]
        if not self.previous:  # a restart moves the file being read to previous/
            candidates += [times_path(node_log_path(self.job_dir, self.node, True)),
                           times_path(rotated_log_path(self.job_dir, self.node, True))]
        return _OpenLog(f, _Times(f, candidates))

    def _advance(self) -> bool:
        """At the end of the file being read: whether there is another file to go on with."""
        if self.queue:
            if self.log is not None:
                self.log.close()
            self.log = self._wrap(self.queue.pop(0))
            return True
        if self.previous:
            return False  # the previous attempt is over: nothing new comes
        if self.log is not None and _path_inode(self.path) == _inode(self.log.file):
            return False  # still the file being read (a stat, not an open: a followed log asks on every poll)
        current = _open(self.path)
        if current is None:
            return False
        if self.log is None:
            self.log = self._wrap(current)
            return True
        if _inode(current) == _inode(self.log.file):
            current.close()
            return False
        # Rotated away, or moved to previous/ by a restart. The caller reads the old file to its end once more
        # (the keeper wrote the last of it before renaming), then any file rotated in between (now ``.1``), then
        # the current one.
        previous = _open(self.rotated)
        if previous is not None and _inode(previous) not in (_inode(self.log.file), _inode(current)):
            self.queue = [previous, current]
        else:
            if previous is not None:
                previous.close()
            self.queue = [current]
        return True


def _open(path: Path) -> IO[bytes] | None:
    try:
        return path.open("rb")
    except FileNotFoundError:
        return None


def _inode(f: IO[bytes]) -> int:
    return os.fstat(f.fileno()).st_ino


def _path_inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def read_logs(
    job_dir: Path,
    nodes: list[int],
    rank: int | None = None,
    follow: bool = False,
    finished: Callable[[], bool] = lambda: True,
    poll_interval: float = 0.05,
    *,
    since: float | None = None,
    tail: int | None = None,
    previous: bool = False,
    stop_output: bool = False,
) -> Iterator[LogLine]:
    """Lines of ``nodes`` (only global ``rank``'s when given), merged by the time they were written.

    ``since`` (a Unix time) leaves out lines written before it (and lines whose time was not recorded);
    ``tail`` starts with the last ``tail`` lines there are; ``previous`` reads the attempt before the last
    restart or resume; ``stop_output`` keeps what processes printed after a requested stop. With ``follow`` it
    keeps reading new lines until ``finished()`` is true and nothing is left to read (not with ``previous``).
    Each node's lines stay in file order; across nodes a line comes after those written before it.
    """
    streams = [_NodeStream(job_dir, node, previous, stop_output) for node in nodes]
    follow = follow and not previous
    backlog: deque[LogLine] | None = deque(maxlen=tail) if tail is not None else None
    try:
        while True:
            done = finished() if follow else True
            produced = False
            merged = heapq.merge(*(_node_lines(s, done, rank, since) for s in streams), key=_sort_key)
            for _, line in merged:
                produced = True
                if backlog is not None:
                    backlog.append(line)
                else:
                    yield line
            if backlog is not None:  # the first round read everything written so far
                yield from backlog
                backlog = None
            if done and not produced:
                return
            if not produced:
                time.sleep(poll_interval)
    finally:
        for stream in streams:
            stream.close()


def _sort_key(item: tuple[float, LogLine]) -> float:
    return item[0]


def _node_lines(
    stream: _NodeStream, final: bool, rank: int | None, since: float | None
) -> Iterator[tuple[float, LogLine]]:
    """``(sort time, line)`` of one node; a line without a recorded time sorts with the line before it."""
    for when, raw in stream.lines(final=final):
        line = parse_line(stream.node, raw)
        line.time = when
        if rank is not None and line.rank != rank and not raw.startswith("[trainjob: "):
            continue
        if since is not None and (when is None or when < since):
            continue
        yield (stream.last_time if when is None else when) or float("-inf"), line


def log_tail(job_dir: Path, node: int, size: int) -> str:
    """The last ``size`` bytes of a node's output (across a rotation), decoded."""
    parts: list[bytes] = []
    for path in (node_log_path(job_dir, node), rotated_log_path(job_dir, node)):
        want = size - sum(len(p) for p in parts)
        if want <= 0:
            break
        with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - want))
            parts.insert(0, f.read())
    return b"".join(parts).decode("utf-8", errors="replace")
