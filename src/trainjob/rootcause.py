"""A failed rank's root cause in one line, the same on every backend: which node and rank, and the exception.

    node-1 rank 1: NameError: name 'lr' is not defined

Both backends find the exception the same way: the error file torchelastic's ``@record`` writes (local jobs get
one for every rank, see :mod:`trainjob.backends.local.worker_site`), else the last exception line the rank
printed. Lines that only report another rank's failure are skipped: torchrun's ``ChildFailedError``, a
collective's "Connection closed by peer", a rendezvous that closed::

    exception_line("[rank1]: [rank1]: NameError: name 'lr' is not defined")   # "NameError: name 'lr' is not defined"
    root_cause_line("node-1", 1, "NameError: name 'lr' is not defined")        # the line above
"""

from __future__ import annotations

import re

#: At most this many characters of an exception's message are kept in a job's status.
MAX_EXCEPTION_CHARS = 500

# "NameError: name 'lr' is not defined", "torch.OutOfMemoryError: ...", "ValueError" alone.
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\b(?::.*)?$"
)
# Exceptions that report another failure rather than being one.
_CONSEQUENCES = (
    "ChildFailedError",
    "DistNetworkError",
    "DistBackendError",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "SignalException",
)
# A peer gone, and a call cancelled because its process is stopping: the echo of a shutdown (Ray logs
# "ray.exceptions.RpcError: RPC error: CANCELLED" from a node stopped after its driver failed, after the driver's
# own exception).
_PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|connection closed|Broken pipe|ECONNRESET|RPC error: CANCELLED"
    # gloo's own word that the error is a peer's (its message then names the socket error, or none)
    r"|caused by a remote worker",
    re.I,
)
# torchrun's "[rank1]: " (or "[default1]:") and, after init_process_group, torch's own "[rank1]: " on every
# traceback line: one or several of them.
_RANK_PREFIXES = re.compile(r"^(?:\s*\[(?:default|rank)?\d+\]:\s?)+")


def strip_rank_prefixes(line: str) -> str:
    """``line`` without the rank prefixes torchrun and torch put before a training process's output."""
    return _RANK_PREFIXES.sub("", line).strip()


def is_root_exception(line: str) -> bool:
    """Whether ``line`` (prefixes stripped) states an exception that is a failure of its own."""
    if not _EXCEPTION.match(line):
        return False
    kind = line.split(":", 1)[0].rsplit(".", 1)[-1]
    return kind not in _CONSEQUENCES and not _PEER_LOST.search(line)


def exception_line(text: str) -> str | None:
    """The last line of ``text`` that states a Python exception and is not a peer's or torchrun's echo of it."""
    best = None
    for raw in text.splitlines():
        line = strip_rank_prefixes(raw)
        if is_root_exception(line):
            best = line
    return shorten(best) if best is not None else None


def consequence_line(text: str) -> str | None:
    """The last line of ``text`` that states an exception reporting another failure (a rendezvous that closed, a
    peer's lost connection): what a node whose own code raised nothing last saw, for its failure's detail."""
    best = None
    for raw in text.splitlines():
        line = strip_rank_prefixes(raw)
        if _EXCEPTION.match(line) and not is_root_exception(line):
            best = line
    return shorten(best) if best is not None else None


def first_line(message: str) -> str:
    """The first non-empty line of an exception's message (a multi-line message continues with details)."""
    return shorten(next((line.strip() for line in message.splitlines() if line.strip()), ""))


def shorten(text: str) -> str:
    return text if len(text) <= MAX_EXCEPTION_CHARS else text[: MAX_EXCEPTION_CHARS - 3] + "..."


def root_cause_line(where: str, rank: int | None, exception: str) -> str:
    """``node-1 rank 1: NameError: ...``: the line every backend puts first in a failed job's message."""
    return f"{where}{'' if rank is None else f' rank {rank}'}: {exception}"
