"""Logging from rank 0 only: one copy of every line instead of one per process.

::

    print0(f"epoch {epoch}: loss {loss:.4f}")
    log = get_logger(__name__)
    log.info("saved checkpoint %s", path)       # printed by rank 0, dropped elsewhere
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from trainjob.torch.env import global_rank

__all__ = ["get_logger", "print0"]


def print0(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0, nothing on the other ranks; flushes so lines interleave with other output."""
    if global_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


class _MainRankOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Looked up per record: the process group may be initialised after the logger was made.
        return global_rank() == 0


def get_logger(name: str = "trainjob", level: int = logging.INFO) -> logging.Logger:
    """A logger whose records are emitted on global rank 0 only, to stderr, with time and level.

    Calling it again with the same name returns the same logger without adding handlers.
    """
    logger = logging.getLogger(name)
    if not any(isinstance(f, _MainRankOnly) for f in logger.filters):
        logger.addFilter(_MainRankOnly())
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    return logger
