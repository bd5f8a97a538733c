"""Watches: each lists one kind (in one namespace, or all) and then follows its changes, handing every event to the
operator's event loop, as informers do.

A :class:`Watch` runs in a thread of its own over the operator's transport (:mod:`.rest`; one connection held
open per watch). It lists the kind (by pages; each object an event of type ``None``, as a restarted operator sees
it), then watches from the listing's ``resourceVersion`` with bookmarks, so a watch that the API server ends after
``timeoutSeconds`` goes on from where it was. When that version has expired (``410 Gone``: the watch cache moved
on while the operator was away) it lists again, and an object of the earlier listing that is missing now is
delivered as ``DELETED`` (its deletion happened while nothing watched). Any other failure (the API server
restarting, a network error) is retried with backoff, then listed again::

    watches = Watches(api, loop)
    watches.add(TRAINJOBS, None, on_trainjob)                     # every namespace
    watches.add(JOBSETS, "ml", on_jobset, label_selector="trainer.kubeflow.org/trainjob-name")
    watches.start()
    await watches.listed()                                        # every initial listing delivered
    ...
    watches.stop()

A handler is a plain function of the event (``{"type": "ADDED" | "MODIFIED" | "DELETED" | None, "object": {...}}``),
called on the loop, one event after the other in the order the API server sent them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.kubeapi import path_of
from trainjob.backends.kubernetes.resources import ResourceRef
from trainjob.backends.kubernetes.rest import RestError

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.kubeapi import KubeApi

log = logging.getLogger("trainjob.operator")

Event = dict[str, Any]
Handler = Callable[[Event], None]

#: How long the API server keeps one watch request open (it then ends it; the watch goes on from its version).
SERVER_TIMEOUT = 300
#: Objects per page of a listing.
PAGE = 500
#: Backoff after a failed list or watch: first and longest wait, in seconds.
BACKOFF = (0.5, 30.0)


@dataclass(frozen=True)
class _Stub:
    """What a watch remembers of an object it delivered: enough to deliver its deletion after a relisting."""

    namespace: str | None
    name: str
    owners: tuple[dict[str, Any], ...]

    def as_object(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace:
            meta["namespace"] = self.namespace
        if self.owners:
            meta["ownerReferences"] = list(self.owners)
        return {"metadata": meta}


class Gone(Exception):
    """The watch's resource version has expired: list again."""


class Watch:
    """One kind in one namespace (``None``: all), filtered by ``label_selector`` on the API server; its events go
    to ``deliver`` (called from the watch's thread; :class:`Watches` hands them to the loop)."""

    def __init__(self, api: KubeApi, ref: ResourceRef, namespace: str | None, deliver: Callable[[Event], None],
                 label_selector: str = "", on_listed: Callable[[], None] | None = None,
                 server_timeout: int = SERVER_TIMEOUT) -> None:
        self.api, self.ref, self.namespace = api, ref, namespace
        self.deliver = deliver
        self.label_selector = label_selector
        self.on_listed = on_listed
        self.server_timeout = server_timeout
        self._known: dict[tuple[str | None, str], _Stub] = {}
        self._stopped = threading.Event()
        self._response: Any = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return f"watch {self.ref.plural}" + (f" in {self.namespace}" if self.namespace else "")

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the watch: its open request is shut, its thread joined."""
        self.stopping()
        with self._lock:
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # the connection may be gone already
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    def stopping(self) -> None:
        """Ask the watch to end, without waiting (:meth:`stop` waits)."""
        self._stopped.set()

    def run(self) -> None:
        """List, then watch, until stopped; list again when the version expires or a request fails."""
        wait = BACKOFF[0]
        listed_once = False
        while not self._stopped.is_set():
            try:
                version = self._list()
                if not listed_once:
                    listed_once = True
                    if self.on_listed is not None:
                        self.on_listed()
                wait = BACKOFF[0]
                while not self._stopped.is_set():
                    version = self._watch(version)
            except Gone:
                log.info("%s: its resource version expired; listing again", self.name)
            except Exception as exc:  # noqa: BLE001  (any failure: retried; the operator must not stop watching)
                if self._stopped.is_set():
                    return
                log.warning("%s failed (%s); again in %.1f s", self.name, exc, wait)
                self._stopped.wait(wait)
                wait = min(wait * 2, BACKOFF[1])

    def _query(self, **more: Any) -> dict[str, Any]:
        query = {k: v for k, v in more.items() if v is not None}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        return query

    def _list(self) -> str:
        """Deliver every object (type ``None``) and the deletions missed since the last listing; the listing's
        resource version."""
        path = path_of(self.ref, self.namespace)
        seen: dict[tuple[str | None, str], _Stub] = {}
        cont: str | None = None
        version = ""
        while True:
            response = self.api.transport.request("GET", path, query=self._query(limit=PAGE, **{"continue": cont}),
                                                  timeout=60)
            listing = json.loads(response.data)
            for obj in listing.get("items") or []:
                # a listing's items carry no kind: the handlers (and the cache) see whole objects, as a watch gives
                obj.setdefault("apiVersion", self.ref.api_version)
                obj.setdefault("kind", self.ref.kind)
                seen[self._key(obj)] = self._stub(obj)
                self.deliver({"type": None, "object": obj})
            meta = listing.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            cont = meta.get("continue") or None
            if not cont:
                break
        for key, stub in self._known.items():
            if key not in seen:
                self.deliver({"type": "DELETED", "object": stub.as_object()})
        self._known = seen
        return version

    def _watch(self, version: str) -> str:
        """One watch request from ``version`` until the API server ends it; the last version it delivered."""
        try:
            response = self.api.transport.request(
                "GET", path_of(self.ref, self.namespace),
                query=self._query(watch="true", resourceVersion=version, allowWatchBookmarks="true",
                                  timeoutSeconds=self.server_timeout),
                preload=False, timeout=self.server_timeout + 60)
        except RestError as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise
        with self._lock:
            self._response = response
        if self._stopped.is_set():
            response.shutdown()
        try:
            pending = b""
            for chunk in response.stream(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        version = self._event(json.loads(line), version)
                if self._stopped.is_set():
                    break
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return version

    def _event(self, event: Event, version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise RuntimeError(f"the API server ended the watch: {obj.get('message') or obj}")
        if kind == "BOOKMARK":
            return str(meta.get("resourceVersion") or version)
        if kind == "DELETED":
            self._known.pop(self._key(obj), None)
        else:
            self._remember(obj)
        self.deliver(event)
        return str(meta.get("resourceVersion") or version)

    @staticmethod
    def _key(obj: dict[str, Any]) -> tuple[str | None, str]:
        meta = obj.get("metadata") or {}
        return meta.get("namespace"), str(meta.get("name"))

    @staticmethod
    def _stub(obj: dict[str, Any]) -> _Stub:
        meta = obj.get("metadata") or {}
        return _Stub(meta.get("namespace"), str(meta.get("name")), tuple(meta.get("ownerReferences") or ()))

    def _remember(self, obj: dict[str, Any]) -> None:
        key = self._key(obj)
        known = self._known.get(key)
        owners = tuple((obj.get("metadata") or {}).get("ownerReferences") or ())
        if known is None or known.owners != owners:
            self._known[key] = _Stub(key[0], key[1], owners)


class Watches:
    """The operator's watches; their events are handed to ``loop`` (each to its handler there, in order)."""

    def __init__(self, api: KubeApi, loop: asyncio.AbstractEventLoop) -> None:
        self.api, self.loop = api, loop
        self._watches: list[Watch] = []
        self._unlisted = 0
        self._all_listed = asyncio.Event()

    def add(self, ref: ResourceRef, namespace: str | None, handler: Handler, label_selector: str = "") -> None:
        loop = self.loop

        def deliver(event: Event) -> None:
            loop.call_soon_threadsafe(_handle, handler, event)

        self._unlisted += 1
        self._watches.append(Watch(self.api, ref, namespace, deliver, label_selector=label_selector,
                                   on_listed=lambda: loop.call_soon_threadsafe(self._listed_one)))

    def _listed_one(self) -> None:
        self._unlisted -= 1
        if self._unlisted <= 0:
            self._all_listed.set()

    def start(self) -> None:
        if not self._watches:
            self._all_listed.set()
        for watch in self._watches:
            watch.start()

    async def listed(self) -> None:
        """Until every watch has delivered its first listing."""
        await self._all_listed.wait()

    def stop(self) -> None:
        for watch in self._watches:  # all asked at once, then each waited for
            watch.stopping()
        deadline = time.monotonic() + 5.0
        for watch in self._watches:
            watch.stop(max(deadline - time.monotonic(), 0.1))

    def __len__(self) -> int:
        return len(self._watches)


def _handle(handler: Handler, event: Event) -> None:
    try:
        handler(event)
    except Exception:  # a handler's bug must not end the loop's other work
        log.exception("handling a %s event failed", event.get("type") or "listed")
