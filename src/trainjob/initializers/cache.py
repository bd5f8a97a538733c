"""The download cache: one copy per machine of each source at each version, shared read-only by every job.

Beyond Kubeflow, whose initializers download again into each job's volume. An entry is keyed by the source (its
URI and server), the version (the Hub commit a revision resolves to; for S3 a digest of the objects' keys, sizes
and ETags) and the file patterns, so a new commit or a changed object is a new entry and an entry never changes
once written. Jobs get an entry's files as hard links (copies across filesystems), read-only.

Layout, under ``$TRAINJOB_HOME/cache/data`` locally (``TRAINJOB_INITIALIZER_CACHE`` for an initializer)::

    <key>/lock          held while the entry is downloaded (a second job of the same source waits, then links)
    <key>/staging/      the download in progress; a run that was stopped resumes from the files verified here
    <key>/data/         the finished files (read-only)
    <key>/entry.json    written last: what the entry is (uri, version, files, bytes, created, last used)

``trainjob cache list`` shows the entries, ``trainjob cache prune`` removes them (all, or those unused for a
while); an entry being downloaded or linked is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from trainjob.initializers.config import S3_SCHEME, InitializerConfig
from trainjob.initializers.transfer import Listing, make_read_only, remove_tree

#: Where a machine's cache is (a folder), or ``off``; default ``$TRAINJOB_HOME/cache/data``.
DATA_CACHE_ENV = "TRAINJOB_DATA_CACHE"
ENTRY_FILE = "entry.json"
DATA_DIR = "data"
STAGING_DIR = "staging"
LOCK_FILE = "lock"


def data_cache_dir(home: Path, environ: Mapping[str, str]) -> str | None:
    """This machine's cache: ``$TRAINJOB_DATA_CACHE`` (``off``: none), else ``$TRAINJOB_HOME/cache/data``."""
    chosen = environ.get(DATA_CACHE_ENV, "")
    if chosen.lower() in ("off", "0", "none", "false"):
        return None
    return str(Path(chosen).expanduser().resolve()) if chosen else str(home / "cache" / "data")


def cache_key(config: InitializerConfig, listing: Listing) -> str:
    """The entry of ``config``'s source at ``listing``'s version, with its patterns."""
    source = config.source
    server = config.endpoint if source.scheme == S3_SCHEME else config.hf_endpoint
    identity = {"scheme": source.scheme, "server": server or "", "repo": source.repo_id, "kind": config.kind,
                "bucket": source.bucket, "prefix": source.prefix, "version": listing.version,
                "ignore": list(config.ignore_patterns), "allow": list(config.allow_patterns or ())}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class CacheEntry:
    """What ``entry.json`` says of one entry."""

    key: str
    uri: str
    kind: str
    version: str
    files: int
    bytes: int
    created: float
    last_used: float
    path: str = ""


class DataCache:
    """The cache folder ``root``: find, fill, list and prune entries."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    @contextlib.contextmanager
    def locked(self, key: str, blocking: bool = True) -> Iterator[bool]:
        """Hold entry ``key``'s lock for the block; yields whether it was taken (always, when ``blocking``)."""
        folder = self.entry_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / LOCK_FILE, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def get(self, key: str) -> CacheEntry | None:
        """The finished entry ``key`` (its ``last_used`` now), or ``None``."""
        meta = self.entry_dir(key) / ENTRY_FILE
        data = self.entry_dir(key) / DATA_DIR
        if not meta.is_file() or not data.is_dir():
            return None
        entry = _read_entry(meta)
        if entry is None:
            return None
        entry.last_used = time.time()
        _write_json(meta, asdict(entry) | {"path": ""})
        entry.path = str(data)
        return entry

    def staging(self, key: str) -> Path:
        """The folder a download of entry ``key`` goes into; kept across runs so a stopped one resumes."""
        path = self.entry_dir(key) / STAGING_DIR
        path.mkdir(parents=True, exist_ok=True)
        return path

    def publish(self, key: str, config: InitializerConfig, listing: Listing) -> CacheEntry:
        """Entry ``key``'s staging folder, verified, becomes its data (read-only), and its ``entry.json`` is
        written: from then on every job finds it."""
        folder = self.entry_dir(key)
        data = folder / DATA_DIR
        remove_tree(data)
        os.rename(folder / STAGING_DIR, data)
        make_read_only(data)
        now = time.time()
        entry = CacheEntry(key=key, uri=config.source.uri, kind=config.kind, version=listing.version,
                           files=len(listing.files), bytes=listing.total_bytes, created=now, last_used=now)
        _write_json(folder / ENTRY_FILE, asdict(entry))
        entry.path = str(data)
        return entry

    def entries(self) -> list[CacheEntry]:
        """Every finished entry, most recently used first."""
        found = []
        if self.root.is_dir():
            for folder in self.root.iterdir():
                entry = _read_entry(folder / ENTRY_FILE)
                if entry is not None:
                    entry.path = str(folder / DATA_DIR)
                    found.append(entry)
        return sorted(found, key=lambda e: e.last_used, reverse=True)

    def prune(self, older_than_seconds: float | None = None, keys: list[str] | None = None) -> list[CacheEntry]:
        """Remove the entries unused for ``older_than_seconds`` (all when ``None``), or those of ``keys``
        (a key's prefix is enough), and the leftovers of stopped downloads; the removed entries. An entry whose
        lock a running initializer holds is left alone."""
        removed = []
        now = time.time()
        for folder in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if not folder.is_dir():
                continue
            entry = _read_entry(folder / ENTRY_FILE)
            if keys is not None and not any(folder.name.startswith(k) for k in keys):
                continue
            if entry is not None and older_than_seconds is not None and now - entry.last_used < older_than_seconds:
                continue
            with self.locked(folder.name, blocking=False) as taken:
                if not taken:
                    continue
                remove_tree(folder / DATA_DIR)
                remove_tree(folder / STAGING_DIR)
                (folder / ENTRY_FILE).unlink(missing_ok=True)
            remove_tree(folder)
            if entry is not None:
                entry.path = str(folder / DATA_DIR)
                removed.append(entry)
        return removed


def _read_entry(path: Path) -> CacheEntry | None:
    try:
        data = json.loads(path.read_text())
        return CacheEntry(**{k: v for k, v in data.items() if k in CacheEntry.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
