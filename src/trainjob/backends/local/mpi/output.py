"""What ``mpirun`` prints, for a local MPI job's logs and status (:mod:`trainjob.backends.local.mpi`).

- :class:`RankLines` turns ``mpirun --tag-output`` text (``[1,3]<stdout>:text``; ``mpirun`` tags every chunk it
  forwards, so tags also come in the middle of a line) into whole lines per rank; ``mpirun``'s own text is untagged.
- :class:`RankRelay` writes each rank's lines, prefixed ``[rank<N>]: `` as the logs expect, into the log of the
  node that runs the rank (node ``rank // slots``), and remembers each rank's last exception.
- :func:`failure_report` turns ``mpirun``'s "the first process to do so was" (or "exited on signal") into a
  failure report in torchrun's format, with the rank's exception in an error file in torchelastic's format, so
  the job's status names the rank and its error (:mod:`trainjob.backends.local.supervisor.failures`)::

      relay = RankRelay(hosts=2, slots=2, own=print, connect=connect_to_node)
      lines = RankLines(print, relay.line)
      lines.feed("[1,3]<stdout>:loss 0.4\n")   # node-1's log gets "[rank3]: loss 0.4"
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

from trainjob.rootcause import is_root_exception, strip_rank_prefixes

_TAG = re.compile(r"\[\d+,(\d+)\]<std(?:out|err|diag)>:")
_PARTIAL_TAG = re.compile(r"\[\d*(?:,\d*(?:\](?:<[a-z]*>?)?)?)?$")
_FIRST_FAILED = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(-?\d+)")
_SIGNALED = re.compile(r"process rank (\d+) with PID (\d+) on node \S+ exited on signal (\d+)")


class RankRelay:
    """Sends each rank's lines to the log of the node that runs it (node ``rank // slots``), as the rank's own
    node would have logged them, and remembers each rank's last exception."""

    def __init__(
        self, hosts: int, slots: int, own: Callable[[str], None], connect: Callable[[int], socket.socket]
    ) -> None:
        self.hosts, self.slots, self.own, self.connect = hosts, max(1, slots), own, connect
        self.connections: dict[int, socket.socket | None] = {}
        self.exceptions: dict[int, str] = {}

    def line(self, rank: int, text: str) -> None:
        stripped = strip_rank_prefixes(text)
        if is_root_exception(stripped):
            self.exceptions[rank] = stripped
        data = f"[rank{rank}]: {text}\n"
        node = min(rank // self.slots, self.hosts - 1)
        conn = self._connection(node) if node else None
        if conn is None:  # node 0 (this process), or a node that is gone: the line stays here
            self.own(data)
            return
        try:
            conn.sendall(data.encode())
        except OSError:
            self.connections[node] = None
            self.own(data)

    def close(self) -> None:
        for conn in self.connections.values():
            if conn is not None:
                conn.close()
        self.connections.clear()

    def _connection(self, node: int) -> socket.socket | None:
        if node not in self.connections:
            try:
                self.connections[node] = self.connect(node)
            except OSError:
                self.connections[node] = None
        return self.connections[node]


class RankLines:
    """Turns ``mpirun --tag-output`` text (``[1,3]<stdout>:text``, tags also inside lines) into whole lines per
    rank, handed to ``on_line(rank, text)``; ``mpirun``'s own, untagged text goes to ``out`` and is kept in
    ``launcher_text``."""

    def __init__(self, out: Callable[[str], None], on_line: Callable[[int, str], None]) -> None:
        self.out, self.on_line = out, on_line
        self.pending = ""
        self.lines: dict[int, str] = {}
        self.owner: int | None = None  # the rank whose line the text being read belongs to
        self.launcher_text = ""

    def feed(self, text: str) -> None:
        text = self.pending + text
        partial = _PARTIAL_TAG.search(text)
        self.pending = text[partial.start():] if partial else ""
        text = text[: partial.start()] if partial else text
        position = 0
        for tag in _TAG.finditer(text):
            self._text(text[position : tag.start()])
            self.owner = int(tag.group(1))
            position = tag.end()
        self._text(text[position:])

    def close(self) -> None:
        self._text(self.pending)
        self.pending = ""
        for rank, line in sorted(self.lines.items()):
            if line:
                self.on_line(rank, line)
        self.lines.clear()

    def _text(self, text: str) -> None:
        while text:
            if self.owner is None:
                self.out(text)
                self.launcher_text += text
                return
            head, newline, text = text.partition("\n")
            line = self.lines.get(self.owner, "") + head
            if not newline:
                self.lines[self.owner] = line
                return
            self.on_line(self.owner, line)
            self.lines[self.owner] = ""
            self.owner = None  # after a newline, text without a tag is mpirun's own


def failure_report(
    mpirun_text: str, hosts: list[str], slots: int, code: int, exceptions: dict[int, str], job_dir: Path
) -> str | None:
    """A failure report in torchrun's format for the first rank ``mpirun`` says failed, or ``None``; the rank's
    last exception goes to an error file in torchelastic's format (``logs/mpi-rank-<N>.error.json``).

    OpenMPI names that rank after its "Primary job terminated normally, but 1 process returned a non-zero exit
    code" notice, but not always (now and then it ends the job without the block that names it). Then the first
    rank that printed an exception (``exceptions``, in the order they were printed) is the one named, with
    ``mpirun``'s exit code, which is that process's."""
    found = _FIRST_FAILED.search(mpirun_text)
    signaled = None if found else _SIGNALED.search(mpirun_text)
    if found:
        rank, exit_code, pid = int(found.group(1)), int(found.group(2)), None
    elif signaled:
        rank, pid, exit_code = int(signaled.group(1)), int(signaled.group(2)), -int(signaled.group(3))
    elif exceptions:
        rank, exit_code, pid = next(iter(exceptions)), code, None
    else:
        return None
    host = hosts[min(rank // max(1, slots), len(hosts) - 1)]
    stamp = time.strftime("%Y-%m-%d_%H:%M:%S")
    error_file = "<N/A>"
    if rank in exceptions:
        path = job_dir / "logs" / f"mpi-rank-{rank}.error.json"
        with contextlib.suppress(OSError):
            path.write_text(json.dumps({"message": {"message": exceptions[rank]}}), encoding="utf-8")
            error_file = str(path)
    return (
        f"mpirun exited with code {code}\n"
        "Failures:\n"
        "  <NO_OTHER_FAILURES>\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        f"  time      : {stamp}\n"
        f"  host      : {host}\n"
        f"  rank      : {rank} (local_rank: {rank % max(1, slots)})\n"
        f"  exitcode  : {exit_code}" + (f" (pid: {pid})" if pid else "") + "\n"
        f"  error_file: {error_file}\n"
    )
