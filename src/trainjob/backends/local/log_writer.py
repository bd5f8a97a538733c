"""Node logs of local jobs as a node's keeper writes them: capped, rotated, with the time of every write.

Each node's keeper (:mod:`trainjob.backends.local.node_keeper`) copies the node's stdout and stderr into
``logs/node-<i>.log`` in the job's directory; torchrun tees every training process into it with a ``[rank<r>]: ``
prefix, through per-rank files whose disk space is released once read (:class:`TorchrunCopies`). When the file
passes the cap (``TRAINJOB_LOG_MAX_BYTES`` when the job was created, default 50 MiB) it
becomes ``node-<i>.log.1`` and a new file starts; the previous ``.1`` is dropped and its size added to
``node-<i>.log.dropped``, so a node's log never takes more than about twice the cap.

The output itself is stored as the node wrote it. When it was written is kept beside it, in
``node-<i>.log.times`` (a header naming the log file's inode, then ``(byte offset, Unix time)`` records, at most one
per :data:`TIME_RESOLUTION`), so readers (:mod:`trainjob.backends.local.log_reader`) can interleave nodes by time
and answer ``--since``.

Every start of a node is an *attempt* (an elastic restart, a resume after suspend): the keeper's writer moves the
previous attempt's files to ``logs/previous/`` (``trainjob logs --previous``) and starts the new log with a
``[trainjob] node-<i>: attempt started ...`` line. When the supervisor stops a node on purpose (suspend, deadline,
delete, a failed peer) it notes why (:func:`note_stop_reason`) and the keeper writes a
``[trainjob] node-<i> stopping: <why>`` line first::

    writer = NodeLogWriter(job_dir, node=0, max_bytes=log_max_bytes())
    writer.write(b"[rank0]: epoch 1 loss 0.52\n")
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from pathlib import Path

LOG_MAX_BYTES_ENV = "TRAINJOB_LOG_MAX_BYTES"
DEFAULT_LOG_MAX_BYTES = 50 * 1024 * 1024
#: Past the cap a file is rotated at the next line break, or this much later when no line ends.
_ROTATE_SLACK_BYTES = 1024 * 1024
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_RELEASE_ALIGN = 65536
#: Write times are recorded at most this often (seconds); lines written in between get the earlier time.
TIME_RESOLUTION = 0.01
TIMES_MAGIC = b"TJTIMES1"
TIMES_HEADER = struct.Struct("<8sQ")  # magic, inode of the log file the records belong to
TIME_RECORD = struct.Struct("<Qd")  # byte offset in the log file, Unix time the bytes from there were written
#: The previous attempt's files, for ``--previous``.
PREVIOUS_DIR = "previous"
#: What the keeper writes before it stops a node on request; what follows it is shutdown output.
STOP_MARKER = "[trainjob] node-{node} stopping: {reason}"
ATTEMPT_MARKER = "[trainjob] node-{node}: attempt started; the previous attempt's output: trainjob logs NAME --previous"
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
            self._times.write(TIMES_HEADER.pack(TIMES_MAGIC, os.fstat(self._file.fileno()).st_ino))
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
            self._times.write(TIME_RECORD.pack(self.size, now))
            self._times_size += TIME_RECORD.size
            self._last_time = now
        self._file.write(data)
        self._file.flush()
        self.size += len(data)
        self._at_line_start = data.endswith(b"\n")

    @property
    def at_line_start(self) -> bool:
        """Whether the last write ended a line."""
        return self._at_line_start

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
