"""A warm keeper's warm torchrun: the node's process, started before the node is known (:mod:`.warm_torchrun`).

A warm supervisor starts its keepers with :data:`WARM_KEEPER_FLAG` and writes each, first thing, one line: the
environment a node would start with (:func:`~trainjob.backends.local.node_env.warm_node_env`). The keeper's entry
point starts the warm torchrun from it (:meth:`WarmNode.start`) before it imports anything else, so that its
imports begin as early as they can; the keeper then hands it the node (:meth:`WarmNode.give`) or lets it go
(:meth:`WarmNode.dismiss`). Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: How a warm keeper is started: its first line of stdin starts a warm torchrun (:class:`WarmNode`).
WARM_KEEPER_FLAG = "--warm"
WARM_TORCHRUN_SCRIPT = str(Path(__file__).with_name("warm_torchrun.py"))


class WarmNode:
    """A warm keeper's handle on its warm torchrun (:mod:`.warm_torchrun`): torchrun with its imports under way,
    started before the node is known, which becomes the node's process when :meth:`give` hands it the node."""

    def __init__(self, process: subprocess.Popen[bytes], output: int) -> None:
        self.process, self.output = process, output

    @classmethod
    def start(cls, line: bytes) -> WarmNode | None:
        """Start the warm torchrun that ``line`` asks for (JSON: ``env``, the environment a node would start with),
        or ``None`` (none asked for, or it cannot start: the node is started as it comes)."""
        try:
            env = json.loads(line)["env"] if line.strip() else None
        except (ValueError, KeyError, TypeError):
            env = None
        if not isinstance(env, dict):
            return None
        output, write_end = os.pipe()
        try:
            process = subprocess.Popen([sys.executable, WARM_TORCHRUN_SCRIPT, str(os.getpid())], env=env,
                                       stdin=subprocess.PIPE, stdout=write_end, stderr=write_end, process_group=0)
        except OSError:
            os.close(output)
            return None
        finally:
            os.close(write_end)
        return cls(process, output)

    def give(self, spec: dict[str, Any], cpus: list[int]) -> tuple[subprocess.Popen[bytes], int] | None:
        """Hand the warm torchrun its node: the node's process and the read end of its output, or ``None`` when
        it is gone (the node is then started as it would have been without one)."""
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
        """No node for the warm torchrun: it is killed (it holds nothing, and may be busy importing)."""
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.close(self.output)
        self.process.kill()
        self.process.wait()
