"""Watching a job from the terminal: streamed logs above a live status line (progress, loss, ETA).

Logs are read on a thread with its own backend (its own database connection) into a bounded queue, so a job
that writes faster than the terminal shows costs no memory; the main thread prints them and refreshes the
status line. Without a terminal the status line is left out and only the logs are printed::

    job = follow(lambda: LocalBackend(), "mnist")
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from trainjob.backends.base import Backend
from trainjob.cli.jobs_format import human_duration, job_duration, progress_text
from trainjob.errors import TrainJobError
from trainjob.sdk import types

_END = object()
REFRESH_SECONDS = 0.5
#: Lines read ahead of printing, at most.
LINE_BUFFER = 1000


def status_line(job: types.TrainJob) -> str:
    """``mnist Running 1m5s  2x4  37% 120/320 loss=0.412 eta 1m5s``: one refreshed line under the logs."""
    duration = job_duration(job, datetime.now(UTC))
    elapsed = "" if duration is None else f" {human_duration(duration)}"
    return f"{job.name} {job.status}{elapsed}  {job.num_nodes}x{job.num_proc_per_node}  {progress_text(job.progress)}"


def follow(backend_factory: Callable[[], Backend], name: str) -> types.TrainJob:
    """Print the job's logs until it is no longer Created or Running; returns the job then."""
    backend = backend_factory()
    lines: queue.Queue[object] = queue.Queue(maxsize=LINE_BUFFER)

    def read() -> None:
        try:
            for line in backend_factory().logs(name, follow=True):
                lines.put(line)
        except TrainJobError:
            pass  # the job went away (deleted); the main loop reports it
        finally:
            lines.put(_END)

    threading.Thread(target=read, daemon=True).start()
    live = live_display()
    job = backend.get_job(name)
    logs_done = False
    last = 0.0
    try:
        if live:
            live.start()
        while True:
            try:
                item = lines.get(timeout=REFRESH_SECONDS) if not logs_done else None
            except queue.Empty:
                item = None
            if item is _END:
                logs_done = True
            elif item is not None:
                _print(live, str(item))
            if time.monotonic() - last >= REFRESH_SECONDS or logs_done:
                job = backend.get_job(name)
                last = time.monotonic()
                if live:
                    live.update(status_line(job))
                if logs_done and job.status not in (types.CREATED, types.RUNNING):
                    return job
            if logs_done:
                time.sleep(REFRESH_SECONDS)
    finally:
        if live:
            live.stop()


def _print(live: Any, text: str) -> None:
    if live is None:
        print(text, flush=True)
    else:
        live.console.print(text, markup=False, highlight=False, soft_wrap=True)


def live_display() -> Any:
    """A transient rich ``Live`` for the status line when stdout is a terminal, else ``None``."""
    if not sys.stdout.isatty():
        return None
    from rich.live import Live  # only terminals pay for importing rich

    return Live("", refresh_per_second=4, transient=True)
