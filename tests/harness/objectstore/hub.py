"""A Hugging Face Hub-compatible HTTP server for tests, serving repositories from local folders.

The real ``huggingface_hub`` client (``snapshot_download``, ``hf_hub_download``, ``HfApi().repo_info``,
``HfApi().list_repo_files``) talks to it unchanged with ``endpoint=server.endpoint`` (or ``HF_ENDPOINT``)::

    with HubServer() as hub:
        sha = hub.add_repo("org/tiny", model_dir)
        snapshot_download("org/tiny", local_dir=target, endpoint=hub.endpoint)

What it serves, as the Hub does (``huggingface_hub`` 2.x):

- ``GET /api/{models,datasets}/{repo_id}[/revision/{revision}]``: the repo's info, ``sha`` and ``siblings``
  (``?blobs=true`` adds their sizes and blob ids);
- ``GET /api/{models,datasets}/{repo_id}/tree/{revision}[/{path}]?recursive=...``: the tree listing, one page;
- ``HEAD``/``GET /[datasets/]{repo_id}/resolve/{revision}/{filename}``: the file, with ``ETag`` (its sha256, quoted),
  ``X-Repo-Commit``, ``Content-Length`` and ``Accept-Ranges``; ``Range: bytes=...`` answers 206.

Errors carry the ``X-Error-Code`` the client maps to its exceptions: ``RepoNotFound`` (also for a missing or wrong
token, 401, as the Hub answers for private repos; ``GatedRepo`` with ``gated=True``), ``RevisionNotFound``,
``EntryNotFound``. No Xet headers are ever sent, so the client downloads over plain HTTP. Files are never
redirected (the real Hub redirects LFS files to a CDN with ``X-Linked-Etag`` / ``X-Linked-Size``).

Stdlib only: a :class:`http.server.ThreadingHTTPServer` in a background thread of the test process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: The repo types served, and the plural the URLs use for each.
REPO_TYPES = {"model": "models", "dataset": "datasets"}
_PLURALS = {plural: singular for singular, plural in REPO_TYPES.items()}
_COMMIT = re.compile(r"[0-9a-f]{40}")
_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
_API_OPERATIONS = ("revision", "tree")
#: Files listed as LFS files (with their sha256), as the Hub lists weights and data files.
LFS_SUFFIXES = (".safetensors", ".parquet", ".bin", ".pt", ".arrow")


@dataclass(frozen=True)
class Blob:
    """One file's content and the hashes the Hub reports for it."""

    data: bytes
    sha256: str
    git_oid: str

    @classmethod
    def of(cls, data: bytes) -> Blob:
        """The blob of ``data``: sha256, and the git blob sha1 (``blob <size>\\0`` + data)."""
        git = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        return cls(data=data, sha256=hashlib.sha256(data).hexdigest(), git_oid=git)


@dataclass(frozen=True)
class Commit:
    """A snapshot of a folder: repo-relative POSIX paths to blobs."""

    sha: str
    files: dict[str, Blob]
    created: str


@dataclass
class Repo:
    """A repository: its commits by sha and its refs (branch or tag names) to commit shas."""

    repo_id: str
    repo_type: str
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        """The commit a ref name or full commit sha names, if any."""
        if revision in self.refs:
            return self.commits[self.refs[revision]]
        return self.commits.get(revision) if _COMMIT.fullmatch(revision) else None


@dataclass(frozen=True)
class Served:
    """One request the server answered."""

    method: str
    path: str
    query: str
    status: int
    range: str | None
    authorized: bool


@dataclass
class _Drop:
    suffix: str
    nbytes: int
    times: int
    corrupt: bool = False  # send every byte, the first one changed, instead of cutting the body short


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # joined by server_close, after stop() has shut their connections
    block_on_close = True
    hub: HubServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-answer (or a connection shut by :meth:`HubServer.stop`) is no error worth a trace."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _Refusal(Exception):
    """An error answer: status, X-Error-Code, message."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects; every answer carries Content-Length
    server: _Server
    timeout = 30  # an idle keep-alive connection is dropped after this many seconds

    def setup(self) -> None:
        super().setup()
        self.server.hub._connection_opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.hub._connection_closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read :attr:`HubServer.served` instead."""

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        path = unquote(url.path)
        authorized = hub._authorized(self.headers.get("Authorization"))
        status = HTTPStatus.OK
        try:
            if not authorized:
                raise _Refusal(
                    HTTPStatus.UNAUTHORIZED,
                    "GatedRepo" if hub.gated else "RepoNotFound",
                    f"Access to {path} is restricted: a valid token is required",
                )
            status = self._route(url.path, parse_qs(url.query), body)
        except _Refusal as refusal:
            status = HTTPStatus(refusal.status)
            self._error(refusal, body)
        finally:
            hub._record(
                Served(
                    method=self.command,
                    path=path,
                    query=url.query,
                    status=int(status),
                    range=self.headers.get("Range"),
                    authorized=authorized,
                )
            )

    # routing

    def _route(self, raw_path: str, query: dict[str, list[str]], body: bool) -> HTTPStatus:
        segments = raw_path.lstrip("/").split("/")
        if segments[0] == "api" and len(segments) >= 3 and segments[1] in _PLURALS:
            return self._api(_PLURALS[segments[1]], segments[2:], query, body)
        repo_type = "model"
        if segments[0] in _PLURALS and segments[0] != "models":
            repo_type, segments = _PLURALS[segments[0]], segments[1:]
        for split in (2, 1):
            if len(segments) >= split + 3 and segments[split] == "resolve":
                repo_id = "/".join(segments[:split])
                revision = unquote(segments[split + 1])
                filename = unquote("/".join(segments[split + 2 :]))
                return self._file(repo_type, repo_id, revision, filename, body)
        raise _Refusal(HTTPStatus.NOT_FOUND, None, f"no route for {unquote(raw_path)}")

    def _api(self, repo_type: str, segments: list[str], query: dict[str, list[str]], body: bool) -> HTTPStatus:
        for split in (2, 1):
            if len(segments) >= split + 2 and segments[split] in _API_OPERATIONS:
                repo_id = "/".join(segments[:split])
                operation, revision = segments[split], unquote(segments[split + 1])
                rest = unquote("/".join(segments[split + 2 :]))
                break
        else:
            if len(segments) > 2:
                raise _Refusal(HTTPStatus.NOT_FOUND, None, f"no route for {'/'.join(segments)}")
            repo_id, operation, revision, rest = "/".join(segments), "revision", "main", ""
        repo, commit = self.server.hub._lookup(repo_type, repo_id, revision)
        if operation == "revision" and not rest:
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            return self._json(_repo_info(repo, commit, blobs), body)
        if operation == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(_tree(repo, commit, rest.strip("/"), recursive), body)
        raise _Refusal(HTTPStatus.NOT_FOUND, None, f"no route for {'/'.join(segments)}")

    # answers

    def _file(self, repo_type: str, repo_id: str, revision: str, filename: str, body: bool) -> HTTPStatus:
        hub = self.server.hub
        repo, commit = hub._lookup(repo_type, repo_id, revision)
        blob = commit.files.get(filename)
        if blob is None:
            raise _Refusal(
                HTTPStatus.NOT_FOUND, "EntryNotFound", f"{filename} does not exist in {repo_id}@{revision}", commit.sha
            )
        size = len(blob.data)
        start, end = 0, size  # [start, end)
        status = HTTPStatus.OK
        header = self.headers.get("Range")
        if header is not None:
            wanted = _parse_range(header, size)
            if wanted is None:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
            start, end = wanted
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{blob.sha256}"')
        self.send_header("X-Repo-Commit", commit.sha)
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not body:
            return status
        drop = hub._take_drop(filename)
        if drop is None or drop.corrupt:
            data = blob.data[start:end]
            if drop is not None and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            _write_paced(self.wfile, data, hub.bytes_per_second)
            return status
        cut = drop.nbytes
        # Headers promised end - start bytes; send fewer and close, as a broken transfer would.
        self.wfile.write(blob.data[start : min(end, start + cut)])
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        return status

    def _json(self, payload: Any, body: bool) -> HTTPStatus:
        data = json.dumps(payload).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        return HTTPStatus.OK

    def _error(self, refusal: _Refusal, body: bool) -> None:
        data = json.dumps({"error": refusal.message}).encode()
        self.send_response(refusal.status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)) if body else "0")
        if refusal.code is not None:
            self.send_header("X-Error-Code", refusal.code)
        self.send_header("X-Error-Message", refusal.message)
        if refusal.commit is not None:
            self.send_header("X-Repo-Commit", refusal.commit)
        self.end_headers()
        if body:
            self.wfile.write(data)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` as ``[start, end)`` within ``size``; None if unsatisfiable."""
    match = _RANGE.match(header)
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last or int(last) == 0:
            return None
        return max(0, size - int(last)), size
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    if start >= size or start >= end:
        return None
    return start, end


def _repo_info(repo: Repo, commit: Commit, blobs: bool) -> dict[str, Any]:
    siblings: list[dict[str, Any]] = []
    for name, blob in sorted(commit.files.items()):
        sibling: dict[str, Any] = {"rfilename": name}
        if blobs:
            sibling.update(size=len(blob.data), blobId=blob.git_oid)
        siblings.append(sibling)
    author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
    return {
        "_id": hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}".encode(), usedforsecurity=False).hexdigest()[:24],
        "id": repo.repo_id,
        "author": author,
        "sha": commit.sha,
        "lastModified": commit.created,
        "createdAt": min(c.created for c in repo.commits.values()),
        "private": False,
        "gated": False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": sum(len(b.data) for b in commit.files.values()),
    }


def _write_paced(out: Any, data: bytes, bytes_per_second: int | None) -> None:
    if not bytes_per_second:
        out.write(data)
        return
    chunk = max(1, bytes_per_second // 20)
    for offset in range(0, len(data), chunk):
        out.write(data[offset: offset + chunk])
        out.flush()
        time.sleep(0.05)


def _tree(repo: Repo, commit: Commit, folder: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{folder}/" if folder else ""
    files = {name: blob for name, blob in commit.files.items() if name.startswith(prefix)}
    if folder and not files:
        raise _Refusal(
            HTTPStatus.NOT_FOUND, "EntryNotFound", f"{folder} does not exist in {repo.repo_id}@{commit.sha}", commit.sha
        )
    entries: dict[str, dict[str, Any]] = {}
    for name, blob in sorted(files.items()):
        parts = name[len(prefix) :].split("/")
        for depth in range(1, len(parts)):
            if not recursive and depth > 1:
                break
            directory = prefix + "/".join(parts[:depth])
            oid = hashlib.sha1(f"tree {commit.sha} {directory}".encode(), usedforsecurity=False).hexdigest()
            entries.setdefault(directory, {"type": "directory", "oid": oid, "size": 0, "path": directory})
        if recursive or len(parts) == 1:
            entries[name] = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": name}
            if name.endswith(LFS_SUFFIXES):  # the Hub stores these with LFS and lists their sha256
                entries[name]["lfs"] = {"oid": blob.sha256, "size": len(blob.data), "pointerSize": 134}
    return list(entries.values())


class HubServer:
    """A Hub-compatible server on 127.0.0.1, on a free port, in a background thread of this process.

    ``token``: when set, every request must carry ``Authorization: Bearer <token>``; others get 401 with
    ``X-Error-Code: RepoNotFound`` (``GatedRepo`` if ``gated``). ``requests`` lists the (method, path) of every
    request answered, path percent-decoded and without its query; ``served`` has the details.
    """

    def __init__(self, token: str | None = None, *, gated: bool = False, host: str = "127.0.0.1") -> None:
        self.token = token
        self.gated = gated
        #: When set, file bodies are sent at about this rate (a slow link: a download long enough to watch).
        self.bytes_per_second: int | None = None
        self.requests: list[tuple[str, str]] = []
        self.served: list[Served] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._drops: list[_Drop] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server = _Server((host, 0), _Handler)
        self._server.hub = self
        self.port: int = self._server.server_address[1]
        self.endpoint = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"hub-server-{self.port}"
        )
        self._thread.daemon = True
        self._thread.start()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def add_repo(self, repo_id: str, folder: Path, repo_type: str = "model", revision: str = "main") -> str:
        """Register the files under ``folder`` as a commit of ``repo_id`` and point ``revision`` at it.

        Returns the commit's sha, a sha1 of the repo and its files (paths and contents): the same content gives the
        same sha, other content a new one; earlier commits stay reachable by their sha.
        """
        if repo_type not in REPO_TYPES:
            raise ValueError(f"repo_type {repo_type!r}: one of {sorted(REPO_TYPES)}")
        if not Path(folder).is_dir():
            raise NotADirectoryError(folder)
        files = {
            path.relative_to(folder).as_posix(): Blob.of(path.read_bytes())
            for path in sorted(Path(folder).rglob("*"))
            if path.is_file()
        }
        digest = hashlib.sha1(f"{repo_type}\0{repo_id}\0".encode(), usedforsecurity=False)
        for name, blob in sorted(files.items()):
            digest.update(f"{name}\0{blob.git_oid}\0".encode())
        sha = digest.hexdigest()
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        with self._lock:
            repo = self._repos.setdefault((repo_type, repo_id), Repo(repo_id=repo_id, repo_type=repo_type))
            repo.commits.setdefault(sha, Commit(sha=sha, files=files, created=created))
            repo.refs[revision] = sha
        return sha

    def drop_after(self, path_suffix: str, nbytes: int, times: int = 1) -> None:
        """The next ``times`` GETs of a file whose name ends with ``path_suffix`` send only ``nbytes`` of the body
        (after headers promising all of it) and close the connection."""
        with self._lock:
            self._drops.append(_Drop(path_suffix, nbytes, times))

    def corrupt(self, path_suffix: str, times: int = 1) -> None:
        """The next ``times`` GETs of a file whose name ends with ``path_suffix`` send a body of the right length
        whose first byte is changed, as a bad cache or proxy on the way would (the listing's sha256 is unchanged)."""
        with self._lock:
            self._drops.append(_Drop(path_suffix, 0, times, corrupt=True))

    def stop(self) -> None:
        """Stop serving, close open connections and join the threads."""
        if not self._thread.is_alive():
            return
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        self._thread.join()

    # called by the handler threads

    def _authorized(self, header: str | None) -> bool:
        return self.token is None or header == f"Bearer {self.token}"

    def _lookup(self, repo_type: str, repo_id: str, revision: str) -> tuple[Repo, Commit]:
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise _Refusal(HTTPStatus.NOT_FOUND, "RepoNotFound", f"Repository not found: {repo_type} {repo_id}")
        commit = repo.resolve(revision)
        if commit is None:
            raise _Refusal(
                HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision} in {repo_type} {repo_id}"
            )
        return repo, commit

    def _take_drop(self, filename: str) -> _Drop | None:
        with self._lock:
            for drop in self._drops:
                if drop.times > 0 and filename.endswith(drop.suffix):
                    drop.times -= 1
                    return drop
        return None

    def _record(self, served: Served) -> None:
        with self._lock:
            self.served.append(served)
            self.requests.append((served.method, served.path))

    def _connection_opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _connection_closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)
