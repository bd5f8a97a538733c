"""Stacks a Kubernetes job's ranks write to their own logs (:mod:`trainjob.torch.rank_stacks`), when they stop
reporting (the operator reads them back when it finds the job stalled) or when ``trainjob stacks NAME`` asks (it
reads them back itself): when a rank writes them, and their format (the :mod:`faulthandler` dump, each line prefixed
with ``[trainjob-stacks rank N]`` so that ranks writing at once stay apart, after a header that says why). Shared
by the ranks, the operator and the CLI, below all three.
"""

from __future__ import annotations

import re

from trainjob.constants import STALL_FLOOR_SECONDS, STALL_INTERVAL_FACTOR

__all__ = ["stacks_after", "stacks_for_log", "stacks_in_log"]

#: A line of a dump a rank wrote to its log, whatever precedes it (torchrun's ``[rank1]:``).
_LOG_LINE = re.compile(r"\[trainjob-stacks rank (?P<rank>\d+)\] (?P<text>.*)$")
_LOG_HEADER = "no progress for "
_REQUEST_HEADER = "stacks on request "


def stacks_after(setting: str | None, longest: float | None) -> float | None:
    """Seconds without a report after which a rank dumps its own stacks (``TRAINJOB_STALL_DUMP`` is ``setting``,
    ``longest`` the longest interval between its reports so far); ``None``: not yet, or never. ``auto`` is half
    the stall watch's derived limit, so the stacks are in the log before the job is found stalled.

    >>> stacks_after("auto", 0.1), stacks_after("auto", 12.0), stacks_after("auto", None), stacks_after("7.5", None)
    (30.0, 60.0, None, 7.5)
    >>> stacks_after("off", 1.0), stacks_after(None, 1.0), stacks_after("soon", 1.0)
    (None, None, None)
    """
    if not setting or setting == "off":
        return None
    if setting == "auto":
        return None if longest is None else max(STALL_FLOOR_SECONDS, STALL_INTERVAL_FACTOR * longest) / 2
    try:
        seconds = float(setting)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def stacks_for_log(rank: int, silent: float, dump: str, request: str | None = None) -> str:
    """The lines rank ``rank`` writes to its log for ``dump`` (:mod:`faulthandler`'s format) after ``silent``
    seconds without progress, or answering ``trainjob stacks``' request ``request``, each prefixed so that ranks
    writing at once stay apart (:func:`stacks_in_log` reads them)."""
    prefix = f"[trainjob-stacks rank {rank}] "
    header = f"{_REQUEST_HEADER}{request}:" if request is not None else f"{_LOG_HEADER}{silent:.0f} s; its stacks:"
    return "".join(f"{prefix}{line}\n" for line in [header, *dump.splitlines()])


def stacks_in_log(log: str, request: str | None = None) -> dict[int, str]:
    """Each rank's latest dump in ``log`` (a pod's log; a line may start with anything before the prefix, such as
    torchrun's ``[rank1]:``), in :mod:`faulthandler`'s format; with ``request``, only the dumps answering it.

    >>> log = "step 3\\n[rank1]:[trainjob-stacks rank 1] no progress for 31 s; its stacks:\\n"
    >>> log += "[trainjob-stacks rank 1] Thread 0x1 (most recent call first):\\n"
    >>> log += '[trainjob-stacks rank 1]   File "train.py", line 9 in <module>\\n'
    >>> stacks_in_log(log)
    {1: 'Thread 0x1 (most recent call first):\\n  File "train.py", line 9 in <module>\\n'}
    >>> stacks_in_log(log, request="17"), stacks_in_log(stacks_for_log(2, 0, "Thread 0x2:", request="17"), request="17")
    ({}, {2: 'Thread 0x2:\\n'})
    """
    dumps: dict[int, list[str]] = {}
    reading: set[int] = set()
    for line in log.splitlines():
        match = _LOG_LINE.search(line)
        if match is None:
            continue
        rank, text = int(match["rank"]), match["text"]
        if text.startswith((_LOG_HEADER, _REQUEST_HEADER)):
            if request is None or text == f"{_REQUEST_HEADER}{request}:":
                dumps[rank] = []
                reading.add(rank)
            else:
                reading.discard(rank)
        elif rank in reading:
            dumps[rank].append(text)
    return {rank: "".join(f"{line}\n" for line in lines) for rank, lines in sorted(dumps.items())}
