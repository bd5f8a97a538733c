"""The operator's watch cache: the last state of every TrainJob, JobSet and runtime its watches delivered.

The reconciler reads TrainJobs, JobSets and runtimes from here instead of asking the API server, as controllers
built on informers do (it still lists pods and reads their logs where it needs them: :mod:`.reconcile`). The
watches (:mod:`.watch`, through the handlers of :mod:`.operator`) feed it with :meth:`ObjectCache.observe`; the reconciler reads
through :class:`CachedReads`, which also stores what its own writes returned (:meth:`ObjectCache.store`), so the
next pass sees them even before their watch event arrives::

    cache = ObjectCache()                                      # TrainJobs, JobSets and runtimes (WATCHED)
    cache.observe(TRAINJOBS, event["object"])                 # ADDED / MODIFIED / the initial listing
    cache.observe(JOBSETS, event["object"], deleted=True)     # DELETED
    job = cache.get(TRAINJOBS, "ml", "mnist")                 # dict, or None when not seen (or deleted)
    gone = cache.last_deleted(JOBSETS, "ml", "mnist")         # the object as it was when it was deleted

Events and stored writes may arrive out of order (a watch event older than the response of a write made since):
the newer ``resourceVersion`` wins. Resource versions are etcd revisions, the same counter for every object, so
they compare as integers; one that is not an integer is taken as newer.

A cache can be behind the API server (the watch has not delivered a change yet): callers treat a miss as "maybe"
where it matters: the reconciler creates a JobSet it did not see and takes ``409 AlreadyExists`` as "it exists",
then reads that one object.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOBSETS,
    RUNTIME_KINDS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    ResourceRef,
)

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.kubeapi import KubeApi

Key = tuple[str, str, str]  # (plural.group, namespace or "", name)
#: The kinds the operator watches and reads from its cache.
WATCHED = (TRAINJOBS, JOBSETS, CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES)
#: How many deleted objects are remembered (for a JobSet's snapshot, and to drop late events about them).
DELETED_KEPT = 10_000


def _key(ref: ResourceRef, namespace: str | None, name: str) -> Key:
    return (f"{ref.plural}.{ref.group}", (namespace or "") if ref.namespaced else "", name)


def _version(obj: dict[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _newer(candidate: dict[str, Any], current: dict[str, Any] | None) -> bool:
    if current is None:
        return True
    new, old = _version(candidate), _version(current)
    return new is None or old is None or new >= old


class ObjectCache:
    """Objects of the ``kinds`` the operator watches, by kind, namespace and name (thread-safe: the watches run
    on the event loop, reconciles in worker threads)."""

    def __init__(self, kinds: Iterable[ResourceRef] = WATCHED) -> None:
        self._kinds = {f"{ref.plural}.{ref.group}" for ref in kinds}
        self._objects: dict[Key, dict[str, Any]] = {}
        self._deleted: OrderedDict[Key, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def serves(self, ref: ResourceRef) -> bool:
        """Whether a watch feeds this kind (reads of other kinds go to the API server)."""
        return f"{ref.plural}.{ref.group}" in self._kinds

    def observe(self, ref: ResourceRef, obj: dict[str, Any], deleted: bool = False) -> None:
        """What a watch delivered: the object as it now is, or as it was when deleted (kept without
        ``metadata.managedFields``, which nothing here reads and which is often the largest part of it)."""
        meta = obj.get("metadata") or {}
        if "managedFields" in meta:
            meta = {k: v for k, v in meta.items() if k != "managedFields"}
            obj = {**obj, "metadata": meta}
        key = _key(ref, meta.get("namespace"), str(meta.get("name")))
        with self._lock:
            if deleted:
                self._objects.pop(key, None)
                self._deleted[key] = obj
                self._deleted.move_to_end(key)
                while len(self._deleted) > DELETED_KEPT:
                    self._deleted.popitem(last=False)
                return
            tombstone = self._deleted.get(key)
            if tombstone is not None:
                if meta.get("uid") == (tombstone.get("metadata") or {}).get("uid"):
                    return  # a late event about the object that was deleted
                del self._deleted[key]  # a new object of the same name
            if _newer(obj, self._objects.get(key)):
                self._objects[key] = obj

    def holds(self, ref: ResourceRef, obj: dict[str, Any]) -> bool:
        """Whether the cache has this very version of ``obj`` already (the answer to one of our own writes, whose
        watch event comes back to us)."""
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        with self._lock:
            cached = self._objects.get(_key(ref, meta.get("namespace"), str(meta.get("name"))))
        return version is not None and cached is not None and cached["metadata"].get("resourceVersion") == version

    def store(self, ref: ResourceRef, obj: dict[str, Any] | None) -> None:
        """What one of our writes returned (``None``: the object was gone), unless the cache has newer."""
        if obj is not None and obj.get("metadata"):
            self.observe(ref, obj)

    def get(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(_key(ref, namespace, name))

    def list(self, ref: ResourceRef, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every object of the kind (in ``namespace`` when given)."""
        plural = f"{ref.plural}.{ref.group}"
        with self._lock:
            return [obj for (kind, ns, _), obj in self._objects.items()
                    if kind == plural and (namespace is None or not ref.namespaced or ns == namespace)]

    def last_deleted(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object as its deletion event showed it (its last state), while no new one of that name exists."""
        with self._lock:
            return self._deleted.get(_key(ref, namespace, name))

    def count(self, ref: ResourceRef) -> int:
        plural = f"{ref.plural}.{ref.group}"
        with self._lock:
            return sum(1 for kind, _, _ in self._objects if kind == plural)


class CachedReads:
    """Reads through the watch cache: an object of a kind the cache serves comes from it, any other from the API
    server; what a write returned is stored in it, so the next pass sees the write before its watch event. Without
    a cache every read asks the API server."""

    def __init__(self, api: KubeApi, cache: ObjectCache | None = None) -> None:
        self.api = api
        self.cache = cache

    def read(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or ``None``. A runtime the cache has not seen (created a moment ago) is asked for; a
        TrainJob or JobSet it has not seen is taken as absent (the TrainJob's own watch event queues it again; a
        JobSet create that meets one answers 409)."""
        if self.cache is not None and self.cache.serves(ref):
            found = self.cache.get(ref, namespace, name)
            if found is not None or ref.kind not in RUNTIME_KINDS:
                return found
        return self.api.get(ref, namespace, name)

    def read_deleted(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object as it was when the cache saw it deleted (:meth:`ObjectCache.last_deleted`)."""
        return self.cache.last_deleted(ref, namespace, name) if self.cache is not None else None

    def stored(self, ref: ResourceRef, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """``obj``, what a write returned, kept in the cache."""
        if self.cache is not None:
            self.cache.store(ref, obj)
        return obj
