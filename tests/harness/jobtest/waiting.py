"""Test support shared by every backend's test kit: waiting for a condition that other processes bring about.

::

    wait_until(lambda: backend.get_job("mnist").status == "Running", timeout=30, what="mnist to run")
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05, what: str = "the condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy and return that; ``AssertionError`` naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def run_held_to_runnable_time(
    command: list[str], timeout: float, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True, timeout=timeout)``, but ``timeout`` counts the time
    the process and its children could run (:class:`trainjob.runnable.RunnableClock`): beside other test
    sessions on a busy machine, a job that only waited for the cores is not taken for a hang. The whole process tree
    is killed when the limit passes."""
    import psutil

    from trainjob.backends.local.processes import tree_pids
    from trainjob.runnable import RunnableClock

    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen) as proc:

        def tree() -> list[int]:
            return tree_pids([proc.pid])

        clock = RunnableClock(tree)
        outputs: list[str] = []
        while True:
            try:
                outputs = list(proc.communicate(timeout=0.5))
                break
            except subprocess.TimeoutExpired:
                if clock.read() > timeout:
                    killed = []
                    for pid in reversed(tree()):
                        with contextlib.suppress(psutil.Error):
                            process = psutil.Process(pid)
                            process.kill()
                            killed.append(process)
                    out, err = proc.communicate()
                    # A SIGKILLed process still runs until the kernel schedules its exit, which on a loaded
                    # machine is not at once: return only once the tree is gone (or a zombie awaiting its reaper).
                    _, alive = psutil.wait_procs(killed, timeout=60)
                    alive = [p for p in alive if _status(p) not in (None, psutil.STATUS_ZOMBIE)]
                    if alive:
                        raise RuntimeError(f"processes {[p.pid for p in alive]} outlived SIGKILL for 60 s") from None
                    raise subprocess.TimeoutExpired(command, timeout, output=out, stderr=err) from None
        return subprocess.CompletedProcess(command, proc.returncode, outputs[0], outputs[1])


def _status(process: Any) -> str | None:
    import psutil

    try:
        return process.status()
    except psutil.Error:
        return None
