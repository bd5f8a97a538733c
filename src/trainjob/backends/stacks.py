"""Every rank's Python stacks, and which ranks a stalled job waits for: for ``trainjob stacks`` and the stall
watch (:mod:`trainjob.backends.stall`).

A backend collects one dump per rank in :mod:`faulthandler`'s format (the local backend:
:mod:`trainjob.backends.local.stacks`) and hands them to :func:`find_stuck_ranks`, which reads each rank's main
thread (the one running the script's ``<module>``) and sorts the ranks:

==============================================  ===============================================================
a rank is waiting in a collective when its      the innermost frame in ``torch/distributed/`` names it
main thread is in                               (``all_reduce``, ``barrier``, ``all_gather_object``, DCP's
                                                save ...); DDP's module (``torch/nn/parallel/distributed.py``); or
                                                autograd's ``backward``, where DDP waits for its gradient
                                                all-reduce
some ranks wait, others do not                  the others are stuck: named with the frame they are in (the
                                                innermost frame, and the script's own frame that called it)
every rank waits, not all in the same one       the ranks outside the collective most of them wait in
every rank waits in the same collective         none is named: the collective itself does not finish
no rank waits                                   every rank is named with its frame
==============================================  ===============================================================

>>> dump = '''Current thread 0x1 (most recent call first):
...   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
...   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
...   File "/job/train.py", line 40 in <module>
... '''
>>> stuck = '''Current thread 0x2 (most recent call first):
...   File "/job/train.py", line 21 in __getitem__
...   File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 733 in __next__
...   File "/job/train.py", line 38 in <module>
... '''
>>> find_stuck_ranks([RankStacks(0, dump), RankStacks(1, stuck)]).summary
'rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (train.py:21)'
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = [
    "Frame",
    "RankStacks",
    "StuckRanks",
    "ThreadStack",
    "find_stuck_ranks",
    "format_stacks",
    "parse_dump",
]

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')
_LIBRARY = re.compile(r"/(?:site-packages|dist-packages)/|/lib/python3\.\d+/|^<")
_SHORT = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python3\.\d+)/")
#: Frames that only wrap a collective (c10d's logging decorator) and name none.
_WRAPPERS = frozenset({"wrapper", "inner"})


@dataclass(frozen=True)
class Frame:
    """One frame of a dump: ``file``, ``line``, ``function``."""

    file: str
    line: int
    function: str

    @property
    def in_library(self) -> bool:
        """In an installed package or the standard library, not the job's own code."""
        return bool(_LIBRARY.search(self.file.replace("\\", "/")))

    def short(self) -> str:
        """``__getitem__ (train.py:21)``; a library's path from its package: ``(torch/utils/data/dataloader.py:733)``."""
        path = self.file.replace("\\", "/")
        shown = _SHORT.sub("", path) if self.in_library else path.rsplit("/", 1)[-1]
        return f"{self.function} ({shown}:{self.line})"


@dataclass
class ThreadStack:
    """One thread of a dump: its frames, innermost first; ``current``: the thread that wrote the dump."""

    ident: str
    current: bool
    frames: list[Frame] = field(default_factory=list)


def parse_dump(text: str) -> list[ThreadStack]:
    """The threads of a :mod:`faulthandler` dump, in the order written."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        if header := _THREAD.match(line):
            threads.append(ThreadStack(header[2], header[1] == "Current thread"))
        elif threads and (frame := _FRAME.match(line)):
            threads[-1].frames.append(Frame(frame["file"], int(frame["line"]), frame["function"]))
    return threads


@dataclass
class RankStacks:
    """What one rank's process dumped (``text``, ``None`` when nothing could be read: ``problem`` says why)."""

    rank: int
    text: str | None
    node: int | None = None
    pid: int | None = None
    problem: str | None = None

    def main_thread(self) -> list[Frame]:
        """The frames (innermost first) of the thread running the script: the one with its ``<module>`` frame,
        else the one that wrote the dump."""
        threads = parse_dump(self.text or "")
        for thread in threads:
            if any(f.function == "<module>" and not f.file.endswith("threading.py") for f in thread.frames):
                return thread.frames
        current = [t for t in threads if t.current] or threads
        return current[0].frames if current else []

    def title(self) -> str:
        where = [f"node-{self.node}"] if self.node is not None else []
        where += [f"pid {self.pid}"] if self.pid is not None else []
        return f"rank {self.rank}" + (f" ({', '.join(where)})" if where else "")


def collective_of(frames: list[Frame]) -> str | None:
    """The collective ``frames`` (innermost first) wait in, or ``None`` (see the module's table)."""
    for frame in frames:
        path = frame.file.replace("\\", "/")
        if "/torch/distributed/" in path and frame.function not in _WRAPPERS and not frame.function.startswith("_"):
            return frame.function
        if path.endswith("/torch/nn/parallel/distributed.py"):
            return f"DistributedDataParallel.{frame.function}"
        if "/torch/autograd/" in path and frame.function in ("backward", "_engine_run_backward", "grad"):
            return "backward"
    return None


def where(frames: list[Frame]) -> str:
    """``__getitem__ (train.py:21)``; a library frame with the job's own frame that called it."""
    if not frames:
        return "no Python frame"
    inner = frames[0]
    if not inner.in_library:
        return inner.short()
    own = next((f for f in frames if not f.in_library), None)
    return inner.short() + (f", called from {own.short()}" if own else "")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


@dataclass
class StuckRanks:
    """What :func:`find_stuck_ranks` found: the ranks named (``stuck``), the collective most waiting ranks are in
    and those ranks (``waiting``), and the sentence that says so."""

    stuck: list[int]
    collective: str | None
    waiting: list[int]
    summary: str


def find_stuck_ranks(stacks: list[RankStacks]) -> StuckRanks:
    """Which ranks the others wait for, and where they are (see the module's table)."""
    readable = sorted((s for s in stacks if s.text), key=lambda s: s.rank)
    frames = {s.rank: s.main_thread() for s in readable}
    collectives = {rank: collective_of(f) for rank, f in frames.items()}
    waiting = [rank for rank, c in collectives.items() if c]
    outside = [rank for rank, c in collectives.items() if not c]
    collective = Counter(collectives[r] for r in waiting).most_common(1)[0][0] if waiting else None
    peers = waiting
    if waiting and outside:
        stuck = outside
        verb = "is" if len(stuck) == 1 else "are"
        summary = (f"{_ranks(stuck)} {verb} not in the {collective} that {_ranks(waiting)} "
                   f"{'waits' if len(waiting) == 1 else 'wait'} in: "
                   + "; ".join(f"rank {r} is in {where(frames[r])}" for r in stuck))
    elif waiting and len(set(collectives.values())) > 1:
        stuck = [r for r in waiting if collectives[r] != collective]
        peers = [r for r in waiting if collectives[r] == collective]
        summary = (f"{_ranks(stuck)} {'is' if len(stuck) == 1 else 'are'} in another collective than the "
                   f"{collective} that {_ranks(peers)} {'waits' if len(peers) == 1 else 'wait'} in: "
                   + "; ".join(f"rank {r} is in {collectives[r]}: {where(frames[r])}" for r in stuck))
    elif waiting:
        stuck = []
        summary = (f"every rank waits in {collective} ({where(frames[waiting[0]])} on rank {waiting[0]}); none is "
                   "missing from it, so the collective itself does not finish")
    elif readable:
        stuck = sorted(frames)
        summary = "no rank is in a collective: " + "; ".join(f"rank {r} is in {where(frames[r])}" for r in stuck)
    else:
        stuck = []
        summary = "no rank's stacks could be read"
    unread = [s for s in stacks if not s.text]
    if unread and readable:
        summary += "; no stacks from " + ", ".join(f"{s.title()}: {s.problem or 'nothing written'}" for s in unread)
    elif unread:
        summary += ": " + "; ".join(f"{s.title()}: {s.problem or 'nothing written'}" for s in unread)
    return StuckRanks(stuck=stuck, collective=collective, waiting=peers, summary=summary)


def format_stacks(stacks: list[RankStacks]) -> str:
    """Every rank's dump under a ``--- rank 0 (node-0, pid 4242) ---`` line, in rank order."""
    parts = []
    for s in sorted(stacks, key=lambda s: s.rank):
        body = s.text.rstrip() if s.text else f"(no stacks: {s.problem or 'nothing written'})"
        parts.append(f"--- {s.title()} ---\n{body}\n")
    return "\n".join(parts)
