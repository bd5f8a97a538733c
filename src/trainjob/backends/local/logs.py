"""Node and rank logs of local jobs, and what torchrun recorded when a node failed.

Each node process writes its stdout and stderr to ``logs/node-<i>.log`` in the job's directory; torchrun tees
every training process into it with a ``[rank<r>]: `` prefix (and keeps one file per rank under
``logs/node-<i>/``). :func:`read_logs` yields :class:`~trainjob.types.LogLine` objects, following the files
while the job runs::

    for line in read_logs(job_dir, nodes=[0, 1], follow=True, finished=lambda: job_is_done()):
        print(line)          # node-1/rank-3 | epoch 2 loss 0.41
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainjob.types import LogLine

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):\s*\n\[\d+\]:\s*\n"
    r"\s*time\s*: (?P<time>\S+)\s*\n"
    r"\s*host\s*: .*\n"
    r"\s*rank\s*: (?P<rank>\d+) \(local_rank: (?P<local_rank>\d+)\)\s*\n"
    r"\s*exitcode\s*: (?P<exitcode>-?\d+).*\n"
    r"\s*error_file: (?P<error_file>.*)\n"
    r"\s*traceback\s*: (?P<traceback>.*)"
)
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")
_TAIL_BYTES = 256 * 1024


def node_log_path(job_dir: Path, node: int) -> Path:
    return job_dir / "logs" / f"node-{node}.log"


def parse_line(node: int, raw: str) -> LogLine:
    """A raw node-log line as a :class:`LogLine`, its rank taken from torchrun's prefix when there is one."""
    match = _RANK_PREFIX.match(raw)
    if match:
        return LogLine(node=node, rank=int(match.group(1)), text=raw[match.end() :])
    return LogLine(node=node, rank=None, text=raw)


def read_logs(
    job_dir: Path,
    nodes: list[int],
    rank: int | None = None,
    follow: bool = False,
    finished: Callable[[], bool] = lambda: True,
    poll_interval: float = 0.05,
) -> Iterator[LogLine]:
    """Lines of ``nodes`` (only global ``rank``'s when given), each node's in file order.

    With ``follow`` it keeps reading new lines until ``finished()`` is true and nothing is left to read.
    """
    offsets = dict.fromkeys(nodes, 0)
    pending = dict.fromkeys(nodes, "")
    while True:
        done = finished() if follow else True
        produced = False
        for node in nodes:
            path = node_log_path(job_dir, node)
            try:
                with path.open("r", encoding="utf-8", errors="replace") as f:
                    f.seek(offsets[node])
                    chunk = f.read()
                    offsets[node] = f.tell()
            except FileNotFoundError:
                continue
            text = pending[node] + chunk
            lines = text.split("\n")
            pending[node] = lines.pop()
            if done and pending[node]:
                lines.append(pending[node])
                pending[node] = ""
            for raw in lines:
                produced = True
                line = parse_line(node, raw)
                if rank is None or line.rank == rank:
                    yield line
        if done and not produced:
            return
        if not produced:
            time.sleep(poll_interval)


@dataclass
class NodeFailure:
    """Why a node failed: the rank torchrun named first, its exit code and the error it recorded."""

    node: int
    exit_code: int
    rank: int | None = None
    local_rank: int | None = None
    reported_at: str | None = None
    detail: str | None = None

    @property
    def by_signal(self) -> bool:
        return self.exit_code < 0

    def describe(self) -> str:
        who = f"node-{self.node}"
        if self.rank is not None:
            who += f" rank {self.rank} (local rank {self.local_rank})"
        how = f"exited with code {self.exit_code}"
        if self.by_signal:
            with contextlib.suppress(ValueError):
                how = f"was killed by {signal.Signals(-self.exit_code).name}"
        return f"{who} {how}" + (f": {self.detail}" if self.detail else "")


def diagnose_node_failure(job_dir: Path, node: int, exit_code: int) -> NodeFailure:
    """Read the end of the node's log for torchrun's failure report and the failing rank's error."""
    failure = NodeFailure(node=node, exit_code=exit_code)
    tail = _tail(node_log_path(job_dir, node))
    reports = list(_ROOT_CAUSE.finditer(tail))
    if reports:
        report = reports[-1]
        failure.rank = int(report["rank"])
        failure.local_rank = int(report["local_rank"])
        failure.exit_code = int(report["exitcode"])
        failure.reported_at = report["time"]
        failure.detail = _error_file_message(report["error_file"].strip())
    if failure.detail is None:
        failure.detail = _last_exception_line(tail, node, failure.rank)
    return failure


def pick_root_cause(failures: list[NodeFailure]) -> NodeFailure:
    """The failure to report among several nodes': not a victim of a signal, earliest reported, first seen."""
    ordered = sorted(
        enumerate(failures), key=lambda item: (item[1].by_signal, item[1].reported_at or "~", item[0])
    )
    return ordered[0][1]


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _error_file_message(error_file: str) -> str | None:
    if not error_file or error_file.startswith("<"):
        return None
    try:
        data = json.loads(Path(error_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    message = data.get("message")
    if isinstance(message, dict):
        message = message.get("message")
    return str(message).strip().splitlines()[-1] if message else None


def _last_exception_line(tail: str, node: int, rank: int | None) -> str | None:
    found = None
    for raw in tail.splitlines():
        line = parse_line(node, raw)
        if rank is not None and line.rank != rank:
            continue
        if _EXCEPTION_LINE.match(line.text.strip()):
            found = line.text.strip()
    return found
