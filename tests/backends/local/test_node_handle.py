"""A supervisor's handle on a node's keeper wakes it the moment the keeper exits (its pidfd)."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys

import pytest

from trainjob.backends.local.supervisor.nodes import NodeHandle


def test_a_keepers_pidfd_is_readable_once_it_exits_and_closed_once_its_end_is_recorded(subprocesses, tmp_path):
    (tmp_path / "logs").mkdir()
    keeper = subprocesses.popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    handle = NodeHandle(tmp_path, 0, keeper.pid, None, popen=keeper)

    fd = handle.pidfd()
    assert fd is not None and handle.pidfd() == fd, "one descriptor per keeper"
    assert select.select([fd], [], [], 0)[0] == [], "not readable while the keeper runs"

    keeper.stdin.close()
    select.select([fd], [], [], 60)

    assert select.select([fd], [], [], 0)[0] == [fd]
    assert handle.poll() is not None
    assert handle.pidfd() is None
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_watched_supervisor_is_asked_about_through_its_pidfd_until_it_ends(subprocesses, monkeypatch):
    from trainjob.backends.local import processes

    supervisor = subprocesses.popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    started = processes.start_time(supervisor.pid)
    watched = processes.Watched(limit=1)
    assert not watched.alive(supervisor.pid, (started or 0) - 60), "another process that had this pid once"
    assert watched.alive(supervisor.pid, started)

    looked_in_proc = []
    real_is_alive = processes.is_alive
    monkeypatch.setattr(processes, "is_alive", lambda *args: looked_in_proc.append(args) or real_is_alive(*args))
    assert all(watched.alive(supervisor.pid, started) for _ in range(50))
    assert looked_in_proc == [], "asked again: its pidfd, not /proc"

    supervisor.stdin.close()
    supervisor.wait(60)  # reaped: a zombie would have to read as ended too, which the pidfd does
    assert not watched.alive(supervisor.pid, started)
    assert not watched.alive(supervisor.pid, started), "its pidfd let go, the pid no longer runs"
    assert watched._fds == {}


def test_watched_holds_at_most_its_limit_of_pidfds(subprocesses):
    from trainjob.backends.local import processes

    sleepers = [subprocesses.popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    watched = processes.Watched(limit=2)
    for sleeper in sleepers:
        assert watched.alive(sleeper.pid, processes.start_time(sleeper.pid))
    assert [pid for pid, _ in watched._fds] == [sleepers[1].pid, sleepers[2].pid], "the longest held let go first"
    fds = list(watched._fds.values())
    watched.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_processs_start_time_is_psutils_even_when_its_name_has_spaces_and_parentheses(subprocesses):
    import psutil

    from trainjob.backends.local import processes

    renamed = subprocesses.popen([sys.executable, "-c", (
        "import ctypes, sys; ctypes.CDLL(None).prctl(15, b'a b) (c', 0, 0, 0); print('ok', flush=True); "
        "sys.stdin.read()")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert renamed.stdout.readline() == "ok\n"
    assert psutil.Process(renamed.pid).name() == "a b) (c"
    for pid in (os.getpid(), renamed.pid):
        assert processes.start_time(pid) == pytest.approx(psutil.Process(pid).create_time(), abs=1e-6)
    assert processes.is_alive(renamed.pid, processes.start_time(renamed.pid))
    started = processes.start_time(renamed.pid)
    renamed.stdin.close()
    os.waitid(os.P_PID, renamed.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
    assert psutil.Process(renamed.pid).status() == psutil.STATUS_ZOMBIE
    assert not processes.is_alive(renamed.pid, started)
    renamed.wait(60)
    assert processes.start_time(renamed.pid) is None
    assert not processes.is_alive(renamed.pid, started)


def test_warm_keepers_take_nodes_in_turn_and_the_rest_exit_when_released(subprocesses, tmp_path):
    import time

    from trainjob.backends.local.supervisor import nodes, warm_keepers

    (tmp_path / "logs").mkdir()
    supervising = os.open(tmp_path / "supervisor.lock", os.O_WRONLY | os.O_CREAT)  # as this job's supervisor
    fcntl.flock(supervising, fcntl.LOCK_EX)
    warm_keepers.start_warm_keepers(2)
    warm = list(warm_keepers._warm)
    spec = {"home": str(tmp_path), "name": "job", "job_dir": str(tmp_path), "node": 0, "cwd": str(tmp_path),
            "argv": [sys.executable, "-c", "import time; print('node ran', flush=True); time.sleep(2)"],
            "env": {"PATH": os.environ["PATH"]}, "cpus": [],
            "log_max_bytes": 1 << 20, "mounts": []}
    handle = nodes.NodeHandle.start(tmp_path, 0, spec)
    assert handle.popen is warm[0], "the first warm keeper takes the first node"
    warm_keepers.release_warm_keepers()
    assert warm[1].returncode == 0, "the other one ended at the end of its stdin, saying nothing"
    deadline = time.monotonic() + 30
    while os.getsid(handle.pid) != handle.pid and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.getsid(handle.pid) == handle.pid, "the keeper given a node leads a session of its own, as keepers do"
    assert handle.popen.wait(60) == 0
    assert "node ran" in (tmp_path / "logs" / "node-0.log").read_text()
    os.close(supervising)
