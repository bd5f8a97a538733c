"""Serve an :class:`ApiStandIn` on ``127.0.0.1``: in a background thread (tests) or as a process (benchmarks).

Synchronous clients (the ``kubernetes`` client, the CLI) talk to it through its URL::

    with StandInServer() as server:
        api = KubeApi(load_api_client(KubernetesBackendConfig(config_file=kubeconfig_for(server.url))))

    python -m trainjob.backends.kubernetes.testing.server      # prints the URL, serves until interrupted
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import kmock

from trainjob.backends.kubernetes.testing.standin import ApiStandIn, Validator


class StandInServer:
    """Runs an :class:`ApiStandIn` on ``127.0.0.1`` in a background thread; ``url`` is its address.

    Use it as a context manager; ``validators`` are passed to the stand-in. The stand-in's own objects are
    reachable as :attr:`api` for assertions, but tests should prefer the HTTP API like any client.
    """

    def __init__(self, validators: dict[str, Validator] | None = None, port: int | None = None) -> None:
        self._validators = validators or {}
        self._port = port
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self.api: ApiStandIn | None = None
        self.url = ""

    def __enter__(self) -> StandInServer:
        self._thread = threading.Thread(target=self._run, name="kube-api-standin", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._failure is not None or not self.url:
            raise RuntimeError(f"the Kubernetes API stand-in did not start: {self._failure!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def remove_resource(self, key: str) -> None:
        """Stop serving ``group/version/plural``, as if its CRD were not installed."""

        def remove(api: ApiStandIn) -> None:
            api.served.discard(key)
            del api.resources[key]

        self.call(remove)

    def call(self, fn: Callable[[ApiStandIn], Any]) -> Any:
        """Run ``fn(api)`` on the server's event loop (safe against concurrent requests) and return its result."""
        assert self._loop is not None and self.api is not None
        api = self.api

        async def in_loop() -> Any:
            async with api._lock:
                return fn(api)

        return asyncio.run_coroutine_threadsafe(in_loop(), self._loop).result(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by __enter__
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with (
            ApiStandIn(validators=self._validators) as api,
            kmock.Server(api, port=self._port) as server,
        ):
            self.api = api
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()


def main(argv: list[str] | None = None) -> None:
    """``python -m trainjob.backends.kubernetes.testing.standin [--port N]``: serve until interrupted.

    Prints the URL on the first line of stdout (for benchmarks and manual tries with ``kubectl --server``).
    """
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with StandInServer(port=args.port) as server:
        print(server.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()


if __name__ == "__main__":
    main()
