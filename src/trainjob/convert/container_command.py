"""Read a PyTorchJob container's launch command: which launcher, which torchrun options, what it runs.

In a v1 PyTorchJob the command often repeats what the operator injected (``--nnodes=$(WORLD_SIZE)``,
``--node_rank=$(RANK)``, ``--master_addr=$(MASTER_ADDR)``). A TrainJob's runtime gives torchrun these through
``PET_*`` variables instead, and options on the command line would override them, so they are taken out:

===============================================  =================================================================
written                                          becomes
===============================================  =================================================================
``torchrun OPTS script ARGS``                    ``torchrun OPTS' script ARGS``
``python -m torch.distributed.run OPTS ...``     the same launcher, ``OPTS'``
``python -m torch.distributed.launch OPTS ...``  the same launcher, ``OPTS'`` (it reads ``PET_*`` as torchrun does)
``python script.py ARGS``, ``python -m mod``     ``torchrun script.py ARGS`` / ``torchrun -m mod``: one process per
                                                 node, ``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set as v1 set them
anything else (``bash -c ...``)                  kept as it is
===============================================  =================================================================

``OPTS'`` is ``OPTS`` without ``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``,
``--nproc-per-node`` (read into ``numProcPerNode``) and the ``--rdzv-*`` options; ``_`` and ``-`` spellings are
the same option.

>>> launch = read_container_command(["torchrun", "--nproc_per_node=8", "--nnodes=$(WORLD_SIZE)", "train.py", "--lr=1"])
>>> launch.command, launch.nproc_per_node, launch.dropped["nnodes"]
(['torchrun', 'train.py', '--lr=1'], '8', '$(WORLD_SIZE)')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: torchrun options given by the runtime's ``PET_*`` variables (canonical ``-`` spelling, no leading dashes).
RUNTIME_OPTIONS = ("nnodes", "node-rank", "master-addr", "master-port", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
                   "rdzv-conf", "nproc-per-node")
#: torchrun / torch.distributed.launch options that take no value.
FLAG_OPTIONS = ("standalone", "module", "no-python", "run-path", "use-env", "m")
_PYTHON = re.compile(r"(.*/)?python(3(\.\d+)?)?")
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass
class ContainerCommand:
    """A container command read by :func:`read_container_command`."""

    #: The command the TrainJob runs (launcher, kept options, script and its arguments).
    command: list[str]
    #: ``torchrun``, ``torch.distributed.run``, ``torch.distributed.launch``, ``python`` (wrapped into torchrun)
    #: or ``other`` (kept as it is).
    launcher: str
    #: ``--nproc-per-node`` as written, if given.
    nproc_per_node: str | None = None
    #: The runtime-given options taken out, by canonical name, with their values.
    dropped: dict[str, str] = field(default_factory=dict)

    @property
    def wrapped(self) -> bool:
        """Whether a plain ``python`` command now runs under torchrun (one process per node)."""
        return self.launcher == "python"


def read_container_command(tokens: list[str]) -> ContainerCommand:
    """The launch command for a container's ``command + args`` (see the module docstring)."""
    if not tokens:
        return ContainerCommand(command=[], launcher="other")
    head = tokens[0]
    if head.rsplit("/", 1)[-1] == "torchrun":
        return _torchrun(tokens[:1], tokens[1:], "torchrun")
    if _PYTHON.fullmatch(head):
        rest = tokens[1:]
        if rest[:1] == ["-m"] and rest[1:2] and rest[1] in _LAUNCHER_MODULES:
            return _torchrun(tokens[:3], tokens[3:], rest[1])
        if rest[:1] == ["-m"] and rest[1:2]:
            return ContainerCommand(command=["torchrun", "-m", *rest[1:]], launcher="python")
        if rest and not rest[0].startswith("-"):
            return ContainerCommand(command=["torchrun", *rest], launcher="python")
    return ContainerCommand(command=list(tokens), launcher="other")


def _canonical(option: str) -> str:
    return option.lstrip("-").replace("_", "-")


def _torchrun(launcher: list[str], args: list[str], name: str) -> ContainerCommand:
    kept: list[str] = []
    dropped: dict[str, str] = {}
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("-") or token == "--":
            break  # the script (or module) and its own arguments start here
        option, has_value, value = token.partition("=")
        canonical = _canonical(option)
        if canonical in ("m", "module"):
            kept.append(token)
            index += 1
            break  # the next token is the module to run
        takes_value = not has_value and canonical not in FLAG_OPTIONS
        if takes_value and index + 1 < len(args):
            value = args[index + 1]
        if canonical in RUNTIME_OPTIONS:
            dropped[canonical] = value
        else:
            kept.append(token)
            if takes_value and index + 1 < len(args):
                kept.append(args[index + 1])
        index += 2 if takes_value else 1
    return ContainerCommand(
        command=[*launcher, *kept, *args[index:]],
        launcher=name,
        nproc_per_node=dropped.get("nproc-per-node"),
        dropped={k: v for k, v in dropped.items() if k != "nproc-per-node"},
    )
