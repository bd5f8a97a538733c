"""The operator's health probe: ``GET`` on the path of its ``--liveness`` URL answers 200 with a small JSON report
(how many jobs wait for a reconcile, or that the replica stands by for the leader lease), in a thread of its own
(:mod:`http.server`), so a busy event loop does not fail the kubelet's probe::

    with HealthServer("http://0.0.0.0:8080/healthz", lambda: {"queue": len(queue)}):
        ...
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


class HealthServer:
    """Serves ``report()`` as JSON on ``url``'s path (any other path: 404) while started."""

    def __init__(self, url: str, report: Callable[[], dict[str, Any]]) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"--liveness: {url!r} is not an http:// URL; expected e.g. http://0.0.0.0:8080/healthz")
        self.host, self.port, self.path = parts.hostname or "0.0.0.0", parts.port or 80, parts.path or "/"
        self.report = report
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Listen; the port (the one chosen when the URL names port 0)."""
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                if self.path.split("?", 1)[0] != health.path:
                    self._answer(404, {"message": f"not found; the health probe is at {health.path}"})
                    return
                try:
                    self._answer(200, health.report())
                except Exception as exc:  # noqa: BLE001  (an unhealthy report is the probe's answer)
                    self._answer(500, {"message": str(exc)})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (every probe: no log line)
                return

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-probe", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
