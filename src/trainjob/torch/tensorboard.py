"""TensorBoard event files from :func:`trainjob.torch.report`, one run per job.

Off unless ``TRAINJOB_TENSORBOARD=1`` (``trainjob run train.py --env TRAINJOB_TENSORBOARD=1``) and the
``tensorboard`` package is installed. Rank 0 writes into ``$TRAINJOB_TENSORBOARD_DIR`` when set, else into its
job's directory, so every local job is one run of ``tensorboard --logdir $TRAINJOB_HOME/jobs``, named after the
job; outside a job (plain ``python train.py``) it writes under ``./runs``, as PyTorch's ``SummaryWriter`` does.
Each metric is a scalar under its own name, at the reported ``step`` (or a count of reports when there is none).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from trainjob.constants import JOB_DIR_ENV

TENSORBOARD_ENV = "TRAINJOB_TENSORBOARD"
TENSORBOARD_DIR_ENV = "TRAINJOB_TENSORBOARD_DIR"
#: How often the writer flushes to disk, so a running job's curves show up in TensorBoard without waiting long.
FLUSH_SECONDS = 2

_writer: Any = None
_disabled = False
_count = 0


def enabled() -> bool:
    return os.environ.get(TENSORBOARD_ENV, "").lower() in ("1", "true", "yes", "on")


def log_dir() -> str | None:
    """Where this process's run goes; ``None`` means SummaryWriter's own default (``./runs/...``)."""
    return os.environ.get(TENSORBOARD_DIR_ENV) or os.environ.get(JOB_DIR_ENV) or None


def write_scalars(values: dict[str, float], step: int | None) -> None:
    """Add ``values`` to this process's run when TensorBoard output is on; warns once when it cannot be."""
    global _writer, _disabled, _count
    if _disabled or not enabled():
        return
    if _writer is None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            _disabled = True
            print(f"trainjob: {TENSORBOARD_ENV} is set but TensorBoard is not installed ({exc}); "
                  "pip install tensorboard", file=sys.stderr, flush=True)
            return
        _writer = SummaryWriter(log_dir=log_dir(), flush_secs=FLUSH_SECONDS)
        atexit.register(close)
    _count += 1
    for name, value in values.items():
        _writer.add_scalar(name, value, global_step=step if step is not None else _count)


def close() -> None:
    """Flush and close the run (also done at exit)."""
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None
