"""Finding and stopping every process of a job, and telling whether a recorded process still lives.

Every process of a job (its supervisor, the node processes, the training processes torchrun starts in sessions
of their own) carries ``TRAINJOB_JOB_DIR`` in its environment, so a sweep finds them all, even after the
supervisor was killed and they were re-parented::

    stop_processes(job_processes("/home/me/.trainjob/jobs/mnist", since=created))
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

import psutil

JOB_DIR_ENV = "TRAINJOB_JOB_DIR"


def is_alive(pid: int | None, started: float | None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``started`` (not a reused pid)."""
    if not pid:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) < 0.05
    except psutil.Error:
        return False


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def job_processes(job_dir: str, since: float = 0.0) -> list[psutil.Process]:
    """Processes of this user whose environment names ``job_dir``, started at or after ``since``."""
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


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (a node process and what shares its group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_processes(processes: Iterable[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left; returns when all are gone."""
    processes = list(processes)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=5)
