"""The node's process of a keeper started ahead of its job, started before the node is known (:mod:`.warm`).

A supervisor in standby starts its keepers with :data:`AHEAD_FLAG` and writes each, first thing, one line: the
environment a node would start with (:func:`~trainjob.backends.local.node_env.launcher_env`). The keeper's entry
point starts the launcher from it (:meth:`Launcher.start`) before it imports anything else, so that the
launcher's imports begin as early as they can; the keeper then hands it the node (:meth:`Launcher.give`) or lets
it go (:meth:`Launcher.dismiss`). Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: How a keeper started ahead of its job is started: its first line of stdin starts a launcher (:class:`Launcher`).
AHEAD_FLAG = "--ahead"
WARM_SCRIPT = str(Path(__file__).with_name("warm.py"))


class Launcher:
    """The node's process, started ahead of the node by a keeper started ahead (:mod:`.warm`): torchrun with
    its imports under way, which becomes the node's process when :meth:`give` hands it the node."""

    def __init__(self, process: subprocess.Popen[bytes], output: int) -> None:
        self.process, self.output = process, output

    @classmethod
    def start(cls, line: bytes) -> Launcher | None:
        """Start the launcher that ``line`` asks for (JSON: ``env``, the environment a node would start with),
        or ``None`` (none asked for, or it cannot start: the node is started as it comes)."""
        try:
            env = json.loads(line)["env"] if line.strip() else None
        except (ValueError, KeyError, TypeError):
            env = None
        if not isinstance(env, dict):
            return None
        output, write_end = os.pipe()
        try:
            process = subprocess.Popen([sys.executable, WARM_SCRIPT, str(os.getpid())], env=env, stdin=subprocess.PIPE,
                                       stdout=write_end, stderr=write_end, process_group=0)
        except OSError:
            os.close(output)
            return None
        finally:
            os.close(write_end)
        return cls(process, output)

    def give(self, spec: dict[str, Any], cpus: list[int]) -> tuple[subprocess.Popen[bytes], int] | None:
        """Hand the launcher its node: the node's process and the read end of its output, or ``None`` when the
        launcher is gone (the node is then started as it would have been without one)."""
        if self.process.poll() is not None:  # it failed to start, or was killed
            return None
        order = {"node": spec["node"], "argv": spec["argv"], "cwd": spec["cwd"], "env": spec["env"], "cpus": cpus}
        try:
            self.process.stdin.write(json.dumps(order).encode() + b"\n")  # type: ignore[union-attr]
            self.process.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            return None
        return self.process, self.output

    def dismiss(self) -> None:
        """No node for the launcher: it is killed (it holds nothing, and may be busy importing)."""
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.close(self.output)
        self.process.kill()
        self.process.wait()
