"""Why a job's nodes failed, and which rank failed first: the root cause a job's status names.

When one rank dies, its peers die soon after: the ranks it was in a collective with get "Connection closed by
peer" from gloo, and torchrun SIGTERMs the other ranks on its node. Only the first death is the cause, and it is
often a signal (SIGKILL is what the OOM killer sends). torchrun's own report stamps failures to the whole second
and picks the lowest local rank among equal stamps, so it cannot tell; the root cause is therefore the failure
that happened first by the most precise clock available for it:

====================================  ========================================================================
the rank's end as its node's keeper   the keeper holds a pidfd on every training process and notes the moment
saw it (``node-<i>.exit.json``)       it ends, to the millisecond
its error file's modification time    written by ``@record`` (``torch.distributed.elastic``) as it failed
torchrun's report                     whole seconds
the node's own end                    for a node that failed without a torchrun report
====================================  ========================================================================

Exit codes and local ranks come from torchrun's report in the node's log (every failure it lists, not only its
"root cause"); the exception from the rank's error file (every rank of a local job has one:
:mod:`~trainjob.backends.local.worker_site`), else the last exception line the rank printed
(:func:`~trainjob.rootcause.exception_line`, which skips peers' "Connection closed by peer"). A rank whose error
only reports a peer's failure is a consequence: it says so in its detail and comes after every other failure,
whatever its time, since a busy machine can see the peer's death after its echo::

    failures = [f for node in failed for f in node_failures(job_dir, node, exits[node])]
    print(pick_root_cause(failures).describe())   # node-1 rank 1: NameError: name 'lr' is not defined
                                                  # node-1 rank 3 (local rank 1) was killed by SIGKILL
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trainjob.backends.local.containers import memory_words
from trainjob.backends.local.log_reader import log_tail, parse_line
from trainjob.rootcause import (
    consequence_line,
    exception_line,
    first_line,
    is_root_exception,
    root_cause_line,
)

_REPORTED_FAILURE = re.compile(
    r"\[\d+\]:\s*\n"
    r"\s*time\s*: (?P<time>\S+)\s*\n"
    r"\s*host\s*: .*\n"
    r"\s*rank\s*: (?P<rank>\d+) \(local_rank: (?P<local_rank>\d+)\)\s*\n"
    r"\s*exitcode\s*: (?P<exitcode>-?\d+)(?: \(pid: (?P<pid>\d+)\))?.*\n"
    r"\s*error_file: (?P<error_file>.*)\n"
)
_TAIL_BYTES = 256 * 1024


@dataclass
class NodeExit:
    """How a node's keeper saw the node end (``node-<i>.exit.json``)."""

    code: int
    time: float
    #: Training processes: ``{"pid", "rank", "local_rank", "time"}``, ``time`` being when the process ended.
    ranks: list[dict[str, Any]]
    #: The keeper itself was killed, so nothing was recorded.
    lost: bool = False
    #: A node that ran as a container: ``{"name", "memory_bytes", "oom_killed"}``.
    container: dict[str, Any] | None = None

    @classmethod
    def read(cls, path: Path) -> NodeExit | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(code=int(data["code"]), time=float(data["time"]), ranks=list(data.get("ranks", [])),
                       container=data.get("container"))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def oom_detail(self) -> str | None:
        """``OOMKilled: container X went over its memory limit of 600Mi`` when the kernel OOM-killed in it."""
        if not self.container or not self.container.get("oom_killed"):
            return None
        limit = self.container.get("memory_bytes")
        over = f"its memory limit of {memory_words(limit)}" if limit else "the memory it could get"
        return f"OOMKilled: container {self.container.get('name')} went over {over}"


@dataclass
class NodeFailure:
    """One failed rank (or a node that failed as a whole), with when it failed and why."""

    node: int
    exit_code: int
    rank: int | None = None
    local_rank: int | None = None
    #: When it failed (Unix time, as precise as known); ``None`` when unknown.
    time: float | None = None
    detail: str | None = None
    pid: int | None = None
    #: The exception the rank raised (``NameError: name 'lr' is not defined``), when it raised one.
    exception: str | None = None
    #: It failed because another did: what it raised reports a peer's failure (a lost connection, a rendezvous
    #: that closed), which is then its ``detail``. Never the root cause while another failure is known.
    consequence: bool = False

    @property
    def by_signal(self) -> bool:
        return self.exit_code < 0

    def describe(self) -> str:
        """``node-1 rank 1: NameError: ...`` when the rank raised, else how it ended (code or signal)."""
        if self.exception and not self.by_signal:
            return root_cause_line(f"node-{self.node}", self.rank, self.exception)
        who = f"node-{self.node}"
        if self.rank is not None:
            who += f" rank {self.rank} (local rank {self.local_rank})"
        how = f"exited with code {self.exit_code}"
        if self.by_signal:
            with contextlib.suppress(ValueError):
                how = f"was killed by {signal.Signals(-self.exit_code).name}"
        return f"{who} {how}" + (f": {self.detail}" if self.detail else "")


def node_failures(job_dir: Path, node: int, exit: NodeExit | None, code: int) -> list[NodeFailure]:
    """The failures of one node that failed by itself (``code`` its exit code), each timed as precisely as known."""
    tail = log_tail(job_dir, node, _TAIL_BYTES)
    # a container's ranks: torchrun's report names their pids in the container (``ns_pid``)
    ended = {int(r.get("ns_pid") or r["pid"]): float(r["time"])
             for r in (exit.ranks if exit else []) if r.get("time") is not None}
    failures = []
    for report in _REPORTED_FAILURE.finditer(tail[tail.rfind("\nFailures:") + 1 :] if "\nFailures:" in tail else ""):
        pid = int(report["pid"]) if report["pid"] else None
        error_file = report["error_file"].strip()
        rank = int(report["rank"])
        raised = _error_file_message(error_file) or _last_exception_line(tail, node, rank)
        echo = None
        if raised is not None and not is_root_exception(raised):  # an error file's word of a peer's failure
            raised, echo = None, raised
        elif raised is None:
            echo = _rank_consequence(tail, node, rank)
        failures.append(NodeFailure(
            node=node,
            exit_code=int(report["exitcode"]),
            rank=rank,
            local_rank=int(report["local_rank"]),
            time=ended.get(pid) or _modified(error_file) or _report_time(report["time"]),
            pid=pid,
            exception=raised,
            detail=echo,
            consequence=echo is not None,
        ))
    oom = exit.oom_detail() if exit is not None else None
    if failures and not _reported_earlier(failures, exit):
        if oom:  # the OOM killer's SIGKILL: the ranks it killed say why
            for failure in failures:
                if failure.exit_code == -signal.SIGKILL:
                    failure.detail = oom
            if not any(f.detail for f in failures):
                failures[0].detail = oom
        return failures
    if exit is not None and exit.lost:
        return [NodeFailure(node=node, exit_code=code, time=exit.time,
                            detail="its keeper was killed before it recorded how the node ended")]
    detail = oom
    if detail is None and exit is not None and exit.container and code in ENGINE_EXIT_CODES:
        detail = _engine_error(tail)  # the container never ran its command: the engine says why
    exception = None if detail else _last_exception_line(tail, node, None)
    if detail is None and exception is None and code > 0:
        # torchrun itself failed before or between its ranks (a rendezvous that closed, a store that went away):
        # the last such exception in its output says what it saw, else its own error file (``@record``'s, at
        # its exit: one an earlier attempt left is older)
        detail = consequence_line(tail)
        agent_file = str(job_dir / "logs" / f"node-{node}.error.json")
        written = _modified(agent_file)
        if detail is None and written is not None and (exit is None or written >= exit.time - 10):
            detail = _error_file_message(agent_file)
        return [NodeFailure(node=node, exit_code=code, time=exit.time if exit else None, detail=detail,
                            consequence=detail is not None and not is_root_exception(detail))]
    return [NodeFailure(node=node, exit_code=code, time=exit.time if exit else None, detail=detail,
                        exception=exception)]


#: What ``docker run`` and ``podman run`` exit with when they could not run the command (125: the engine failed,
#: 126: the command cannot be run, 127: it was not found), rather than the command's own status.
ENGINE_EXIT_CODES = (125, 126, 127)


def _engine_error(tail: str) -> str | None:
    """The container engine's last ``Error: ...`` line in a node's log."""
    for line in reversed(tail.splitlines()):
        text = line.strip()
        if text.startswith("Error: ") or text.startswith("docker: "):
            return text
    return None


def _reported_earlier(failures: list[NodeFailure], exit: NodeExit | None) -> bool:
    """Whether torchrun's report in the log is an earlier run's: it names a rank with another pid than the one
    this run's keeper saw for that rank. A rank the keeper did not see at all (one that raised at start can end
    between two of its looks) says nothing against the report."""
    seen: dict[int, set[int]] = {}
    for rank in exit.ranks if exit else []:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            seen.setdefault(int(rank["rank"]), set()).add(int(rank.get("ns_pid") or rank["pid"]))
    return any(f.rank in seen and f.pid is not None and f.pid not in seen[f.rank] for f in failures)


def pick_root_cause(failures: list[NodeFailure]) -> NodeFailure:
    """The failure that happened first; unknown times come last. A failure that reports a peer's (gloo's lost
    connection) comes after every other, whatever its time: on a busy machine the peer's death can be seen later
    than its echo. Among failures seen at the same moment, one by SIGTERM (how torchrun stops the ranks left after
    a failure) is not the cause, then the order given."""

    def key(item: tuple[int, NodeFailure]) -> tuple[bool, bool, float, bool, int]:
        index, failure = item
        return (failure.consequence, failure.time is None, failure.time or 0.0,
                failure.exit_code == -signal.SIGTERM, index)

    return min(enumerate(failures), key=key)[1]


def _report_time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("_", "T")).timestamp()
    except ValueError:
        return None


def _modified(error_file: str) -> float | None:
    if not error_file or error_file.startswith("<"):
        return None
    try:
        return Path(error_file).stat().st_mtime
    except OSError:
        return None


def _error_file_message(error_file: str) -> str | None:
    if not error_file or error_file.startswith("<"):
        return None
    try:
        data = json.loads(Path(error_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return first_line(str(message)) or None if message else None


def _rank_consequence(tail: str, node: int, rank: int) -> str | None:
    """The last exception ``rank`` printed that reports a peer's failure."""
    return consequence_line("\n".join(line.text for line in (parse_line(node, raw) for raw in tail.splitlines())
                                       if line.rank == rank))


def _last_exception_line(tail: str, node: int, rank: int | None) -> str | None:
    """The last root exception in the node's output: of ``rank``'s lines only, when a rank is known; else
    Python's own word that it could not open the script (a path that is not in the image, say)."""
    lines = [line.text for line in (parse_line(node, raw) for raw in tail.splitlines())
             if rank is None or line.rank == rank]
    found = exception_line("\n".join(lines))
    if found is None:
        found = next((text.strip() for text in reversed(lines) if ": can't open file " in text), None)
    return found
