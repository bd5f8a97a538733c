"""What went wrong when a checkpoint could not be saved: a full disk, or another cause, as an ordinary exception.

``torch.distributed.checkpoint`` reports a failed save as ``CheckpointException``, a ``BaseException`` whose text
is every rank's traceback; a full disk often shows there only as ``RuntimeError: [enforce fail at
inline_container.cc:...] unexpected pos ...`` (torch's zip writer loses the ``OSError``). :func:`save_failure`
turns it into a :class:`~trainjob.errors.CheckpointError` a script can catch, or a
:class:`~trainjob.errors.DiskFullError` when the filesystem is full:

==========================================  ====================================================================
the save is taken for a full disk when      an ``OSError`` with ``errno.ENOSPC`` is among the ranks' errors (or
                                            their causes), or the checkpoint's filesystem has less than
                                            :data:`FULL_SLACK_BYTES` (or 1 % of the checkpoint) left when it failed
``needed``                                  the checkpoint's size: the bytes of every tensor saved, at their full
                                            (unsharded) size, counted once (:func:`state_bytes`)
``free``                                    what the filesystem has left once the unfinished checkpoint is removed
==========================================  ====================================================================

What a job does about a full disk is ``on_disk_full`` (:func:`on_disk_full_setting`): ``fail`` (the default)
raises, ``continue`` skips that checkpoint and trains on. A job sets it without touching its script through the
trainer's environment, ``TRAINJOB_CHECKPOINT_ON_DISK_FULL=continue``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from trainjob.errors import CheckpointError, DiskFullError, ValidationError
from trainjob.rootcause import first_line
from trainjob.units import format_bytes

__all__ = [
    "ON_DISK_FULL_ENV", "ON_DISK_FULL_VALUES", "available_bytes", "is_disk_full", "load_failure", "on_disk_full_setting",
    "save_failure", "state_bytes",
]

ON_DISK_FULL_ENV = "TRAINJOB_CHECKPOINT_ON_DISK_FULL"
ON_DISK_FULL_VALUES = ("fail", "continue")
#: A filesystem with less than this left (or 1 % of the checkpoint, whichever is more) when a save failed is full.
FULL_SLACK_BYTES = 1 << 20


def on_disk_full_setting(value: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """``fail`` or ``continue``: ``value`` when given, else ``$TRAINJOB_CHECKPOINT_ON_DISK_FULL``, else ``fail``.

    >>> on_disk_full_setting(None, {"TRAINJOB_CHECKPOINT_ON_DISK_FULL": "continue"})
    'continue'
    """
    field, chosen = ("on_disk_full", value) if value is not None else (ON_DISK_FULL_ENV, environ.get(ON_DISK_FULL_ENV))
    if chosen is None or chosen == "":
        return "fail"
    if chosen not in ON_DISK_FULL_VALUES:
        raise ValidationError(field, f"must be 'fail' or 'continue', got {chosen!r}")
    return chosen


def state_bytes(state: Any) -> int:
    """Bytes of every tensor in ``state`` (nested dicts, lists, tuples) at its full size: a DTensor counts its
    global shape, so every rank finds the size of the whole checkpoint, which DCP writes once across the ranks."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, Mapping):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    return 0


def available_bytes(path: Path) -> int | None:
    """What a process of this user can still write on ``path``'s filesystem (root may use the reserved blocks)."""
    for candidate in (path, *path.parents):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        blocks = stats.f_bfree if os.geteuid() == 0 else stats.f_bavail
        return blocks * stats.f_frsize
    return None


def _errors(failure: BaseException) -> Iterator[BaseException]:
    """``failure``, each rank's error when it is a ``CheckpointException``, and their causes."""
    pending = [failure]
    seen: set[int] = set()
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        if isinstance(error, CheckpointException):
            pending += [wrapped[0] for wrapped in error.failures.values()]
        pending += [e for e in (error.__cause__, error.__context__) if e is not None]


def _describe(failure: BaseException) -> str:
    """`` on ranks 0, 1: RuntimeError: ...`` for a ``CheckpointException``, else ``: `` and the error's first line."""
    if isinstance(failure, CheckpointException) and failure.failures:
        ranks = sorted(failure.failures)
        error = failure.failures[ranks[0]][0]
        where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        return f" on {where}: {type(error).__name__}: {first_line(str(error))}"
    return f": {type(failure).__name__}: {first_line(str(failure))}"


def is_disk_full(failure: BaseException, path: Path, needed: int) -> bool:
    """Whether ``failure`` of a save to ``path`` was a full filesystem (see the module's table); call it before
    the unfinished checkpoint is removed."""
    if any(isinstance(error, OSError) and error.errno == errno.ENOSPC for error in _errors(failure)):
        return True
    left = available_bytes(path)
    return left is not None and left < max(FULL_SLACK_BYTES, needed // 100)


def save_failure(failure: BaseException, path: Path, needed: int, full: bool) -> CheckpointError:
    """The exception a failed save of the checkpoint at ``path`` raises; ``full`` from :func:`is_disk_full`, and
    the unfinished checkpoint already removed (what is free is measured now)."""
    if full:
        free = available_bytes(path)
        sizes = f"needed ~{format_bytes(needed)}" + ("" if free is None else f", {format_bytes(free)} free")
        return DiskFullError(str(path), needed, free, sizes)
    return CheckpointError(f"saving the checkpoint {path} failed{_describe(failure)}")


def load_failure(failure: CheckpointException, path: Path) -> CheckpointError:
    """The exception a failed load of the checkpoint at ``path`` raises instead of torch's ``CheckpointException``."""
    return CheckpointError(f"loading the checkpoint {path} failed{_describe(failure)}")
