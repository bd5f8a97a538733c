"""The dashboard's web server: a Starlette app served by uvicorn on 127.0.0.1.

=========================================  ======================================================================
``GET /``                                  the job list (``static/index.html``), live through ``/api/jobs``
``GET /jobs/{name}``                       one job: status, curves, logs, events, spec, buttons
``GET /compare?jobs=a,b``                  the curves of several jobs overlaid
``GET /api/jobs?q=&status=&limit=``        newest jobs first, with counts per status
``GET /api/jobs/{name}``                   the job, its nodes and events, its TrainJob resource
``GET /api/jobs/{name}/metrics?after=``    metric records newer than an id (the page polls)
``GET /api/jobs/{name}/logs?node=&rank=``  Server-Sent Events: batches of log lines, following while it runs
``POST /api/jobs/{name}/suspend|resume``   act on the job (header ``X-Trainjob-Action: 1`` required)
``DELETE /api/jobs/{name}``                delete it (same header)
``GET /static/plotly.min.js``              Plotly's bundle, served from the installed ``plotly`` package
=========================================  ======================================================================

The actions need a header no cross-site form or image can send, and requests must name this host (so a page
from elsewhere cannot reach the dashboard through DNS rebinding): the dashboard can stop and delete jobs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import webbrowser
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trainjob.errors import AlreadyExistsError, NotFoundError, TrainJobError, ValidationError
from trainjob.ui.data import DEFAULT_LIST_LIMIT, Dashboard

STATIC = Path(__file__).with_name("static")
ACTION_HEADER = "x-trainjob-action"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]
#: Log lines are sent in batches: what one poll of the files found, at most this many per event.
LOG_BATCH_LINES = 500
#: While nothing is logged, a comment line this often lets the server notice a browser that went away.
LOG_KEEPALIVE_SECONDS = 5.0
HOUSEKEEPING_SECONDS = 5.0


def plotly_bundle() -> Path:
    """The path of ``plotly.min.js`` inside the installed ``plotly`` package (never fetched at run time)."""
    import plotly

    return Path(plotly.__file__).with_name("package_data") / "plotly.min.js"


def create_app(backend: Any, allowed_hosts: list[str] | None = None) -> Starlette:
    """The dashboard app for ``backend`` (a ``LocalBackend`` or ``KubernetesBackend``), answering requests
    addressed to ``allowed_hosts`` only (default: the loopback names)."""
    dashboard = Dashboard(backend)

    def page(file: str) -> Any:
        async def endpoint(request: Request) -> Response:
            return FileResponse(STATIC / file, headers={"Cache-Control": "no-cache"})

        return endpoint

    def list_jobs(request: Request) -> Response:
        params = request.query_params
        limit = int(params["limit"]) if params.get("limit", "").isdigit() else DEFAULT_LIST_LIMIT
        return JSONResponse(dashboard.jobs(params.get("q", ""), params.get("status", ""), limit))

    def get_job(request: Request) -> Response:
        return JSONResponse(dashboard.job(request.path_params["name"]))

    def metrics(request: Request) -> Response:
        try:
            after = float(request.query_params.get("after", "0"))
        except ValueError:
            raise ValidationError("after", f"must be a number, got {request.query_params['after']!r}") from None
        return JSONResponse(dashboard.metrics(request.path_params["name"], after))

    def act(action: str) -> Any:
        def endpoint(request: Request) -> Response:
            if request.headers.get(ACTION_HEADER) != "1":
                return JSONResponse({"error": f"actions need the header {ACTION_HEADER}: 1"}, status_code=403)
            getattr(dashboard, action)(request.path_params["name"])
            return JSONResponse({"name": request.path_params["name"], "done": action})

        return endpoint

    async def logs(request: Request) -> Response:
        params = request.query_params
        node = _optional_int(params.get("node"), "node")
        rank = _optional_int(params.get("rank"), "rank")
        follow = params.get("follow", "1") != "0"
        stopped = threading.Event()
        pump = _LogPump(asyncio.get_running_loop(), stopped, every_line=not dashboard.local)
        lines = await asyncio.to_thread(dashboard.follow_logs, request.path_params["name"], node, rank, follow,
                                        stopped, pump.flush)
        threading.Thread(target=pump.run, args=(lines,), name="trainjob-ui-logs", daemon=True).start()
        return StreamingResponse(pump.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    routes = [
        Route("/", page("index.html")),
        Route("/jobs/{name}", page("job.html")),
        Route("/compare", page("compare.html")),
        Route("/api/jobs", list_jobs),
        Route("/api/jobs/{name}", get_job),
        Route("/api/jobs/{name}", act("delete"), methods=["DELETE"]),
        Route("/api/jobs/{name}/metrics", metrics),
        Route("/api/jobs/{name}/logs", logs),
        Route("/api/jobs/{name}/suspend", act("suspend"), methods=["POST"]),
        Route("/api/jobs/{name}/resume", act("resume"), methods=["POST"]),
        Route("/static/plotly.min.js", lambda request: FileResponse(plotly_bundle(), headers={"Cache-Control": "max-age=86400"})),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    handlers = {
        NotFoundError: lambda request, exc: JSONResponse({"error": str(exc)}, status_code=404),
        ValidationError: lambda request, exc: JSONResponse({"error": str(exc)}, status_code=400),
        AlreadyExistsError: lambda request, exc: JSONResponse({"error": str(exc)}, status_code=409),
        TrainJobError: lambda request, exc: JSONResponse({"error": str(exc)}, status_code=500),
    }
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts or LOOPBACK_HOSTS)]
    return Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)  # type: ignore[arg-type]


def _optional_int(value: str | None, name: str) -> int | None:
    if value in (None, ""):
        return None
    if not value.isdigit():
        raise ValidationError(name, f"must be a whole number, got {value!r}")
    return int(value)


class _LogPump:
    """Log lines from a blocking iterator, read on a thread of its own, as Server-Sent Events.

    Lines go out in batches: one per poll of the log files (``flush`` is the reader's poll hook), or per
    :data:`LOG_BATCH_LINES`. When the browser goes away the response is cancelled and ``stopped`` tells the
    reader to end at its next poll.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, stopped: threading.Event, every_line: bool) -> None:
        self.loop, self.stopped, self.every_line = loop, stopped, every_line
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=64)
        self.batch: list[dict[str, Any]] = []
        self.done = object()

    def hand_over(self, item: Any) -> bool:
        """Queue ``item`` from the reader's thread, waiting while the queue is full; ``False`` once the response
        is gone (its loop closed, or the stream stopped while waiting)."""
        put = self.queue.put(item)
        try:
            future = asyncio.run_coroutine_threadsafe(put, self.loop)
        except RuntimeError:  # the event loop is closed
            put.close()
            return False
        while True:
            try:
                future.result(timeout=LOG_KEEPALIVE_SECONDS)
                return True
            except concurrent.futures.TimeoutError:
                if self.stopped.is_set():
                    future.cancel()
                    return False
            except Exception:
                return False

    def flush(self) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            if not self.hand_over(batch):
                self.stopped.set()

    def run(self, lines: Iterator[Any]) -> None:
        try:
            for line in lines:
                if self.stopped.is_set():
                    return
                self.batch.append({"node": line.node, "rank": line.rank, "text": line.text})
                if self.every_line or len(self.batch) >= LOG_BATCH_LINES:
                    self.flush()
            self.flush()
            if not self.stopped.is_set():
                self.hand_over(self.done)
        except Exception as exc:  # the page shows it instead of a stream that silently stops
            if self.hand_over(exc):
                self.hand_over(self.done)
        finally:
            close = getattr(lines, "close", None)  # the log files, now rather than when collected
            if close is not None:
                close()

    async def events(self) -> AsyncIterator[str]:
        try:
            while True:
                try:
                    item = await asyncio.wait_for(self.queue.get(), timeout=LOG_KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield ": keepalive\n\n"
                    continue
                if item is self.done:
                    yield "event: end\ndata: {}\n\n"
                    return
                if isinstance(item, Exception):
                    yield f"event: failure\ndata: {json.dumps(str(item))}\n\n"
                    continue
                yield f"data: {json.dumps(item)}\n\n"
        finally:
            self.stopped.set()


def serve(backend: Any, host: str = "127.0.0.1", port: int = 8470, open_browser: bool = False) -> None:
    """Serve the dashboard until interrupted; prints its address first (``--port 0`` picks a free port)."""
    app = create_app(backend, LOOPBACK_HOSTS if host in LOOPBACK_HOSTS else ["*"])
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2,
                            lifespan="off")
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{bound}/"
        print(f"trainjob dashboard on {url} ({dashboard_backend(backend)} backend); Ctrl-C stops it", flush=True)
        if open_browser:
            webbrowser.open(url)

    async def housekeeping() -> None:
        """Remove expired jobs and admit queued ones even while no page is open (local backend)."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(backend.housekeeping)

    async def main() -> None:
        tasks = [asyncio.create_task(announce())]
        tasks.append(asyncio.create_task(housekeeping()))
        try:
            await server.serve()
        finally:
            for task in tasks:
                task.cancel()

    asyncio.run(main())
    if server.should_exit:
        # Stopped by a signal: uvicorn raises it again once shut down, which ends asyncio.run with
        # KeyboardInterrupt (the command's "interrupted"); where that re-raise was swallowed, say so here.
        raise KeyboardInterrupt


def dashboard_backend(backend: Any) -> str:
    return Dashboard(backend).backend_name
