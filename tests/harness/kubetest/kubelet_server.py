"""The node agent's kubelet endpoint: ``GET /containerLogs/{namespace}/{pod}/{container}`` over TLS.

The API server proxies ``pods/log`` here (``kubectl logs``, the SDK's ``read_namespaced_pod_log``), presenting its
kubelet client certificate; the query parameters are the kubelet's: ``follow``, ``tailLines``, ``sinceSeconds``,
``sinceTime``, ``timestamps``, ``previous``, ``limitBytes``. Logs are stored as the CRI writes them, one line per
record: ``2026-11-23T08:00:00.123456789Z stdout F text``.
"""

from __future__ import annotations

import datetime
import ssl
import threading
import time
import urllib.parse
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO


def write_cri_line(out: BinaryIO, stream: str, line: bytes) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
    tag = b"F" if line.endswith(b"\n") else b"P"
    out.write(f"{stamp} {stream} ".encode() + tag + b" " + line.rstrip(b"\n") + b"\n")
    out.flush()


def _parse(record: bytes) -> tuple[str, bytes]:
    parts = record.split(b" ", 3)
    if len(parts) < 4:
        return "", record
    return parts[0].decode(), parts[3]


def _since(query: dict[str, str]) -> str | None:
    if "sinceTime" in query:
        return datetime.datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00")).strftime(
            "%Y-%m-%dT%H:%M:%S.%f000Z"
        )
    if "sinceSeconds" in query:
        start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=int(query["sinceSeconds"]))
        return start.strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    return None


class LogServer:
    """Serves the logs of containers registered with :meth:`register` (one file per container run)."""

    def __init__(self, cert: str, key: str, client_ca: str) -> None:
        self.files: dict[tuple[str, str, str], list[Path]] = {}
        self.finished: set[Path] = set()
        self.lock = threading.Lock()
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        self.server = server
        self.port = int(server.server_address[1])
        threading.Thread(target=server.serve_forever, name="kubelet-server", daemon=True).start()

    def register(self, pod: dict[str, Any], container: str, path: Path, restart: int) -> None:
        meta = pod["metadata"]
        with self.lock:
            runs = self.files.setdefault((meta["namespace"], meta["name"], container), [])
            runs.append(path)

    def finish(self, path: Path) -> None:
        """The container run that writes ``path`` has exited: followers stop at its end."""
        with self.lock:
            self.finished.add(path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404, "not found")
                    return
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
                with owner.lock:
                    runs = list(owner.files.get((parts[1], parts[2], parts[3]), []))
                if query.get("previous") == "true":
                    runs = runs[:-1]
                if not runs:
                    what = "previous terminated container" if query.get("previous") == "true" else "container"
                    self.send_error(404, f"{what} {parts[3]!r} in pod {parts[2]!r} not found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                owner._stream(self.wfile, runs[-1], query, lambda: owner._is_latest(parts, runs[-1]))

        return Handler

    def _is_latest(self, parts: list[str], path: Path) -> bool:
        with self.lock:
            runs = self.files.get((parts[1], parts[2], parts[3]), [])
            return bool(runs) and runs[-1] == path

    def _stream(self, out: BinaryIO, path: Path, query: dict[str, str], latest: Any) -> None:
        since = _since(query)
        stamps = query.get("timestamps") == "true"
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        tail = int(query["tailLines"]) if "tailLines" in query and int(query["tailLines"]) >= 0 else None
        sent = 0

        def emit(record: bytes) -> bool:
            nonlocal sent
            stamp, text = _parse(record.rstrip(b"\n"))
            if since and stamp < since:
                return True
            data = (stamp.encode() + b" " if stamps else b"") + text + b"\n"
            if limit is not None and sent + len(data) > limit:
                data = data[: limit - sent]
            out.write(data)
            sent += len(data)
            return limit is None or sent < limit

        try:
            with path.open("rb") as f:
                records = f.readlines()
                if tail is not None:
                    records = list(deque(records, maxlen=tail))
                for record in records:
                    if not emit(record):
                        return
                out.flush()
                if query.get("follow") != "true":
                    return
                pending = b""
                idle_since = time.monotonic()
                while True:
                    chunk = f.readline()
                    if chunk:
                        pending += chunk
                        if pending.endswith(b"\n"):
                            if not emit(pending):
                                return
                            out.flush()
                            pending = b""
                        idle_since = time.monotonic()
                        continue
                    # Stop following once the container run is over and its output has been read.
                    with self.lock:
                        over = path in self.finished
                    if (over and time.monotonic() - idle_since > 0.5) or not latest() or not path.exists():
                        return
                    time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            return
