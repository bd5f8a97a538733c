"""The status endpoint's HTTP server: requests from http.client (what the pods' clients are built on) and raw bytes
it must refuse, over a real socket on this host."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from trainjob.backends.kubernetes.json_endpoint import JsonEndpoint, Request


@pytest.fixture
def endpoint() -> Iterator[tuple[int, list[Request]]]:
    """An endpoint on its own loop in a thread; it answers each request with what it received."""
    seen: list[Request] = []

    async def handle(request: Request) -> tuple[int, dict[str, Any]]:
        seen.append(request)
        if request.path == "/boom":
            raise RuntimeError("a bug")
        return 201, {"method": request.method, "body": request.json() if request.body else None,
                     "auth": request.headers.get("authorization")}

    loop = asyncio.new_event_loop()
    server = JsonEndpoint(handle, host="127.0.0.1", port=0, max_body=1024)
    port = loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port, seen
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_requests_on_one_connection_are_answered_in_turn(endpoint: tuple[int, list[Request]]) -> None:
    port, seen = endpoint
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        for n in range(3):
            connection.request("POST", "/x", body=json.dumps({"n": n}), headers={"Authorization": "Bearer t"})
            response = connection.getresponse()
            assert response.status == 201
            assert response.getheader("Content-Type", "").startswith("application/json")
            assert json.loads(response.read()) == {"method": "POST", "body": {"n": n}, "auth": "Bearer t"}
    finally:
        connection.close()
    assert [r.headers["content-length"] for r in seen] == ["8", "8", "8"]


def test_a_handlers_failure_is_a_500_and_the_server_goes_on(endpoint: tuple[int, list[Request]]) -> None:
    port, _ = endpoint
    answer = raw(port, b"POST /boom HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500 ") and b"a bug" in answer
    assert raw(port, b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 201 ")


@pytest.mark.parametrize(("request_bytes", "status", "says"), [
    (b"POST /x HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413, b"at most 1024"),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411, b"Content-Length"),
    (b"POST /x HTTP/1.1\r\nContent-Length: many\r\n\r\n", 400, b"not a number"),
    (b"hello there\r\n\r\n", 400, b"not an HTTP/1.x request line"),
    (b"POST /x HTTP/1.1\r\nno colon here\r\n\r\n", 400, b"not a header line"),
    (b"POST /x HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", 431, b"headers exceed"),
], ids=["too-large", "chunked", "bad-length", "not-http", "bad-header", "huge-headers"])
def test_malformed_requests_are_refused_with_what_was_wrong(endpoint: tuple[int, list[Request]],
                                                            request_bytes: bytes, status: int, says: bytes) -> None:
    port, seen = endpoint
    answer = raw(port, request_bytes)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert says in answer
    assert seen == []


def test_a_client_that_goes_away_between_requests_costs_nothing(endpoint: tuple[int, list[Request]]) -> None:
    port, seen = endpoint
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass
    assert raw(port, b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 201 ")
    assert len(seen) == 1
