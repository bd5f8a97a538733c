"""Warm keepers: the keepers a warm supervisor (:mod:`~trainjob.backends.local.supervisor.warm`) starts before its
job exists.

Each waits on its stdin for a node, its imports done, and starts its node's warm torchrun at once
(:mod:`~trainjob.backends.local.node_keeper.warm_node`); :meth:`NodeHandle.start
<trainjob.backends.local.supervisor.nodes.NodeHandle.start>` takes them in turn (:func:`take_warm_keeper`) and
:func:`release_warm_keepers` lets the others go (end of stdin: they exit, their warm torchruns with them). The
supervisor's entry point starts them before it imports the supervisor, so this imports only what they need.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from trainjob.backends.local.node_env import warm_node_env
from trainjob.backends.local.node_keeper.warm_node import WARM_KEEPER_FLAG

#: How a supervisor starts a node's keeper (a warm one gets :data:`WARM_KEEPER_FLAG` too).
KEEPER_ARGV = [sys.executable, "-m", "trainjob.backends.local.node_keeper"]
#: Warm keepers still waiting for a node.
_warm: list[subprocess.Popen[bytes]] = []
_released: list[subprocess.Popen[bytes]] = []


def start_warm_keepers(count: int) -> None:
    """Start ``count`` warm keepers that wait for a node (:meth:`.nodes.NodeHandle.start` takes them in turn). They
    stay in this process's group until given a node (then each starts a session of its own, as keepers do), so a
    warm supervisor stopped with its group takes them with it."""
    if count < 1:
        return
    warm_node = (json.dumps({"env": warm_node_env(os.environ, sys.executable)}) + "\n").encode()
    for _ in range(count):
        try:
            keeper = subprocess.Popen([*KEEPER_ARGV, WARM_KEEPER_FLAG], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:  # the nodes get keepers started for them instead
            return
        _warm.append(keeper)
        with contextlib.suppress(BrokenPipeError):
            keeper.stdin.write(warm_node)  # type: ignore[union-attr]
            keeper.stdin.flush()  # type: ignore[union-attr]


def release_warm_keepers(wait: bool = True) -> None:
    """Let the warm keepers that no node took go: their stdin ends, and they exit (``wait``: reaped before this
    returns; else by the next call that waits)."""
    while _warm:
        keeper = _warm.pop()
        with contextlib.suppress(OSError):
            keeper.stdin.close()  # type: ignore[union-attr]
        _released.append(keeper)
    while wait and _released:
        with contextlib.suppress(subprocess.TimeoutExpired):
            _released.pop().wait(5)


def take_warm_keeper() -> subprocess.Popen[bytes] | None:
    """The next warm keeper that still waits for a node (no longer this module's to release), or ``None``."""
    while _warm:
        keeper = _warm.pop(0)
        if keeper.poll() is None:
            return keeper
        keeper.wait()
    return None
