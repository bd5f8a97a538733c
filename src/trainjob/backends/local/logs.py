"""Node logs of local jobs: how a node's keeper writes them (capped, timed) and how readers stream them.

Each node's keeper (:mod:`trainjob.backends.local.node_keeper`) copies the node's stdout and stderr into
``logs/node-<i>.log`` in the job's directory; torchrun tees every training process into it with a ``[rank<r>]: ``
prefix, through per-rank files whose disk space is released once read (:class:`TorchrunCopies`). When the file
passes the cap (``TRAINJOB_LOG_MAX_BYTES`` when the job was created, default 50 MiB) it
becomes ``node-<i>.log.1`` and a new file starts; the previous ``.1`` is dropped and its size added to
``node-<i>.log.dropped``, so a node's log never takes more than about twice the cap.

The output itself is stored as the node wrote it. When it was written is kept beside it, in
``node-<i>.log.times`` (a header naming the log file's inode, then ``(byte offset, Unix time)`` records, at most one
per :data:`TIME_RESOLUTION`), so readers can interleave nodes by time and answer ``--since``.

Every start of a node is an *attempt* (an elastic restart, a resume after suspend): the keeper's writer moves the
previous attempt's files to ``logs/previous/`` (``trainjob logs --previous``) and starts the new log with a
``[trainjob] node-<i>: attempt started ...`` line. When the supervisor stops a node on purpose (suspend, deadline,
delete, a failed peer) the keeper writes a ``[trainjob] node-<i> stopping: <why>`` line first; what the processes
print after it (torchrun's SIGTERM tracebacks) is not a crash, and readers hide it behind one summary line.

:func:`read_logs` yields :class:`~trainjob.types.LogLine` objects, reading in chunks (memory stays bounded whatever
the log's size), merging nodes by time, following rotations and restarts while the job runs, and starting with a
``[trainjob: N bytes of earlier output dropped]`` line when something was dropped::

    for line in read_logs(job_dir, nodes=[0, 1], follow=True, finished=lambda: job_is_done()):
        print(line)          # node-1/rank-3 | epoch 2 loss 0.41
    read_logs(job_dir, [0, 1], tail=20, since=time.time() - 300)   # the last 20 lines of the last 5 minutes
"""

from __future__ import annotations

import contextlib
import heapq
import os
import re
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from trainjob.types import LogLine

LOG_MAX_BYTES_ENV = "TRAINJOB_LOG_MAX_BYTES"
DEFAULT_LOG_MAX_BYTES = 50 * 1024 * 1024
#: Past the cap a file is rotated at the next line break, or this much later when no line ends.
_ROTATE_SLACK_BYTES = 1024 * 1024
_CHUNK_BYTES = 1024 * 1024
#: A longer line is shown in pieces, so one line without a break cannot take unbounded memory.
MAX_LINE_BYTES = 1024 * 1024
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_RELEASE_ALIGN = 65536
#: Write times are recorded at most this often (seconds); lines written in between get the earlier time.
TIME_RESOLUTION = 0.01
_TIMES_MAGIC = b"TJTIMES1"
_TIMES_HEADER = struct.Struct("<8sQ")  # magic, inode of the log file the records belong to
_TIME_RECORD = struct.Struct("<Qd")  # byte offset in the log file, Unix time the bytes from there were written
_TIMES_RETRY_SECONDS = 0.2
#: The previous attempt's files, for ``--previous``.
PREVIOUS_DIR = "previous"
#: What the keeper writes before it stops a node on request; what follows it is shutdown output.
STOP_MARKER = "[trainjob] node-{node} stopping: {reason}"
_STOP_MARKER = re.compile(r"^\[trainjob\] node-\d+ stopping: ")
ATTEMPT_MARKER = "[trainjob] node-{node}: attempt started; the previous attempt's output: trainjob logs NAME --previous"
_ATTEMPT_MARKER = re.compile(r"^\[trainjob\] node-\d+: attempt started")
#: The supervisor writes why it stops the nodes here (one line) before it stops them.
STOP_REASON_FILE = "stop-reason"


def log_dir(job_dir: Path, previous: bool = False) -> Path:
    """``logs/`` of the job, or ``logs/previous/`` (the attempt before the last restart or resume)."""
    return job_dir / "logs" / PREVIOUS_DIR if previous else job_dir / "logs"


def node_log_path(job_dir: Path, node: int, previous: bool = False) -> Path:
    return log_dir(job_dir, previous) / f"node-{node}.log"


def rotated_log_path(job_dir: Path, node: int, previous: bool = False) -> Path:
    return log_dir(job_dir, previous) / f"node-{node}.log.1"


def dropped_bytes_path(job_dir: Path, node: int, previous: bool = False) -> Path:
    return log_dir(job_dir, previous) / f"node-{node}.log.dropped"


def times_path(log_path: Path) -> Path:
    """Where the write times of ``log_path`` are kept (they move with it when it rotates)."""
    return log_path.with_name(log_path.name + ".times")


def _node_files(directory: Path, node: int) -> list[Path]:
    log = directory / f"node-{node}.log"
    rotated = directory / f"node-{node}.log.1"
    return [log, rotated, times_path(log), times_path(rotated), directory / f"node-{node}.log.dropped"]


def keep_previous_attempt(job_dir: Path, node: int) -> bool:
    """Move node ``node``'s log files to ``logs/previous/`` (replacing older ones); whether there were any."""
    current = log_dir(job_dir)
    if not any(path.exists() for path in _node_files(current, node)):
        return False
    previous = log_dir(job_dir, previous=True)
    previous.mkdir(parents=True, exist_ok=True)
    for old in _node_files(previous, node):
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    for path in _node_files(current, node):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, previous / path.name)
    return True


def note_stop_reason(job_dir: Path, reason: str) -> None:
    """Record why the nodes are being stopped, for the stop line each keeper writes into its node's log."""
    path = job_dir / "logs" / STOP_REASON_FILE
    with contextlib.suppress(OSError):
        temporary = path.with_suffix(".tmp")
        temporary.write_text(reason.replace("\n", " ")[:500], encoding="utf-8")
        os.replace(temporary, path)


def _stop_reason(job_dir: Path) -> str:
    try:
        return (job_dir / "logs" / STOP_REASON_FILE).read_text(encoding="utf-8").strip() or "stop requested"
    except OSError:
        return "stop requested"


def log_max_bytes() -> int:
    """The per-file cap for new jobs: ``$TRAINJOB_LOG_MAX_BYTES`` (at least 64 KiB) or 50 MiB."""
    value = os.environ.get(LOG_MAX_BYTES_ENV, "")
    return max(64 * 1024, int(value)) if value.isdigit() else DEFAULT_LOG_MAX_BYTES


def dropped_bytes(job_dir: Path, node: int, previous: bool = False) -> int:
    try:
        return int(dropped_bytes_path(job_dir, node, previous).read_text(encoding="ascii") or 0)
    except (OSError, ValueError):
        return 0


def dropped_line(count: int) -> str:
    return f"[trainjob: {count} bytes of earlier output dropped]"


def parse_line(node: int, raw: str) -> LogLine:
    """A raw node-log line as a :class:`LogLine`, its rank taken from torchrun's prefix when there is one."""
    match = _RANK_PREFIX.match(raw)
    if match:
        return LogLine(node=node, rank=int(match.group(1)), text=raw[match.end() :])
    return LogLine(node=node, rank=None, text=raw)


class NodeLogWriter:
    """Appends a node's output to ``node-<i>.log`` with its write times, rotating past ``max_bytes``.

    Used by the node's keeper, once per attempt: a new writer first moves the previous attempt's files to
    ``logs/previous/`` (:func:`keep_previous_attempt`).
    """

    def __init__(self, job_dir: Path, node: int, max_bytes: int, new_attempt: bool = True) -> None:
        self.job_dir, self.node, self.max_bytes = job_dir, node, max_bytes
        self.path = node_log_path(job_dir, node)
        restarted = new_attempt and keep_previous_attempt(job_dir, node)
        if new_attempt:  # the last stop's reason is over: the supervisor stopped every node before restarting
            with contextlib.suppress(OSError):
                (job_dir / "logs" / STOP_REASON_FILE).unlink()
        self._open()
        if restarted:
            self.write((ATTEMPT_MARKER.format(node=node) + "\n").encode())

    def _open(self) -> None:
        self._file = self.path.open("ab")
        self.size = self._file.tell()
        self._at_line_start = True
        self._times = times_path(self.path).open("ab", buffering=0)
        if self._times.tell() == 0:
            self._times.write(_TIMES_HEADER.pack(_TIMES_MAGIC, os.fstat(self._file.fileno()).st_ino))
        self._times_size = self._times.tell()
        self._last_time: float | None = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        over = self.size - self.max_bytes
        times_full = self._times_size > self.max_bytes // 4
        if (over >= 0 or times_full) and (self._at_line_start or over >= _ROTATE_SLACK_BYTES or times_full):
            self._rotate()
        now = time.time()
        if self._last_time is None or now - self._last_time >= TIME_RESOLUTION:
            self._times.write(_TIME_RECORD.pack(self.size, now))
            self._times_size += _TIME_RECORD.size
            self._last_time = now
        self._file.write(data)
        self._file.flush()
        self.size += len(data)
        self._at_line_start = data.endswith(b"\n")

    def mark_stop(self) -> None:
        """Write the stop line (with the reason the supervisor gave) before the node is stopped on request."""
        line = STOP_MARKER.format(node=self.node, reason=_stop_reason(self.job_dir))
        with contextlib.suppress(OSError):  # a full disk must not keep the node from stopping
            self.write((("" if self._at_line_start else "\n") + line + "\n").encode())

    def close(self) -> None:
        self._file.close()
        self._times.close()

    def _rotate(self) -> None:
        self.close()
        previous = rotated_log_path(self.job_dir, self.node)
        try:
            lost = previous.stat().st_size
        except FileNotFoundError:
            lost = 0
        os.replace(self.path, previous)
        with contextlib.suppress(FileNotFoundError):
            os.replace(times_path(self.path), times_path(previous))
        if lost:
            counter = dropped_bytes_path(self.job_dir, self.node)
            temporary = counter.with_suffix(".tmp")
            temporary.write_text(str(dropped_bytes(self.job_dir, self.node) + lost), encoding="ascii")
            os.replace(temporary, counter)
        self._open()


class TorchrunCopies:
    """torchrun's per-rank copies of a node's output (``PET_LOG_DIR``), tee'd into the node log.

    torchrun tees a rank by writing its output to a file and reading that file back; once read, a stretch is
    in the node log, so :meth:`release` frees its disk blocks (``FALLOC_FL_PUNCH_HOLE``: it then reads as zeros)
    and :meth:`empty` empties the files when the node has ended. Files torchrun does not read are left alone.
    """

    def __init__(self, root: str | None, teed_all: bool) -> None:
        self.root, self.teed_all = root, teed_all
        self.released: dict[str, int] = {}
        self.since = time.time()

    def release(self, torchrun_pid: int) -> None:
        """Free the blocks of each copy below the position torchrun (``torchrun_pid``) has read it to."""
        fd_dir = f"/proc/{torchrun_pid}/fd"
        try:
            fds = os.listdir(fd_dir) if self.root else []
        except OSError:
            return
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if not (target.startswith(f"{self.root}{os.sep}") and target.endswith(".log")):
                    continue
                with open(f"/proc/{torchrun_pid}/fdinfo/{fd}", encoding="ascii") as f:
                    info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            except (OSError, ValueError):
                continue
            if int(info["flags"], 8) & os.O_ACCMODE != os.O_RDONLY:
                continue
            read_to = int(info["pos"]) // _RELEASE_ALIGN * _RELEASE_ALIGN
            done = self.released.setdefault(target, 0)
            if read_to > done and _punch_hole(target, done, read_to):
                self.released[target] = read_to

    def empty(self) -> None:
        """Once the node has ended: empty the copies written since this object was made that torchrun read."""
        if not self.root:
            return
        for path in Path(self.root).rglob("std*.log"):
            with contextlib.suppress(OSError):
                if (self.teed_all or str(path) in self.released) and path.stat().st_mtime >= self.since:
                    os.truncate(path, 0)


def _punch_hole(path: str, start: int, end: int) -> bool:
    import ctypes  # only node keepers pay for it

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fallocate = ctypes.CDLL(None, use_errno=True).fallocate
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        return fallocate(fd, mode, ctypes.c_int64(start), ctypes.c_int64(end - start)) == 0
    finally:
        os.close(fd)


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
        """When the byte at ``offset`` was written (to :data:`TIME_RESOLUTION`); ``None`` when not recorded."""
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
            header = f.read(_TIMES_HEADER.size)
            if len(header) == _TIMES_HEADER.size and _TIMES_HEADER.unpack(header) == (_TIMES_MAGIC, self.inode):
                self.file = f
                return True
            f.close()
        return False

    def _read_record(self) -> tuple[int, float] | None:
        assert self.file is not None
        self.buffer += self.file.read(_TIME_RECORD.size - len(self.buffer))
        if len(self.buffer) < _TIME_RECORD.size:
            return None
        record, self.buffer = _TIME_RECORD.unpack(self.buffer), b""
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
