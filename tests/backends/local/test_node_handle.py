"""A supervisor's handle on a node's keeper wakes it the moment the keeper exits (its pidfd)."""

from __future__ import annotations

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
