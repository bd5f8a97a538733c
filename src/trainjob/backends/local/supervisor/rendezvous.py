"""Shrink and grow of local elastic jobs: the rendezvous store, and the files the supervisor and ranks share.

An elastic job (``elasticPolicy`` with ``minNodes < maxNodes``) whose command is ``torchrun`` keeps running when
one of its nodes is lost. Its pieces:

- **A rendezvous store no node owns.** ``python -m trainjob.backends.local.supervisor.rendezvous JOB_DIR PORT`` hosts the
  c10d ``TCPStore`` the nodes' agents meet at (``--rdzv-conf is_host=false``), so any node, node 0 included, can
  be lost. The supervisor starts it; it carries the job's directory in its environment (so stopping the job
  stops it too) and also ends on its own once no supervisor has held the job for a while.
- **Which nodes were lost** (``elastic/losses.jsonl``, written by the supervisor the moment a node's keeper
  exits, with how many nodes go on): the agents (:mod:`~trainjob.backends.local.torchrun.elastic_agent`) restart
  their ranks in place at once, at the smaller size, only when a node was lost; a rank that fails on its own
  still fails its node, and the supervisor restarts the group.
- **Growing at a checkpoint.** A lost node comes back after the job's back-off. When the training script
  checkpoints with :class:`trainjob.torch.ElasticConfig`, the supervisor first writes ``elastic/grow-request``;
  the ranks see it at their next checkpoint, save, write ``elastic/grow-ready`` and wait, and only then is the
  node started, so a grow loses no steps.
- **The size of every round** (``elastic.jsonl``, one line per rendezvous, written by rank 0): nodes, world
  size, the step it resumed from. The supervisor turns changes into ``Resized`` events and the job's message.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainjob.backends.local.processes import supervisor_lock_held
from trainjob.constants import JOB_DIR_ENV

#: ``--rdzv-conf`` of shrinkable local jobs: the store is the supervisor's; a node whose loss the supervisor
#: recorded is dropped by the others' agents as soon as its agent's process is gone
#: (:mod:`~trainjob.backends.local.torchrun.elastic_agent`), any other after ``keep_alive_interval x
#: keep_alive_max_attempt`` seconds (agents renew their heartbeat only once it is a whole interval old, so fewer
#: than 3 attempts takes live nodes for dead, and 4 leaves room for a busy machine); a round closes 1 s after
#: ``minNodes`` joined, or, right after a loss, once the nodes that go on have all joined.
RDZV_CONF = "is_host=false,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=4"
#: The store ends itself after the job has had no supervisor this long (a replacement takes over sooner): twice
#: the keepers' :data:`~trainjob.backends.local.node_keeper.keeper.NODE_UNSUPERVISED_LIMIT_SECONDS`, so the store
#: outlives the nodes whose agents meet at it.
STORE_UNSUPERVISED_LIMIT_SECONDS = 60.0
CHECK_SECONDS = 1.0

ELASTIC_DIR = "elastic"
ROUNDS_FILE = "elastic.jsonl"
LOSSES_FILE = "losses.jsonl"
GROW_REQUEST_FILE = "grow-request"
GROW_READY_FILE = "grow-ready"
STORE_FILE = "rendezvous.json"


def elastic_dir(job_dir: Path | str) -> Path:
    return Path(job_dir) / ELASTIC_DIR


def rounds_path(job_dir: Path | str) -> Path:
    """``elastic.jsonl``: one JSON line per rendezvous round, written by rank 0 (:mod:`trainjob.torch.elastic`)."""
    return Path(job_dir) / ROUNDS_FILE


def grow_request_path(job_dir: Path | str) -> Path:
    return elastic_dir(job_dir) / GROW_REQUEST_FILE


def grow_ready_path(job_dir: Path | str) -> Path:
    return elastic_dir(job_dir) / GROW_READY_FILE


def _append_line(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_lines(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The complete JSON lines of ``path`` after byte ``offset``, and the offset after them."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    records = []
    for raw in complete.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(raw)
            if isinstance(record, dict):
                records.append(record)
    return records, offset + len(complete)


def record_loss(job_dir: Path | str, node: int, description: str, remaining: int | None = None) -> None:
    """Note that ``node`` was lost and ``remaining`` nodes go on: the agents of the others restart their ranks at
    once, at the smaller size, and close the next rendezvous round as soon as ``remaining`` nodes joined it."""
    record: dict[str, Any] = {"time": time.time(), "node": node, "why": description}
    if remaining is not None:
        record["remaining"] = remaining
    _append_line(elastic_dir(job_dir) / LOSSES_FILE, record)


def losses_since(job_dir: Path | str, since: float) -> list[dict[str, Any]]:
    """Nodes recorded as lost at or after ``since`` (a time), oldest first."""
    records, _ = read_lines(elastic_dir(job_dir) / LOSSES_FILE)
    return [r for r in records if isinstance(r.get("time"), int | float) and r["time"] >= since]


def request_grow(job_dir: Path | str, nodes: list[int]) -> None:
    """Ask the ranks to checkpoint and wait for ``nodes`` to join (see the module docstring)."""
    path = grow_request_path(job_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"time": time.time(), "nodes": nodes}), encoding="utf-8")
    os.replace(temporary, path)


def clear_grow(job_dir: Path | str) -> None:
    for path in (grow_request_path(job_dir), grow_ready_path(job_dir)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def grow_ready(job_dir: Path | str) -> dict[str, Any] | None:
    """What the ranks wrote once they checkpointed for a grow (``{"step": ..., "time": ...}``), or ``None``."""
    try:
        return json.loads(grow_ready_path(job_dir).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


# the store


def start_store(job_dir: Path, port: int, python: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the rendezvous store of the job in ``job_dir`` on 127.0.0.1:``port`` (see the module docstring)."""
    elastic_dir(job_dir).mkdir(parents=True, exist_ok=True)
    with (job_dir / "supervisor.log").open("ab") as log:
        process = subprocess.Popen(
            [python, "-m", "trainjob.backends.local.supervisor.rendezvous", str(job_dir), str(port)],
            env={**env, JOB_DIR_ENV: str(job_dir)}, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (elastic_dir(job_dir) / STORE_FILE).write_text(json.dumps({"pid": process.pid, "port": port}), encoding="utf-8")
    return process


def store_info(job_dir: Path) -> dict[str, Any] | None:
    """``{"pid", "port"}`` of the job's rendezvous store as last started, or ``None``."""
    try:
        return json.loads((elastic_dir(job_dir) / STORE_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    job_dir, port = (argv if argv is not None else sys.argv[1:])[:2]
    from datetime import timedelta

    from torch.distributed import TCPStore

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    store = TCPStore("127.0.0.1", int(port), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    unsupervised_since: float | None = None
    while not stopping and Path(job_dir).is_dir():
        if supervisor_lock_held(Path(job_dir)):
            unsupervised_since = None
        elif unsupervised_since is None:
            unsupervised_since = time.monotonic()
        elif time.monotonic() - unsupervised_since > STORE_UNSUPERVISED_LIMIT_SECONDS:
            break
        time.sleep(CHECK_SECONDS)
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
