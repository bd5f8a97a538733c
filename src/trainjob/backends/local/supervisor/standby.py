"""A job's supervisor started before the job exists, so that its own start overlaps the command's.

Once ``trainjob run`` has checked a job, creating it (the layout of its nodes, its environment, the store) takes
about a tenth of a second; a supervisor started only then spends as long again starting Python and importing what
it runs. So a command that asks for it (:func:`arm`) gets a supervisor started in standby as soon as the job is
checked (:func:`start`, called by :meth:`LocalBackend.apply
<trainjob.backends.local.client.backend.LocalBackend.apply>`): ``python -m trainjob.backends.local.supervisor
--standby`` imports everything, then waits on its stdin. When the job is created, :meth:`LocalBackend._start_supervisor
<trainjob.backends.local.client.backend.LocalBackend._start_supervisor>` hands it the store's home and the job's
name (:func:`take`, :func:`hand_over`) and it supervises that job as one started for it would; when none is
created (it is queued, or creating it failed), :func:`release` closes its stdin and it exits. A command that dies
closes the pipe too, so a standby never outlives the command that started it without a job. Bad input starts
nothing: it is refused by the check, before the standby::

    standby.arm()                         # the command will create a job
    backend.apply(job)                    # checked, a standby started, the job created and handed to it
    standby.release()                     # once the job is created (or not)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STANDBY_FLAG = "--standby"

_standby: subprocess.Popen[bytes] | None = None
_armed = False


def arm() -> None:
    """Let :func:`start` start a standby for this process's next job (a command that creates one asks)."""
    global _armed
    _armed = True


def start() -> None:
    """Start a supervisor in standby for this process's next job, where :func:`arm` asked for one and none is
    waiting already."""
    global _standby, _armed
    if not _armed or _standby is not None:
        return
    _armed = False
    try:
        _standby = subprocess.Popen(
            [sys.executable, "-m", "trainjob.backends.local.supervisor", STANDBY_FLAG],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
    except OSError:  # the job gets a supervisor started for it instead
        _standby = None


def take() -> subprocess.Popen[bytes] | None:
    """The waiting standby (it is no longer this process's to release), or ``None``."""
    global _standby
    process, _standby = _standby, None
    if process is None or process.poll() is not None:
        return None
    return process


def hand_over(process: subprocess.Popen[bytes], home: str, name: str) -> bool:
    """Give ``process`` (from :func:`take`) job ``name`` of the store at ``home``; ``False`` when it is gone."""
    assert process.stdin is not None
    try:
        process.stdin.write(f"{home}\n{name}\n".encode())
        process.stdin.close()
    except (BrokenPipeError, ValueError):
        return False
    return process.poll() is None


def release() -> None:
    """Let a standby no job took exit (it reads the end of its stdin); disarm."""
    global _armed
    _armed = False
    process = take()
    if process is not None and process.stdin is not None:
        process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_job() -> tuple[str, str] | None:
    """In the standby: block until the command hands over a job; its store's home and name, or ``None`` when the
    command created none."""
    handed = sys.stdin.buffer.read().decode(errors="replace").split("\n")
    if len(handed) < 2 or not handed[0] or not handed[1]:
        return None
    return handed[0], handed[1]


def become_supervisor_of(job_dir: Path) -> None:
    """In the standby, once handed the job in ``job_dir``: from then on its output goes to the job's
    ``supervisor.log`` and its environment names the job's directory (for what it starts: its keepers, their
    nodes), as for a supervisor started for the job."""
    from trainjob.backends.local.processes import JOB_DIR_ENV

    os.environ[JOB_DIR_ENV] = str(job_dir)
    log = os.open(job_dir / "supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
