"""Readers while jobs are deleted under them, and one backend shared by threads: no spurious errors."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from trainjob.backends.local import processes
from trainjob.backends.local.client.backend import LocalBackend, LocalProcessBackendConfig
from trainjob.backends.local.store import Store
from trainjob.errors import NotFoundError

sys.path.insert(0, str(Path(__file__).parent))
from store_workers import job_row  # noqa: E402

LOST_PID = 2**22 + 17  # above the default pid_max: no process has it


def test_listing_skips_jobs_deleted_while_it_checks_their_supervisors(trainjob_home, monkeypatch):
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    for name in ("kept", "doomed"):
        backend.store.insert_job({**job_row(name), "status": "Running", "supervisor_pid": LOST_PID if name == "doomed"
                                  else os.getpid()})
    other = Store.open(trainjob_home)  # another client, deleting "doomed" the moment its supervisor is checked
    real_is_alive = processes.is_alive

    def deleted_meanwhile(pid, started):
        if pid == LOST_PID:
            other.delete_job("doomed")
        return real_is_alive(pid, started)

    monkeypatch.setattr(processes, "is_alive", deleted_meanwhile)

    assert [job.name for job in backend.list_jobs()] == ["kept"]
    backend.store.insert_job({**job_row("doomed"), "status": "Running", "supervisor_pid": LOST_PID})
    assert [summary.name for summary in backend.list_summaries()] == ["kept"]


def test_one_backend_shared_by_threads_reads_and_writes_without_errors(trainjob_home):
    backend = LocalBackend(LocalProcessBackendConfig(home=trainjob_home))
    errors: list[str] = []
    stop = threading.Event()

    def churn(worker: int) -> None:
        count = 0
        while not stop.is_set():
            name = f"w{worker}-{count}"
            count += 1
            try:
                backend.store.insert_job({**job_row(name, created=time.time()), "status": "Running",
                                          "supervisor_pid": os.getpid()})
                backend.store.add_metrics(name, [{"time": time.time(), "step": 1, "metrics": {"loss": 1.0}}])
                backend.store.delete_job(name)
            except Exception as exc:  # noqa: BLE001 - every error is the finding
                errors.append(f"writer: {exc!r}")

    def read() -> None:
        while not stop.is_set():
            try:
                for job in backend.list_jobs():
                    with contextlib.suppress(NotFoundError):  # deleted since it was listed: a fair answer
                        backend.get_job(job.name)
                backend.list_summaries()
            except Exception as exc:  # noqa: BLE001
                errors.append(f"reader: {exc!r}")

    threads = [threading.Thread(target=churn, args=(w,)) for w in range(2)] + [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join(30)

    assert errors == []
