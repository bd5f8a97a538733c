"""A warm supervisor: a job's supervisor started before the job exists, so that its own start overlaps the
command's.

Reading and checking a job (the API models' import is most of it) and creating it (the layout of its nodes, its
environment, the store) take ``trainjob run`` a few tenths of a second; a supervisor started only then spends
about a fifth of a second more starting Python and importing what it runs. So ``trainjob run`` starts a warm one
before it reads the job (:func:`start`): ``python -m trainjob.backends.local.supervisor --warm N`` imports
everything, starts warm keepers for the job's N nodes
(:func:`~trainjob.backends.local.supervisor.warm_keepers.start_warm_keepers`: a keeper's start is the last step
before a node's, and each starts its node's warm torchrun, :mod:`~trainjob.backends.local.node_keeper.warm_node`),
then waits on its stdin. When the job is created,
:func:`~trainjob.backends.local.supervisor.start.start_supervisor` hands it the store's home and the job's name
(:func:`take`, :func:`hand_over`) and it supervises that job as one started for it would; when none is
created (bad input, a queued job, a failed creation), :func:`release` stops it: it holds nothing yet. A command
that dies closes the pipe, and a warm supervisor reading the end of its stdin exits, so it never outlives the
command that started it without a job::

    warm.start()                          # the command will create a job: now, while it reads and checks it
    backend.apply(job)                    # checked, the job created and handed to the warm supervisor
    warm.release()                        # once the job is created (or not)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

WARM_SUPERVISOR_FLAG = "--warm"
#: Warm keepers a warm supervisor starts at most, whatever the node count (a job of more nodes starts the rest
#: itself).
MAX_WARM_KEEPERS = 8

_warm: subprocess.Popen[bytes] | None = None


def start(nodes: int = 1) -> None:
    """Start a warm supervisor for this process's next job, unless one is waiting already; it starts ``nodes``
    warm keepers too (the nodes the job will likely have: one the job does not take ends at once)."""
    global _warm
    if _warm is not None:
        return
    try:
        _warm = subprocess.Popen(
            [sys.executable, "-m", "trainjob.backends.local.supervisor", WARM_SUPERVISOR_FLAG, str(max(0, nodes))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
    except OSError:  # the job gets a supervisor started for it instead
        _warm = None


def warm_keeper_count(args: list[str]) -> int | None:
    """In the supervisor: how many warm keepers to start when its arguments (``args``) say it is warm, else
    ``None``."""
    if not args or args[0] != WARM_SUPERVISOR_FLAG:
        return None
    count = args[1] if len(args) > 1 else "0"
    return min(int(count), MAX_WARM_KEEPERS) if count.isdigit() else 0


def take() -> subprocess.Popen[bytes] | None:
    """The waiting warm supervisor (it is no longer this process's to release), or ``None``."""
    global _warm
    process, _warm = _warm, None
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
    """Stop a warm supervisor no job took, and its warm keepers (in its process group until one is given a node):
    they hold nothing yet, so the command need not wait for them to finish starting."""
    process = take()
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()
        try:
            os.killpg(process.pid, signal.SIGKILL)  # its session's group: the supervisor and its warm keepers
        except OSError:
            process.kill()
        process.wait()


def wait_for_job() -> tuple[str, str] | None:
    """In the warm supervisor: block until the command hands over a job; its store's home and name, or ``None``
    when the command created none."""
    handed = sys.stdin.buffer.read().decode(errors="replace").split("\n")
    if len(handed) < 2 or not handed[0] or not handed[1]:
        return None
    return handed[0], handed[1]
