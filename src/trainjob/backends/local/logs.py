"""Node logs of local jobs: how a node's keeper writes them (capped) and how readers stream them.

Each node's keeper (:mod:`trainjob.backends.local.node_keeper`) copies the node's stdout and stderr into
``logs/node-<i>.log`` in the job's directory; torchrun tees every training process into it with a ``[rank<r>]: ``
prefix, through per-rank files whose disk space is released once read (:class:`TorchrunCopies`). When the file passes the cap (``TRAINJOB_LOG_MAX_BYTES`` when the job was created, default 50 MiB) it
becomes ``node-<i>.log.1`` and a new file starts; the previous ``.1`` is dropped and its size added to
``node-<i>.log.dropped``, so a node's log never takes more than about twice the cap. :func:`read_logs` yields
:class:`~trainjob.types.LogLine` objects, reading in chunks (memory stays bounded whatever the log's size),
following rotations while the job runs, and starting with a ``[trainjob: N bytes of earlier output dropped]``
line when something was dropped::

    for line in read_logs(job_dir, nodes=[0, 1], follow=True, finished=lambda: job_is_done()):
        print(line)          # node-1/rank-3 | epoch 2 loss 0.41
"""

from __future__ import annotations

import contextlib
import os
import re
import time
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


def node_log_path(job_dir: Path, node: int) -> Path:
    return job_dir / "logs" / f"node-{node}.log"


def previous_log_path(job_dir: Path, node: int) -> Path:
    return job_dir / "logs" / f"node-{node}.log.1"


def dropped_bytes_path(job_dir: Path, node: int) -> Path:
    return job_dir / "logs" / f"node-{node}.log.dropped"


def log_max_bytes() -> int:
    """The per-file cap for new jobs: ``$TRAINJOB_LOG_MAX_BYTES`` (at least 64 KiB) or 50 MiB."""
    value = os.environ.get(LOG_MAX_BYTES_ENV, "")
    return max(64 * 1024, int(value)) if value.isdigit() else DEFAULT_LOG_MAX_BYTES


def dropped_bytes(job_dir: Path, node: int) -> int:
    try:
        return int(dropped_bytes_path(job_dir, node).read_text(encoding="ascii") or 0)
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
    """Appends a node's output to ``node-<i>.log``, rotating past ``max_bytes`` (used by the node's keeper)."""

    def __init__(self, job_dir: Path, node: int, max_bytes: int) -> None:
        self.job_dir, self.node, self.max_bytes = job_dir, node, max_bytes
        self.path = node_log_path(job_dir, node)
        self._file = self.path.open("ab")
        self.size = self._file.tell()
        self._at_line_start = True

    def write(self, data: bytes) -> None:
        if not data:
            return
        over = self.size - self.max_bytes
        if over >= 0 and (self._at_line_start or over >= _ROTATE_SLACK_BYTES):
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self.size += len(data)
        self._at_line_start = data.endswith(b"\n")

    def close(self) -> None:
        self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        previous = previous_log_path(self.job_dir, self.node)
        try:
            lost = previous.stat().st_size
        except FileNotFoundError:
            lost = 0
        os.replace(self.path, previous)
        if lost:
            counter = dropped_bytes_path(self.job_dir, self.node)
            temporary = counter.with_suffix(".tmp")
            temporary.write_text(str(dropped_bytes(self.job_dir, self.node) + lost), encoding="ascii")
            os.replace(temporary, counter)
        self._file = self.path.open("ab")
        self.size = 0


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


class _NodeStream:
    """One node's log as one stream of lines: ``.1`` then the current file, across rotations, in chunks."""

    def __init__(self, job_dir: Path, node: int) -> None:
        self.job_dir, self.node = job_dir, node
        self.path = node_log_path(job_dir, node)
        self.previous = previous_log_path(job_dir, node)
        self.queue: list[IO[bytes]] = []
        self.file: IO[bytes] | None = None
        self.pending = b""
        self.opened = False

    def start(self) -> Iterator[str]:
        """The dropped-output line, if any; opens the files that exist now (consistently across a rotation)."""
        self.opened = True
        count = dropped_bytes(self.job_dir, self.node)
        for _ in range(5):
            previous, current = _open(self.previous), _open(self.path)
            if _path_inode(self.previous) == (_inode(previous) if previous is not None else None):
                break  # no rotation between the two opens
            for f in (previous, current):
                if f is not None:
                    f.close()
        self.queue = [f for f in (previous, current) if f is not None]
        if self.queue:
            self.file = self.queue.pop(0)
        if count:
            yield dropped_line(count)

    def lines(self, final: bool) -> Iterator[str]:
        """Complete lines readable now; with ``final`` also the last line without a line break."""
        if not self.opened:
            yield from self.start()
        while True:
            chunk = self.file.read(_CHUNK_BYTES) if self.file is not None else b""
            if not chunk:
                if self._advance():
                    continue
                break
            parts = (self.pending + chunk).split(b"\n")
            self.pending = parts.pop()
            if len(self.pending) > MAX_LINE_BYTES:
                parts.append(self.pending)
                self.pending = b""
            for raw in parts:
                yield raw.decode("utf-8", errors="replace")
        if final and self.pending:
            yield self.pending.decode("utf-8", errors="replace")
            self.pending = b""

    def close(self) -> None:
        for f in [self.file, *self.queue]:
            if f is not None:
                f.close()

    def _advance(self) -> bool:
        """At the end of the file being read: whether there is another file to go on with."""
        if self.queue:
            if self.file is not None:
                self.file.close()
            self.file = self.queue.pop(0)
            return True
        current = _open(self.path)
        if current is None:
            return False
        if self.file is None:
            self.file = current
            return True
        if _inode(current) == _inode(self.file):
            current.close()
            return False
        # Rotated away. The caller reads the old file to its end once more (the keeper wrote the last of it
        # before renaming), then any file rotated in between (now ``.1``), then the current one.
        previous = _open(self.previous)
        if previous is not None and _inode(previous) not in (_inode(self.file), _inode(current)):
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
) -> Iterator[LogLine]:
    """Lines of ``nodes`` (only global ``rank``'s when given), each node's in file order.

    With ``follow`` it keeps reading new lines until ``finished()`` is true and nothing is left to read.
    """
    streams = {node: _NodeStream(job_dir, node) for node in nodes}
    try:
        while True:
            done = finished() if follow else True
            produced = False
            for node, stream in streams.items():
                for raw in stream.lines(final=done):
                    produced = True
                    line = parse_line(node, raw)
                    if rank is None or line.rank == rank or raw.startswith("[trainjob: "):
                        yield line
            if done and not produced:
                return
            if not produced:
                time.sleep(poll_interval)
    finally:
        for stream in streams.values():
            stream.close()


def log_tail(job_dir: Path, node: int, size: int) -> str:
    """The last ``size`` bytes of a node's output (across a rotation), decoded."""
    parts: list[bytes] = []
    for path in (node_log_path(job_dir, node), previous_log_path(job_dir, node)):
        want = size - sum(len(p) for p in parts)
        if want <= 0:
            break
        with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - want))
            parts.insert(0, f.read())
    return b"".join(parts).decode("utf-8", errors="replace")
