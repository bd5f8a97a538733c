"""Starting a job's supervisor, and admitting queued jobs: what the client does on submit and every supervisor
does as its job ends (the local queue has no daemon), so both reach it here rather than one through the other.

::

    start_supervisor(store, "mnist")   # python -m trainjob.backends.local.supervisor HOME mnist, detached
    admit(store)                       # the queued jobs that fit now, each with its supervisor started
"""

from __future__ import annotations

import os
import subprocess
import sys

from trainjob.backends.local import processes, queue
from trainjob.backends.local.store import Store
from trainjob.backends.local.supervisor import warm


def start_supervisor(store: Store, name: str, replacing: bool = False) -> None:
    """Start the job's supervisor, or hand the job to the warm one this process started
    (:mod:`~trainjob.backends.local.supervisor.warm`); a replacement records itself once it holds the
    supervisor lock."""
    job_dir = store.job_dir(name)
    waiting = None if replacing else warm.take()
    if waiting is not None and warm.hand_over(waiting, str(store.home), name):
        process = waiting
    else:
        env = {**os.environ, processes.JOB_DIR_ENV: str(job_dir)}
        argv = [sys.executable, "-m", "trainjob.backends.local.supervisor", str(store.home), name]
        with (job_dir / "supervisor.log").open("ab") as log:
            process = subprocess.Popen(
                argv + (["--replace"] if replacing else []),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, close_fds=True,
            )
    if not replacing:
        store.update_job(name, supervisor_pid=process.pid, supervisor_started=processes.start_time(process.pid))


def admit(store: Store) -> list[str]:
    """Start the queued jobs that fit what is free now (:func:`~trainjob.backends.local.queue.admit`); their
    names."""
    admitted = queue.admit(store)
    for name in admitted:
        start_supervisor(store, name)
    return admitted
