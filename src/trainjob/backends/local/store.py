"""Job state of the local backend in SQLite under ``$TRAINJOB_HOME`` (default ``~/.trainjob``).

One database file, ``trainjob.db``, in WAL mode so CLI, SDK and supervisor processes read and write at once;
each thread gets its own connection, so one ``Store`` (one SDK client) can be shared by threads.
Tables: ``jobs`` (one row per job: status, counts, progress columns, the TrainJob resource and, in column
``launch``, the :class:`~trainjob.backends.local.process_specs.ProcessSpec` its nodes start from), ``nodes`` (one
row per node process), ``events``, ``metrics`` and ``rendered`` (each job's resource as ``list -o json`` writes
it, kept until triggers drop it when the job's row or its nodes change). ``list_jobs`` reads only the narrow
columns of one indexed query, so listing ten thousand jobs stays well under a tenth of a second::

    store = Store.open()
    for row in store.list_jobs():
        print(row["name"], row["status"])
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trainjob.constants import CREATED, QUEUED, RUNNING
from trainjob.errors import AlreadyExistsError, NotFoundError, ValidationError
from trainjob.settings import default_home

DB_FILE = "trainjob.db"
ACTIVE_STATUSES = (CREATED, RUNNING)
#: Statuses of a job that has not ended: active, or waiting in the local queue for resources.
UNFINISHED_STATUSES = (QUEUED, *ACTIVE_STATUSES)
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    uid TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    message TEXT,
    runtime TEXT NOT NULL,
    num_nodes INTEGER NOT NULL,
    num_proc_per_node INTEGER NOT NULL,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    restarts INTEGER NOT NULL DEFAULT 0,
    supervisor_pid INTEGER,
    supervisor_started REAL,
    request TEXT,
    step INTEGER,
    total_steps INTEGER,
    metrics TEXT,
    metrics_time REAL,
    first_step INTEGER,
    first_metrics_time REAL,
    resource TEXT NOT NULL,
    launch TEXT NOT NULL,
    metrics_offset INTEGER NOT NULL DEFAULT 0,
    supervisor_claimed REAL,
    supervisor_replacements INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_created ON jobs(created);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs(status);
CREATE TABLE IF NOT EXISTS nodes (
    job TEXT NOT NULL,
    idx INTEGER NOT NULL,
    pid INTEGER,
    pid_started REAL,
    status TEXT NOT NULL,
    exit_code INTEGER,
    started REAL,
    finished REAL,
    PRIMARY KEY (job, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    job TEXT NOT NULL,
    time REAL NOT NULL,
    type TEXT NOT NULL,
    reason TEXT NOT NULL,
    object TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job, id);
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT NOT NULL,
    time REAL NOT NULL,
    step INTEGER,
    total_steps INTEGER,
    metrics TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics(job, time);
CREATE TABLE IF NOT EXISTS rendered (
    name TEXT PRIMARY KEY,
    text TEXT NOT NULL
) WITHOUT ROWID;
""" + "".join(  # a job's kept text goes whenever its row or one of its nodes' rows is written
    f"CREATE TRIGGER IF NOT EXISTS rendered_{table}_{event.lower()} AFTER {event} ON {table} BEGIN "
    f"DELETE FROM rendered WHERE name = {row}.{column}; END;\n"
    for table, column in (("jobs", "name"), ("nodes", "job"))
    for event, row in (("INSERT", "NEW"), ("UPDATE", "OLD"), ("DELETE", "OLD"))
)
#: The schema's last statement: a database without it gets the rest of the schema when opened.
_SCHEMA_LAST = "rendered_nodes_delete"
#: Columns added after the first release, with their definitions: added to older databases when opened.
_ADDED_COLUMNS = {
    "metrics_offset": "INTEGER NOT NULL DEFAULT 0",
    "supervisor_claimed": "REAL",
    "supervisor_replacements": "INTEGER NOT NULL DEFAULT 0",
    # The local queue (:mod:`~trainjob.backends.local.queue`): what the job holds while admitted, its order.
    "priority": "INTEGER NOT NULL DEFAULT 0",
    "cpus": "INTEGER NOT NULL DEFAULT 0",
    "memory_bytes": "INTEGER NOT NULL DEFAULT 0",
    "gpus": "INTEGER NOT NULL DEFAULT 0",
    # ``trainjob/ttl-seconds-after-finished`` (:mod:`~trainjob.backends.local.client.ttl`).
    "ttl_seconds": "INTEGER",
    # What the last ``update_trainjob_status`` said (:mod:`trainjob.progress`).
    "progress_percent": "REAL",
    "remaining_seconds": "REAL",
    # Shrinkable elastic jobs (:mod:`~trainjob.backends.local.supervisor.rendezvous`): nodes in the current rendezvous round,
    # and how far the supervisor has read the rounds rank 0 reports.
    "elastic_nodes": "INTEGER",
    "elastic_offset": "INTEGER NOT NULL DEFAULT 0",
    # The local queue's words for a job: its Kueue queue name, where its priority came from, and what of it was
    # scaled down to fit this machine (:mod:`~trainjob.backends.local.client.scaling`; ``NULL``: nothing).
    "queue_name": "TEXT",
    "priority_source": "TEXT",
    "scaled": "TEXT",
}

#: Columns ``list_jobs`` reads: everything but the two JSON documents.
LIST_COLUMNS = (
    "name, namespace, status, reason, message, runtime, num_nodes, num_proc_per_node, created, started, "
    "finished, restarts, supervisor_pid, supervisor_started, step, total_steps, metrics, metrics_time, "
    "first_step, first_metrics_time, progress_percent, remaining_seconds, scaled"
)
#: Columns of :meth:`Store.list_summaries`, in order.
SUMMARY_COLUMNS = (
    "name, status, num_nodes, num_proc_per_node, runtime, created, started, finished, step, total_steps, "
    "json_extract(metrics, '$.loss'), metrics_time, first_step, first_metrics_time, progress_percent, "
    "remaining_seconds, supervisor_pid, supervisor_started"
)


def check_job_name(name: str) -> str:
    """``name`` if it is an RFC 1035 label (so it is also a safe directory name), else ``ValidationError``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValidationError(
            "metadata.name",
            "must be an RFC 1035 label: at most 63 lowercase letters, digits and '-', starting with a letter "
            f"and ending with a letter or digit, got {name!r}",
        )
    return name


class Store:
    """The SQLite database of one ``$TRAINJOB_HOME``; safe to use from several processes at once."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.jobs_dir = home / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        db = self._db
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode = WAL")
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (_SCHEMA_LAST,)).fetchone():
            db.executescript(_SCHEMA)
        self._add_missing_columns(db)

    @property
    def _db(self) -> sqlite3.Connection:
        """This thread's connection: a connection shared by threads mixes their transactions."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.home / DB_FILE, timeout=30, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA busy_timeout = 30000")
            db.execute("PRAGMA synchronous = NORMAL")
            self._local.db = db
            with self._connections_lock:
                self._connections.append(db)
        return db

    @staticmethod
    def _add_missing_columns(db: sqlite3.Connection) -> None:
        present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        for column, definition in _ADDED_COLUMNS.items():
            if column not in present:
                try:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {definition}")
                except sqlite3.OperationalError as exc:  # another process added it first
                    if "duplicate column" not in str(exc):
                        raise

    @classmethod
    def open(cls, home: Path | str | None = None) -> Store:
        """The store of ``home`` (default :func:`trainjob.settings.default_home`), created on first use."""
        return cls(Path(home) if home is not None else default_home())

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for db in connections:
            db.close()
        self._local = threading.local()

    def job_dir(self, name: str) -> Path:
        """The job's directory (logs, metrics, generated scripts); never outside ``$TRAINJOB_HOME``."""
        path = (self.jobs_dir / check_job_name(name)).resolve()
        if path.parent != self.jobs_dir.resolve():
            raise ValidationError("metadata.name", f"{name!r} would escape {self.jobs_dir}")
        return path

    # jobs

    def insert_job(self, row: dict[str, Any]) -> None:
        """Add a job row (``resource`` and ``launch``, the process spec, as dicts); ``AlreadyExistsError`` when the name is taken."""
        values = {**row, "resource": json.dumps(row["resource"]), "launch": json.dumps(row["launch"])}
        columns = ", ".join(values)
        marks = ", ".join(f":{key}" for key in values)
        try:
            self._db.execute(f"INSERT INTO jobs ({columns}) VALUES ({marks})", values)
        except sqlite3.IntegrityError:
            raise AlreadyExistsError(
                f"TrainJob {row['name']!r} already exists; delete it first (trainjob delete {row['name']}) "
                "or choose another name"
            ) from None

    def get_job(self, name: str) -> dict[str, Any]:
        """The full job row with ``resource`` and ``launch`` (the process spec) decoded; ``NotFoundError`` when there is none."""
        found = self._db.execute("SELECT * FROM jobs WHERE name = ?", (name,)).fetchone()
        if found is None:
            raise NotFoundError(f"TrainJob {name!r} not found; `trainjob list` shows the jobs there are")
        row = dict(found)
        row["resource"] = json.loads(row["resource"])
        row["launch"] = json.loads(row["launch"])
        return row

    def list_jobs(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Narrow rows (no JSON documents) of every job, oldest first, or of ``names``."""
        cursor = self._db.cursor()
        cursor.row_factory = None  # plain tuples made into dicts here: several times faster than sqlite3.Row's
        if names is None:
            cursor.execute(f"SELECT {LIST_COLUMNS} FROM jobs ORDER BY created")
        else:
            marks = ", ".join("?" * len(names))
            cursor.execute(f"SELECT {LIST_COLUMNS} FROM jobs WHERE name IN ({marks})", tuple(names))
        columns = [column[0] for column in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor]

    def list_full_jobs(self, unrendered: bool = False) -> list[dict[str, Any]]:
        """The rows of :meth:`list_jobs` with ``resource`` (decoded) too: one query for a listing that shows each
        job's resource (``trainjob list -o yaml``); ``unrendered``: only the jobs :meth:`renderings` has no text
        for."""
        cursor = self._db.cursor()
        cursor.row_factory = None
        where = " WHERE name NOT IN (SELECT name FROM rendered)" if unrendered else ""
        cursor.execute(f"SELECT {LIST_COLUMNS}, resource FROM jobs{where} ORDER BY created")
        columns = [column[0] for column in cursor.description]
        rows = []
        loads = json.loads
        for found in cursor:
            row = dict(zip(columns, found, strict=True))
            row["resource"] = loads(row["resource"])
            rows.append(row)
        return rows

    def list_summaries(self) -> list[tuple[Any, ...]]:
        """One tuple per job, oldest first, with only what a listing shows (see :data:`SUMMARY_COLUMNS`).

        Plain tuples and ``json_extract`` in SQL keep this to a few microseconds per job.
        """
        cursor = self._db.cursor()
        cursor.row_factory = None
        return cursor.execute(f"SELECT {SUMMARY_COLUMNS} FROM jobs ORDER BY created").fetchall()

    def renderings(self) -> list[tuple[Any, ...]]:
        """``(name, status, text, supervisor_pid, supervisor_started)`` of every job, oldest first: ``text`` is what
        :meth:`save_renderings` was given for the job, or ``None`` once the job's row or its nodes changed since
        (the schema's triggers drop it)."""
        cursor = self._db.cursor()
        cursor.row_factory = None
        return cursor.execute(
            "SELECT jobs.name, status, text, supervisor_pid, supervisor_started FROM jobs "
            "LEFT JOIN rendered ON rendered.name = jobs.name ORDER BY created"
        ).fetchall()

    def save_renderings(self, texts: dict[str, str]) -> None:
        """Keep each job's text (by name) for :meth:`renderings`; in the transaction that read what it shows."""
        self._db.executemany("INSERT OR REPLACE INTO rendered (name, text) VALUES (?, ?)", texts.items())

    def has_status(self, status: str) -> bool:
        """Whether any job has ``status`` (one indexed lookup)."""
        return self._db.execute("SELECT 1 FROM jobs WHERE status = ? LIMIT 1", (status,)).fetchone() is not None

    def update_job(self, name: str, **fields: Any) -> None:
        assignments = ", ".join(f"{key} = :{key}" for key in fields)
        self._db.execute(f"UPDATE jobs SET {assignments} WHERE name = :name", {**fields, "name": name})

    def transition(
        self, name: str, status: str, reason: str, message: str, *, from_statuses: Iterable[str], **fields: Any
    ) -> bool:
        """Set ``status`` only when the job is in one of ``from_statuses``; returns whether it changed.

        The condition makes concurrent writers (supervisor, a reader that found the supervisor dead, a user
        suspending) agree on one outcome: the first transition wins.
        """
        allowed = tuple(from_statuses)
        marks = ", ".join("?" * len(allowed))
        extra = "".join(f", {key} = ?" for key in fields)
        cursor = self._db.execute(
            f"UPDATE jobs SET status = ?, reason = ?, message = ?{extra} WHERE name = ? AND status IN ({marks})",
            (status, reason, message, *fields.values(), name, *allowed),
        )
        return cursor.rowcount == 1

    def claim_supervisor_replacement(self, name: str, lost_pid: int, now: float, retry_after: float) -> int | None:
        """Claim the right to start a replacement for the lost supervisor ``lost_pid``; the claim number, or
        ``None`` when another reader claimed it less than ``retry_after`` seconds ago (or it was replaced)."""
        with self.transaction():
            cursor = self._db.execute(
                "UPDATE jobs SET supervisor_claimed = ?, supervisor_replacements = supervisor_replacements + 1 "
                "WHERE name = ? AND supervisor_pid = ? AND (supervisor_claimed IS NULL OR supervisor_claimed < ?)",
                (now, name, lost_pid, now - retry_after),
            )
            if cursor.rowcount != 1:
                return None
            return self._db.execute("SELECT supervisor_replacements FROM jobs WHERE name = ?", (name,)).fetchone()[0]

    def get_request(self, name: str) -> str | None:
        """What a client asked of the job's supervisor (``suspend``), or ``deleted`` once the row is gone."""
        found = self._db.execute("SELECT request FROM jobs WHERE name = ?", (name,)).fetchone()
        return "deleted" if found is None else found[0]

    def delete_job(self, name: str) -> None:
        with self.transaction():
            for table, column in (("jobs", "name"), ("nodes", "job"), ("events", "job"), ("metrics", "job")):
                self._db.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))

    def transaction(self) -> _Transaction:
        """``with store.transaction(): ...`` runs the statements inside as one write transaction."""
        return _Transaction(self._db)

    # nodes

    def set_node(self, job: str, index: int, **fields: Any) -> None:
        """Insert or update the row of node ``index`` (the first call must give ``status``)."""
        columns = ", ".join(["job", "idx", *fields])
        marks = ", ".join("?" * (len(fields) + 2))
        updates = ", ".join(f"{key} = excluded.{key}" for key in fields)
        self._db.execute(
            f"INSERT INTO nodes ({columns}) VALUES ({marks}) ON CONFLICT (job, idx) DO UPDATE SET {updates}",
            (job, index, *fields.values()),
        )

    def nodes(self, job: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._db.execute("SELECT * FROM nodes WHERE job = ? ORDER BY idx", (job,))]

    def all_nodes(self) -> dict[str, list[dict[str, Any]]]:
        """Every job's node rows (as :meth:`nodes` gives them), by job, in one query."""
        found: dict[str, list[dict[str, Any]]] = {}
        for row in self._db.execute("SELECT * FROM nodes ORDER BY job, idx"):
            found.setdefault(row["job"], []).append(dict(row))
        return found

    # events and metrics

    def add_event(self, job: str, reason: str, message: str, *, type: str = "Normal", obj: str | None = None) -> None:
        self._db.execute(
            "INSERT INTO events (job, time, type, reason, object, message) VALUES (?, ?, ?, ?, ?, ?)",
            (job, time.time(), type, reason, obj or f"TrainJob/{job}", message),
        )

    def events(self, job: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._db.execute("SELECT * FROM events WHERE job = ? ORDER BY id", (job,))]

    def add_metrics(self, job: str, records: Sequence[dict[str, Any]], offset: int | None = None) -> None:
        """Store metric records (the JSON lines ``report`` and ``update_trainjob_status`` write,
        :mod:`trainjob.progress`) and the job's progress: the last metrics, the last step record's step, and the
        last progress record's percentage and time left.

        ``offset`` is how far the metrics file has been read; it is saved in the same transaction, so a
        supervisor that replaces a lost one continues where it stopped, neither losing nor repeating records.
        """
        if not records and offset is None:
            return
        with self.transaction():
            if offset is not None:
                self._db.execute("UPDATE jobs SET metrics_offset = ? WHERE name = ?", (offset, job))
            if not records:
                return
            self._db.executemany(
                "INSERT INTO metrics (job, time, step, total_steps, metrics) VALUES (?, ?, ?, ?, ?)",
                [(job, r["time"], r.get("step"), r.get("total_steps"), json.dumps(r.get("metrics") or {})) for r in records],
            )
            last = records[-1]
            self._db.execute(
                "UPDATE jobs SET metrics = ?, metrics_time = ? WHERE name = ?",
                (json.dumps(last.get("metrics") or {}), last["time"], job),
            )
            steps = [r for r in records if "progress_percent" not in r]
            if steps:
                self._db.execute(
                    "UPDATE jobs SET step = ?, total_steps = ?, progress_percent = NULL, remaining_seconds = NULL, "
                    "first_step = COALESCE(first_step, ?), first_metrics_time = COALESCE(first_metrics_time, ?) "
                    "WHERE name = ?",
                    (steps[-1].get("step"), steps[-1].get("total_steps"), steps[0].get("step"), steps[0]["time"], job),
                )
            if "progress_percent" in last:
                self._db.execute(
                    "UPDATE jobs SET progress_percent = ?, remaining_seconds = ? WHERE name = ?",
                    (last.get("progress_percent"), last.get("estimated_remaining_seconds"), job),
                )

    def metrics(self, job: str, after: int = 0) -> list[dict[str, Any]]:
        """The job's metric records in time order; ``after``: only those whose ``id`` is greater (live readers)."""
        rows = self._db.execute(
            "SELECT rowid AS id, time, step, total_steps, metrics FROM metrics WHERE job = ? AND rowid > ? ORDER BY time",
            (job, after),
        )
        return [{**dict(r), "metrics": json.loads(r["metrics"])} for r in rows]


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
