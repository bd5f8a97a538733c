"""The operator's watch cache: the last state of every TrainJob, JobSet and runtime its watches delivered, and the
pod counts of the JobSets' child Jobs.

The reconciler reads TrainJobs, JobSets and runtimes from here instead of asking the API server, as controllers
built on informers do (it still lists pods and reads their logs where it needs them: :mod:`.reconcile`). The
watches (:mod:`.watch`, through the handlers of :mod:`.operator`) feed it with :meth:`ObjectCache.observe`; the reconciler reads
through :class:`CachedReads`, which also stores what its own writes returned (:meth:`ObjectCache.store`), so the
next pass sees them even before their watch event arrives::

    cache = ObjectCache()                                      # TrainJobs, JobSets, runtimes, child Jobs (WATCHED)
    cache.observe(TRAINJOBS, event["object"])                 # ADDED / MODIFIED / the initial listing
    cache.observe(JOBSETS, event["object"], deleted=True)     # DELETED
    job = cache.get(TRAINJOBS, "ml", "mnist")                 # dict, or None when not seen (or deleted)
    gone = cache.last_deleted(JOBSETS, "ml", "mnist")         # the object as it was when it was deleted
    cache.pod_counts("ml", "mnist")                           # {"node": (active, ready)}: its child Jobs' pods

A child Job is kept trimmed (:func:`trim_job`): its name, its JobSet's and replicated job's labels and its pod
counts, some 300 bytes where the Job is several KiB; nothing else of it is read.

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
    JOBS,
    JOBSET_NAME_LABEL,
    JOBSETS,
    REPLICATED_JOB_LABEL,
    RUNTIME_KINDS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    ResourceRef,
)

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.kubeapi import KubeApi

Key = tuple[str, str, str]  # (plural.group, namespace or "", name)
#: The kinds the operator watches and reads from its cache.
WATCHED = (TRAINJOBS, JOBSETS, CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, JOBS)
#: What is kept of a child Job's status: how many of its pods are active (not finished), ready, done, and being
#: deleted (``terminating``: a disruption, :mod:`.disruptions`).
JOB_COUNTS = ("active", "ready", "succeeded", "failed", "terminating")
#: How many deleted objects are remembered (for a JobSet's snapshot, and to drop late events about them).
DELETED_KEPT = 10_000


def trim_job(job: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a JobSet's child Job: its identity, its JobSet's and replicated job's labels, and the
    pod counts of its status."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = job.get("status") or {}
    return {
        "metadata": {
            **{k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
            "labels": {k: labels[k] for k in (JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL) if k in labels},
        },
        "status": {k: status[k] for k in JOB_COUNTS if k in status},
    }


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
        #: Child Jobs by (namespace, JobSet name): the keys of those in ``_objects``.
        self._children: dict[tuple[str, str], set[Key]] = {}
        self._lock = threading.Lock()

    def serves(self, ref: ResourceRef) -> bool:
        """Whether a watch feeds this kind (reads of other kinds go to the API server)."""
        return f"{ref.plural}.{ref.group}" in self._kinds

    def observe(self, ref: ResourceRef, obj: dict[str, Any], deleted: bool = False) -> None:
        """What a watch delivered: the object as it now is, or as it was when deleted (kept without
        ``metadata.managedFields``, which nothing here reads and which is often the largest part of it)."""
        meta = obj.get("metadata") or {}
        if ref == JOBS:
            obj = trim_job(obj)
            meta = obj["metadata"]
        elif "managedFields" in meta:
            meta = {k: v for k, v in meta.items() if k != "managedFields"}
            obj = {**obj, "metadata": meta}
        key = _key(ref, meta.get("namespace"), str(meta.get("name")))
        with self._lock:
            if ref == JOBS:
                self._observe_child(key, obj, deleted)
                return
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

    def _observe_child(self, key: Key, job: dict[str, Any], deleted: bool) -> None:
        """A child Job (trimmed), indexed by its JobSet; a deleted one is forgotten (nothing reads it after)."""
        owner = (key[1], str(job["metadata"]["labels"].get(JOBSET_NAME_LABEL, "")))
        if deleted:
            self._objects.pop(key, None)
            siblings = self._children.get(owner)
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._children[owner]
            return
        if _newer(job, self._objects.get(key)):
            self._objects[key] = job
            self._children.setdefault(owner, set()).add(key)

    def pod_counts(self, namespace: str, jobset: str) -> dict[str, tuple[int, int]]:
        """Pods made and pods up per replicated job of JobSet ``namespace/jobset``, summed over the child Jobs the
        watch delivered (empty when it delivered none): made is active + succeeded + failed, up is ready +
        succeeded + failed (a pod that finished was up; a job whose pods run briefly has few active or ready pods
        at any time while all of them come up)."""
        counts: dict[str, tuple[int, int]] = {}
        with self._lock:
            for key in self._children.get((namespace, jobset), ()):
                job = self._objects[key]
                status = job["status"]
                name = str(job["metadata"]["labels"].get(REPLICATED_JOB_LABEL, ""))
                done = (status.get("succeeded") or 0) + (status.get("failed") or 0)
                made, up = counts.get(name, (0, 0))
                counts[name] = (made + (status.get("active") or 0) + done, up + (status.get("ready") or 0) + done)
        return counts

    def terminating(self, namespace: str, jobset: str) -> int:
        """How many pods of JobSet ``namespace/jobset``'s child Jobs are being deleted (their ``terminating``)."""
        with self._lock:
            return sum(int(self._objects[key]["status"].get("terminating") or 0)
                       for key in self._children.get((namespace, jobset), ()))

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
