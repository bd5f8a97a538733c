"""Every rank's Python stacks from a running local job: ``trainjob stacks NAME``, and the stall watch's evidence.

At start-up each training process of a local job registers :mod:`faulthandler` for
:data:`~trainjob.backends.local.worker_site.STACKS_SIGNAL` (a real-time signal), writing to
``<job dir>/stacks/rank-<RANK>-<pid>.txt`` (:mod:`~trainjob.backends.local.worker_site.sitecustomize`). faulthandler
dumps every thread from the signal handler itself, without waiting for the GIL, so a rank blocked in a C call
(gloo's ``recv``, a read) answers too, and the dump costs the rank nothing it would notice. :func:`dump_stacks`
signals each live rank that has the handler installed (never a process that would die of the signal) and reads what
it wrote::

    stacks = dump_stacks(store.job_dir("mnist"))
    print(format_stacks(stacks))                     # --- rank 0 (node-0, pid 4242) --- ...
    print(find_stuck_ranks(stacks).summary)          # rank 1 is not in the all_reduce that rank 0 waits in: ...

No other tool is needed (``py-spy`` would need ``ptrace``, which containers often drop).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainjob.backends.local.processes import JOB_DIR_ENV
from trainjob.backends.local.worker_site import STACKS_SIGNAL
from trainjob.backends.stacks import RankStacks

__all__ = ["STACKS_DIR", "dump_stacks"]

#: The directory, in a job's directory, that ranks dump their stacks into (and write their collectives' progress
#: into, for the stall watch: :func:`trainjob.backends.local.supervisor.stall_watch.rank_collectives`).
STACKS_DIR = "stacks"
#: How long ranks get to write their dumps.
DUMP_TIMEOUT_SECONDS = 3.0
_FILE = re.compile(r"^rank-(?P<rank>\d+)-(?P<pid>\d+)\.txt$")


@dataclass
class _Target:
    rank: int
    pid: int
    node: int | None
    path: Path
    offset: int


def handles_signal(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask), so the signal cannot kill it."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caught >> (signum - 1) & 1)


def _rank_process(job_dir: Path, rank: int, pid: int) -> psutil.Process | None:
    """The live training process of the job with ``rank`` that calls itself ``pid``: that pid here, or, for a rank
    in a container (whose files name its pid in the container's namespace), the job's process with that rank whose
    innermost pid it is; ``None`` when there is none."""
    from trainjob.backends.local.containers import namespace_pid
    from trainjob.backends.local.processes import job_processes

    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        env = process.environ()
        if env.get(JOB_DIR_ENV) == str(job_dir) and env.get("RANK") == str(rank):
            return process if process.status() != psutil.STATUS_ZOMBIE else None
    for process in job_processes(str(job_dir)):
        with contextlib.suppress(psutil.Error):
            if process.environ().get("RANK") == str(rank) and process.pid != pid and namespace_pid(process.pid) == pid:
                return process if process.status() != psutil.STATUS_ZOMBIE else None
    return None


def _live_rank(path: Path, job_dir: Path) -> tuple[int, int, int | None] | str | None:
    """``(rank, pid, node)`` of the training process that registered ``path`` (its pid here); a reason when it
    cannot dump; ``None`` when it is gone (an earlier run of the node group)."""
    match = _FILE.match(path.name)
    if match is None:
        return None
    rank = int(match["rank"])
    process = _rank_process(job_dir, rank, int(match["pid"]))
    if process is None:
        return None
    try:
        env, pid = process.environ(), process.pid
        # A pid reused by a later process: that one started after the file was last written.
        if process.create_time() > path.stat().st_ctime + 1:
            return None
    except (psutil.Error, OSError):
        return None
    node = env.get("GROUP_RANK") or env.get("PET_NODE_RANK")
    if not handles_signal(pid, int(STACKS_SIGNAL)):
        return f"rank {rank} (pid {pid}) has no handler for the stack signal"
    return rank, pid, int(node) if node and node.isdigit() else None


def dump_stacks(job_dir: Path, timeout: float = DUMP_TIMEOUT_SECONDS) -> list[RankStacks]:
    """Every live rank's stacks, in rank order (empty when no rank of the job runs)."""
    directory = job_dir / STACKS_DIR
    found: list[RankStacks] = []
    targets: list[_Target] = []
    for path in sorted(directory.glob("rank-*.txt")) if directory.is_dir() else []:
        live = _live_rank(path, job_dir)
        if live is None:
            with contextlib.suppress(OSError):
                path.unlink()  # an earlier run's rank: its dumps are of no more use
            continue
        if isinstance(live, str):
            found.append(RankStacks(int(_FILE.match(path.name)["rank"]), None, problem=live))  # type: ignore[index]
            continue
        rank, pid, node = live
        try:
            targets.append(_Target(rank, pid, node, path, path.stat().st_size))
            os.kill(pid, STACKS_SIGNAL)
        except OSError as exc:
            found.append(RankStacks(rank, None, node=node, pid=pid, problem=f"could not be signalled: {exc}"))
    texts = _read_dumps(targets, timeout)
    for target in targets:
        text = texts.get(target.pid)
        found.append(RankStacks(target.rank, text or None, node=target.node, pid=target.pid,
                                problem=None if text else f"wrote no stacks within {timeout:g} s"))
    return sorted(found, key=lambda s: s.rank)


def _read_dumps(targets: list[_Target], timeout: float) -> dict[int, str]:
    """What each target wrote after its offset, once it stopped writing (or ``timeout`` passed)."""
    deadline = time.monotonic() + timeout
    sizes: dict[int, tuple[int, float]] = {}
    while True:
        now = time.monotonic()
        for target in targets:
            with contextlib.suppress(OSError):
                size = target.path.stat().st_size
                if size > target.offset and sizes.get(target.pid, (0, 0.0))[0] != size:
                    sizes[target.pid] = (size, now)
        settled = all(t.pid in sizes and now - sizes[t.pid][1] >= 0.1 for t in targets)
        if settled or now >= deadline:
            break
        time.sleep(0.02)
    texts = {}
    for target in targets:
        with contextlib.suppress(OSError), target.path.open("rb") as f:
            f.seek(target.offset)
            texts[target.pid] = f.read().decode("utf-8", errors="replace")
    return texts
