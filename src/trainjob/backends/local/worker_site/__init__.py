"""The directory a local job's node processes find first on ``PYTHONPATH``: it holds only ``sitecustomize.py``.

Python imports ``sitecustomize`` at start-up, so every Python process of a node (torchrun and each training
process) runs it before the user's code; it then loads the ``sitecustomize`` it shadows, if there is one. See
:mod:`trainjob.backends.local.worker_site.sitecustomize` for what it does, and
:func:`trainjob.backends.local.process_specs.node_environment` for how the directory is put on the path.
"""

from __future__ import annotations

import signal
from pathlib import Path

#: The directory to put first on a node's ``PYTHONPATH``.
SITE_DIR = str(Path(__file__).resolve().parent)
#: Where each training process's stack dumps go (``rank-<RANK>-<pid>.txt``), and the signal that asks for one:
#: a real-time signal, which no library that training scripts use takes for itself (SLURM jobs use SIGUSR1/2).
STACKS_DIR_ENV = "TRAINJOB_STACKS_DIR"
STACKS_SIGNAL_ENV = "TRAINJOB_STACKS_SIGNAL"
STACKS_SIGNAL = signal.SIGRTMIN + 3
