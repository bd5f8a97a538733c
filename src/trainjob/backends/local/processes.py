"""Finding and stopping every process of a job, and telling whether a recorded process still lives.

Every process of a job (its supervisor, the node keepers, the node processes, the training processes torchrun
starts in sessions of their own) carries ``TRAINJOB_JOB_DIR`` in its environment, so a sweep finds them all,
even after the supervisor was killed and they were re-parented::

    stop_processes(job_processes("/home/me/.trainjob/jobs/mnist", since=created))

A job has at most one supervisor: the one holding the exclusive ``flock`` on ``supervisor.lock`` in the job's
directory. The kernel drops the lock when that process ends, however it ends, so :func:`supervisor_lock_held` is
the truth about whether a job is supervised, and of several replacements started at once only one gets to
supervise.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from trainjob.constants import JOB_DIR_ENV

if TYPE_CHECKING:  # psutil (8 ms to import) is imported where used: listing finished jobs never needs it
    import psutil

SUPERVISOR_LOCK_FILE = "supervisor.lock"


def join_job(job_dir: Path) -> None:
    """For a process started before its job existed (a warm supervisor, a warm keeper), once it is
    given the job in ``job_dir``: from then on its output goes to the job's ``supervisor.log`` (its stdin is
    done) and its environment names the job's directory (for what it starts), as for one started for the job."""
    os.environ[JOB_DIR_ENV] = str(job_dir)
    log = os.open(job_dir / "supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)


def is_alive(pid: int | None, started: float | None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``started`` (not a reused pid)."""
    if not pid:
        return False
    stat = _stat(pid)
    if stat is None or stat.state == b"Z":  # gone, or a zombie: ended, not yet reaped
        return False
    return started is None or abs(stat.started - started) < 0.05


class _Stat(NamedTuple):
    state: bytes
    started: float


def _stat(pid: int) -> _Stat | None:
    """The state and start time (as psutil's ``create_time`` gives it) of ``pid``, from ``/proc/PID/stat``;
    ``None`` when there is no such process. Read here: asking about a process does not import psutil."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # from field 3; the name in parentheses may hold spaces
    return _Stat(fields[0], int(fields[19]) / os.sysconf("SC_CLK_TCK") + _boot_time())


def _boot_time() -> float:  # read each time, as psutil does: it moves when the clock is set
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise OSError("no btime line in /proc/stat")


class Watched:
    """Processes found alive (:func:`is_alive`), then held by a pidfd: asking about one again polls its pidfd
    instead of reading ``/proc`` (a followed log asks about the job's supervisor on every poll). At most
    ``limit`` are held, the longest held let go first; an ended one is let go when it is asked about."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._fds: dict[tuple[int, float | None], int] = {}

    def alive(self, pid: int | None, started: float | None) -> bool:
        """:func:`is_alive`, for ``pid`` and ``started`` as a job's row records them."""
        if not pid:
            return False
        key = (pid, started)
        fd = self._fds.get(key)
        if fd is not None:
            if not select.select([fd], [], [], 0)[0]:
                return True
            os.close(self._fds.pop(key))
            return False
        try:
            fd = os.pidfd_open(pid)  # before the check: if that finds the process it started at ``started``, so is this
        except OSError:
            return is_alive(pid, started)
        if not is_alive(pid, started):
            os.close(fd)
            return False
        if len(self._fds) >= self.limit:
            os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[key] = fd
        return True

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    __del__ = close  # a backend dropped lets its pidfds go with it


def start_time(pid: int) -> float | None:
    """When ``pid`` started, as :func:`is_alive` compares it; ``None`` when there is no such process."""
    stat = _stat(pid)
    return None if stat is None else stat.started


def job_processes(job_dir: str, since: float = 0.0) -> list[psutil.Process]:
    """Processes of this user whose environment names ``job_dir``, started at or after ``since``."""
    import psutil

    me = os.getuid()
    found = []
    for process in psutil.process_iter(["uids", "create_time"]):
        try:
            if process.pid == os.getpid() or process.info["uids"].real != me:
                continue
            if process.info["create_time"] + 1 < since:
                continue
            if process.environ().get(JOB_DIR_ENV) == job_dir:
                found.append(process)
        except (psutil.Error, AttributeError):
            continue
    return found


def tree_pids(roots: Iterable[int]) -> list[int]:
    """``roots`` and every process under them (those still running)."""
    import psutil

    found = []
    for root in roots:
        with contextlib.suppress(psutil.Error):
            found += [root, *(child.pid for child in psutil.Process(root).children(recursive=True))]
    return found


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (a node process and what shares its group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_processes(processes: Iterable[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left; returns when all are gone."""
    import psutil

    processes = list(processes)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=5)


def hold_supervisor_lock(job_dir: Path, wait: float = 1.0) -> int | None:
    """Take the job's supervisor lock for the rest of this process's life: its descriptor, or ``None`` when
    another process holds it (after retrying for ``wait`` seconds: probes hold it for a moment)."""
    fd = os.open(job_dir / SUPERVISOR_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.02)


def supervisor_lock_held(job_dir: Path) -> bool:
    """Whether a live process supervises the job (holds its supervisor lock)."""
    try:
        fd = os.open(job_dir / SUPERVISOR_LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if this probe got it
    return False
