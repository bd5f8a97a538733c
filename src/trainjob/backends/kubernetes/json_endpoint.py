"""A small HTTP/1.1 server on asyncio's streams (TLS when given a context) for JSON requests and answers: what the
operator's status endpoint (:mod:`.status_server`) serves on, without a web framework in the operator's process.

It reads a request line, headers (at most 64 KiB of them) and a body of ``Content-Length`` bytes (at most
``max_body``; a chunked body is refused with 411), hands them to ``handle(request)`` and writes the JSON it returns;
a connection is kept for the client's next request unless it says ``Connection: close``, or stays idle longer than
``idle_timeout``::

    async def handle(request: Request) -> tuple[int, dict]:
        return 200, {"message": "accepted"}

    endpoint = JsonEndpoint(handle, host="0.0.0.0", port=8443, ssl=context)
    port = await endpoint.start()
    ...
    await endpoint.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl as ssl_module
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

log = logging.getLogger("trainjob.operator")

HEADER_LIMIT = 64 * 1024


@dataclass
class Request:
    method: str
    path: str
    #: Header names in lower case.
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        """The body as JSON (:class:`ValueError` when it is not)."""
        return json.loads(self.body)


Handler = Callable[[Request], Awaitable[tuple[int, dict[str, Any]]]]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class JsonEndpoint:
    """Serves ``handle`` on ``host:port`` (``port`` 0: any free one) until stopped."""

    def __init__(self, handle: Handler, host: str = "0.0.0.0", port: int = 0,
                 ssl: ssl_module.SSLContext | None = None, max_body: int = 64 * 1024,
                 idle_timeout: float = 75.0) -> None:
        self.handle, self.host, self.port, self.ssl = handle, host, port, ssl
        self.max_body, self.idle_timeout = max_body, idle_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl,
                                                  limit=HEADER_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            while True:
                try:
                    request = await asyncio.wait_for(self._read(reader), self.idle_timeout)
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl_module.SSLError):
                    return
                except _Refused as refused:
                    await self._write(writer, refused.status, {"message": str(refused)}, close=True)
                    return
                if request is None:
                    return
                try:
                    status, answer = await self.handle(request)
                except Exception as exc:  # noqa: BLE001  (a handler's bug answers 500, the server goes on)
                    log.exception("%s %s failed", request.method, request.path)
                    status, answer = 500, {"message": f"internal error: {exc}"}
                close = request.headers.get("connection", "").lower() == "close"
                await self._write(writer, status, answer, close=close)
                if close:
                    return
        except (ConnectionError, ssl_module.SSLError):
            return
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read(self, reader: asyncio.StreamReader) -> Request | None:
        """The next request on the connection; ``None`` when the client closed it between requests."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial.strip():
                return None
            raise
        except asyncio.LimitOverrunError as exc:
            raise _Refused(431, f"the request's headers exceed {HEADER_LIMIT} bytes") from exc
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(400, f"not an HTTP/1.x request line: {lines[0][:100]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, colon, value = line.partition(":")
            if not colon:
                raise _Refused(400, f"not a header line: {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _Refused(411, "a chunked body is not accepted; send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _Refused(400, f"Content-Length is not a number: {headers['content-length']!r}") from exc
        if length < 0 or length > self.max_body:
            raise _Refused(413, f"the body is {length} bytes; at most {self.max_body} are accepted")
        body = await reader.readexactly(length) if length else b""
        return Request(parts[0].upper(), parts[1], headers, body)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, status: int, answer: dict[str, Any], close: bool) -> None:
        data = json.dumps(answer).encode()
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
                f"Content-Length: {len(data)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n")
        writer.write(head.encode("latin-1") + data)
        await writer.drain()
