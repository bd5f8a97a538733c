"""A node as its supervisor sees it: the node's keeper, started by this supervisor or adopted from a lost one.

A supervisor waits for the keepers it started; one that replaced a lost supervisor cannot (they are not its
children), so it watches their pids and reads how each node ended from the record the keeper writes before it
exits (:mod:`trainjob.backends.local.node_keeper`)::

    node = NodeHandle.start(job_dir, 0, keeper_spec)        # a keeper of this supervisor
    node = NodeHandle.adopt(job_dir, store.nodes(name)[0])  # a keeper of a lost supervisor
    node.poll()   # None while it runs, else the node's exit code (negative: killed by that signal)

A warm supervisor (:mod:`~trainjob.backends.local.supervisor.warm`) starts warm keepers for the job it expects
too (:mod:`~trainjob.backends.local.supervisor.warm_keepers`); :meth:`NodeHandle.start` hands the first ones
their nodes (the keeper then writes to the job's ``supervisor.log`` itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from trainjob.backends.local import processes
from trainjob.backends.local.node_keeper.keeper import exit_record_path
from trainjob.backends.local.node_keeper.warm_node import WARM_TORCHRUN_SCRIPT
from trainjob.backends.local.supervisor.failures import NodeExit
from trainjob.backends.local.supervisor.warm_keepers import KEEPER_ARGV, take_warm_keeper


def _node_processes(keeper: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in keeper.children():
        with contextlib.suppress(psutil.Error):
            if WARM_TORCHRUN_SCRIPT not in child.cmdline()[1:2]:
                found.append(child)
    return found


class NodeHandle:
    """One node's keeper: ``poll``, ``terminate``, ``kill``, ``wait`` and, once it ended, ``exit``."""

    def __init__(self, job_dir: Path, index: int, pid: int, started: float | None,
                 popen: subprocess.Popen[bytes] | None = None, code: int | None = None) -> None:
        self.job_dir, self.index, self.pid, self.started = job_dir, index, pid, started
        self.popen = popen
        self.code = code
        self.exit: NodeExit | None = NodeExit.read(exit_record_path(job_dir, index)) if code is not None else None
        self._pidfd: int | None = None

    @classmethod
    def start(cls, job_dir: Path, index: int, spec: dict[str, Any]) -> NodeHandle:
        """Start the keeper of node ``index`` with ``spec`` (see :class:`~trainjob.backends.local.node_keeper.keeper.Keeper`)."""
        with contextlib.suppress(FileNotFoundError):
            exit_record_path(job_dir, index).unlink()
        popen = take_warm_keeper()
        if popen is not None:  # started before the job's folder existed: it opens the job's log itself
            spec = {**spec, "own_output": True}
        else:
            with (job_dir / "supervisor.log").open("ab") as log:
                popen = subprocess.Popen(KEEPER_ARGV, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        with contextlib.suppress(BrokenPipeError):  # a keeper that died at once is seen by poll()
            popen.stdin.write(json.dumps(spec).encode())
            popen.stdin.close()
        return cls(job_dir, index, popen.pid, processes.start_time(popen.pid), popen=popen)

    @classmethod
    def adopt(cls, job_dir: Path, row: dict[str, Any]) -> NodeHandle:
        """The keeper a node row names; a node recorded as ended keeps its recorded exit code."""
        ended = row["status"] != "Running"
        code = (row["exit_code"] or 0) if ended else None
        return cls(job_dir, row["idx"], row["pid"], row["pid_started"], code=code)

    @property
    def adopted(self) -> bool:
        return self.popen is None

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        if self.popen is not None:
            if self.popen.poll() is None:
                return None
        elif processes.is_alive(self.pid, self.started):
            return None
        self.exit = NodeExit.read(exit_record_path(self.job_dir, self.index))
        if self.exit is None:  # the keeper was killed: nothing is known but that the node is gone
            code = self.popen.returncode if self.popen is not None and self.popen.returncode < 0 else -signal.SIGKILL
            self.exit = NodeExit(code=code, time=time.time(), ranks=[], lost=True)
        self.code = self.exit.code
        self._close_pidfd()
        return self.code

    def pidfd(self) -> int | None:
        """A descriptor that polls readable once the keeper has exited (``None`` once its end is recorded, or
        when it cannot be had): lets the supervisor wake the moment a node ends instead of at its next poll."""
        if self.code is not None:
            self._close_pidfd()
            return None
        if self._pidfd is None:
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:  # gone already (poll() will say so), or no pidfds here
                return None
        return self._pidfd

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def wait_started(self, timeout: float) -> None:
        """Wait until the keeper has started its node process (or ended); a warm torchrun it is letting go
        (:class:`~trainjob.backends.local.node_keeper.warm_node.WarmNode`) is not that process."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(psutil.Error):
            keeper = psutil.Process(self.pid)
            while not _node_processes(keeper) and self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.poll()

    def _signal(self, sig: signal.Signals) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
