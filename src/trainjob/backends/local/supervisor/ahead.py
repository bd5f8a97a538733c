"""Keepers a supervisor in standby starts ahead of its job (:mod:`~trainjob.backends.local.supervisor.standby`).

Each keeper waits on its stdin for a node, its imports done, and starts its node's launcher at once
(:mod:`~trainjob.backends.local.node_keeper.launcher`); :meth:`NodeHandle.start
<trainjob.backends.local.supervisor.nodes.NodeHandle.start>` takes them in turn (:func:`keeper_ahead`) and
:func:`release_keepers_ahead` lets the others go (end of stdin: they exit, their launchers with them). The
supervisor's entry point starts them before it imports the supervisor, so this imports only what they need.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from trainjob.backends.local.node_env import launcher_env
from trainjob.backends.local.node_keeper.launcher import AHEAD_FLAG

#: How a supervisor starts a node's keeper (one started ahead gets :data:`AHEAD_FLAG` too).
KEEPER_ARGV = [sys.executable, "-m", "trainjob.backends.local.node_keeper"]
#: Keepers started ahead of their job, waiting for a node.
_ahead: list[subprocess.Popen[bytes]] = []
_released: list[subprocess.Popen[bytes]] = []


def start_keepers_ahead(count: int) -> None:
    """Start ``count`` keepers that wait for a node (:meth:`.nodes.NodeHandle.start` takes them in turn). They stay in
    this process's group until given a node (then each starts a session of its own, as keepers do), so a standby
    stopped with its group takes them with it."""
    if count < 1:
        return
    launcher = (json.dumps({"env": launcher_env(os.environ, sys.executable)}) + "\n").encode()
    for _ in range(count):
        try:
            keeper = subprocess.Popen([*KEEPER_ARGV, AHEAD_FLAG], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        except OSError:  # the nodes get keepers started for them instead
            return
        _ahead.append(keeper)
        with contextlib.suppress(BrokenPipeError):
            keeper.stdin.write(launcher)  # type: ignore[union-attr]
            keeper.stdin.flush()  # type: ignore[union-attr]


def release_keepers_ahead(wait: bool = True) -> None:
    """Let the keepers started ahead that no node took go: their stdin ends, and they exit (``wait``: reaped
    before this returns; else by the next call that waits)."""
    while _ahead:
        keeper = _ahead.pop()
        with contextlib.suppress(OSError):
            keeper.stdin.close()  # type: ignore[union-attr]
        _released.append(keeper)
    while wait and _released:
        with contextlib.suppress(subprocess.TimeoutExpired):
            _released.pop().wait(5)


def keeper_ahead() -> subprocess.Popen[bytes] | None:
    """The next keeper started ahead that still waits for a node (no longer this module's to release), or
    ``None``."""
    while _ahead:
        keeper = _ahead.pop(0)
        if keeper.poll() is None:
            return keeper
        keeper.wait()
    return None
