"""An in-memory stand-in for :class:`~trainjob.backends.kubernetes.kubeapi.KubeApi`, for testing the operator
without a cluster.

It plays the API server only: it stores objects, pods, their logs and events, answers the requests the reconciler
makes the way ``KubeApi`` answers them against a real API server (``None`` for a missing object,
``AlreadyExistsError`` on a second create, ``ApiError(404)`` for a kind it does not serve, ``NotFoundError`` for a
log that cannot be read), and records every request so a test can assert exactly what a reconcile asked for::

    api = MemoryApi(clock=lambda: NOW)
    api.seed(trainjob)                                   # what the cluster holds before the pass, not recorded
    Reconciler(api, signer, clock=lambda: NOW).reconcile("ml", "mnist")
    assert api.requests == [("get", "trainjobs", "ml/mnist"), ...]

What it does like the API server: ``metadata.uid``, ``resourceVersion`` (moved only by a write that changes the
object) and ``creationTimestamp`` (from ``clock``) on create; JSON merge patches (RFC 7386, what ``KubeApi.patch``
sends); the status subresource (``patch`` leaves ``status`` alone, ``patch_status`` changes only ``status``, a
create drops it); deletion that removes the objects and pods owned by the deleted one (the garbage collector's
cascade, done at once whatever the propagation policy). What it does not: admission, schemas, watches, field
selectors other than the involved object's name, and any controller (no JobSet controller runs: a test writes a
JobSet's status itself with :meth:`MemoryApi.set_status`).
"""

from __future__ import annotations

import copy
import datetime
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.resources import (
    CRDS,
    JOBSET_NAME_LABEL,
    PODS,
    PYTORCHJOBS,
    RENDERED_RESOURCES,
    RUNTIME_KINDS,
    SECRETS,
    SERVICES,
    TRAINJOBS,
    ResourceRef,
)
from trainjob.errors import AlreadyExistsError, NotFoundError

#: Every resource this double stores, by (apiVersion, kind).
_KNOWN = {**RENDERED_RESOURCES, **{(r.api_version, r.kind): r
                                  for r in (TRAINJOBS, PYTORCHJOBS, SERVICES, CRDS, *RUNTIME_KINDS.values())}}
#: One request: (verb, resource, "namespace/name" | "name" | "namespace"), e.g. ``("create", "jobsets", "ml/mnist")``.
Request = tuple[str, str, str]


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7386): objects merge, ``None`` deletes a key,
    anything else (lists included) replaces. ``target`` is not changed."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


#: The pod fields the API server lets a field selector name, as this stand-in reads them.
_POD_FIELDS = {"status.phase": lambda pod: (pod.get("status") or {}).get("phase") or "",
               "spec.nodeName": lambda pod: (pod.get("spec") or {}).get("nodeName") or ""}


def printed_status(pod: dict[str, Any]) -> str:
    """A pod's ``STATUS`` as ``kubectl get pods`` shows it (the API server's printer): the phase, else the first
    unfinished init container's ``Init:<reason>`` or ``Init:<i>/<n>``, else the last container's waiting or
    terminated reason; ``Terminating`` once deleted."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    inits = status.get("initContainerStatuses") or []
    initializing = False
    for i, container in enumerate(inits):
        state = container.get("state") or {}
        done, waiting = state.get("terminated") or {}, state.get("waiting") or {}
        if done and done.get("exitCode") == 0:
            continue
        if done:
            reason = "Init:" + (done.get("reason") or f"ExitCode:{done.get('exitCode')}")
        elif waiting.get("reason") and waiting["reason"] != "PodInitializing":
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(pod['spec'].get('initContainers') or inits)}"
        initializing = True
        break
    if not initializing:
        for container in reversed(status.get("containerStatuses") or []):
            state = container.get("state") or {}
            said = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get("reason")
            if said:
                reason = said
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def fields_match(pod: dict[str, Any], selector: str | None) -> bool:
    """Whether ``pod`` passes a field selector of ``field=value`` and ``field!=value`` terms (an empty value: unset),
    as the API server reads it; a field it does not know is refused, as the API server refuses it."""
    for term in filter(None, (selector or "").split(",")):
        negated = "!=" in term
        field, value = term.split("!=" if negated else "=", 1)
        if field not in _POD_FIELDS:
            raise ValueError(f"field label not supported: {field}")
        if (_POD_FIELDS[field](pod) == value) == negated:
            return False
    return True


def matches(labels: dict[str, str] | None, selector: str | None) -> bool:
    """Whether ``labels`` satisfy an equality label selector (``a=b,c=d``; the only kind the operator sends)."""
    if not selector:
        return True
    wanted = dict(term.split("=", 1) for term in selector.split(","))
    return all((labels or {}).get(key) == value for key, value in wanted.items())


class MemoryApi(KubeApi):
    """The API server as dicts in memory, with the request log a test asserts on (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], served: Iterable[ResourceRef] | None = None) -> None:
        """``clock`` dates what is created; ``served`` limits the custom resources the "cluster" serves (every
        one when ``None``): creating any other fails with 404 as it does when a CRD is not installed."""
        # No kubernetes client: nothing here may reach a cluster.
        self.clock = clock
        self.served = None if served is None else set(served)
        self.requests: list[Request] = []
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}  # (group, plural, namespace, name)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str, str], str] = {}  # (namespace, pod, container) -> lines with timestamps
        self.events: list[dict[str, Any]] = []
        #: Objects as they were when deleted (what a watch's DELETED event carries), by key.
        self.deleted: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._ids = itertools.count(1)

    # -- for tests: the cluster's state, set and read without recording a request -------------------------------

    def seed(self, obj: dict[str, Any], ref: ResourceRef | None = None) -> dict[str, Any]:
        """Store ``obj`` as the API server would after creating it (status kept: it stands for what exists)."""
        ref = ref or self._ref(obj)
        stored = self._with_server_fields(copy.deepcopy(obj))
        self.objects[self._key(ref, stored["metadata"].get("namespace"), stored["metadata"]["name"])] = stored
        return copy.deepcopy(stored)

    def set_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Replace a pod's status, as the kubelet would."""
        self.pods[(namespace, name)]["status"] = copy.deepcopy(status)

    def set_status(self, ref: ResourceRef, namespace: str | None, name: str, status: dict[str, Any]) -> None:
        """Replace an object's status, as its controller (the JobSet controller, the kubelet) would."""
        stored = self.objects[self._key(ref, namespace, name)]
        stored["status"] = copy.deepcopy(status)
        self._bump(stored)

    def stored(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A copy of the object as stored, or ``None``."""
        found = self.objects.get(self._key(ref, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def add_pod(self, pod: dict[str, Any], logs: dict[str, str] | None = None) -> None:
        """Store a pod (namespace and name from its metadata) and its containers' logs, one line per log line,
        each starting with its RFC 3339 time as the kubelet keeps them (``2026-11-23T09:00:05Z step 1/10``)."""
        pod = self._with_server_fields(copy.deepcopy(pod))
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.pods[(namespace, name)] = pod
        for container, text in (logs or {}).items():
            self.logs[(namespace, name, container)] = text

    # -- the KubeApi surface ------------------------------------------------------------------------------------

    def close(self) -> None:
        pass  # no connections to close

    def get(self, ref: ResourceRef, namespace: str | None, name: str,
            timeout: float | None = None) -> dict[str, Any] | None:
        self._record("get", ref.plural, _where(ref, namespace, name))
        return self.stored(ref, namespace, name)

    def list(
        self, ref: ResourceRef, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        self._record("list", ref.plural, namespace or "")
        return [
            copy.deepcopy(obj)
            for (group, plural, ns, _), obj in sorted(self.objects.items())
            if (group, plural) == (ref.group, ref.plural)
            and (not (ref.namespaced and namespace) or ns == namespace)
            and matches(obj["metadata"].get("labels"), label_selector)
        ]

    def create(self, obj: dict[str, Any], ref: ResourceRef | None = None,
               timeout: float | None = None) -> dict[str, Any]:
        ref = ref or self._ref(obj)
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"].get("name")
        self._record("create", ref.plural, _where(ref, namespace, name))
        if self.served is not None and ref.group and ref not in self.served:
            raise ApiError(f"cannot create {ref.kind} {name}: the API server answered 404 Not Found", 404)
        if ref == PODS:  # pods live apart, as the kubelet's side of the world
            if (namespace, name) in self.pods:
                raise AlreadyExistsError(f"Pod {namespace}/{name} exists already")
            pod = self._with_server_fields(copy.deepcopy(obj))
            pod["status"] = {"phase": "Pending"}
            self.pods[(namespace, name)] = pod
            return copy.deepcopy(pod)
        key = self._key(ref, namespace, name)
        if key in self.objects:
            raise AlreadyExistsError(f"{ref.kind} {namespace}/{name} exists already")
        stored = copy.deepcopy(obj)
        stored.pop("status", None)  # a create never sets the status subresource
        self.objects[key] = self._with_server_fields(stored)
        return copy.deepcopy(self.objects[key])

    def replace(self, obj: dict[str, Any], ref: ResourceRef, timeout: float | None = None) -> dict[str, Any] | None:
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"]["name"]
        self._record("replace", ref.plural, _where(ref, namespace, name))
        key = self._key(ref, namespace, name)
        stored = self.objects.get(key)
        if stored is None:
            return None
        version = obj["metadata"].get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise ApiError(f"cannot replace {ref.kind} {name}: the API server answered 409 Conflict", 409)
        new = copy.deepcopy(obj)
        new["metadata"] = {**stored["metadata"], **{k: v for k, v in new["metadata"].items()
                                                     if k not in ("uid", "creationTimestamp")}}
        new["status"] = stored.get("status")
        self._bump(new)
        self.objects[key] = new
        return copy.deepcopy(new)

    def patch(
        self, ref: ResourceRef, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        self._record("patch", ref.plural, _where(ref, namespace, name))
        return self._merge(ref, namespace, name, {k: v for k, v in patch.items() if k != "status"})

    def patch_status(
        self, ref: ResourceRef, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        self._record("patch", f"{ref.plural}/status", _where(ref, namespace, name))
        return self._merge(ref, namespace, name, {"status": status})

    def delete(
        self, ref: ResourceRef, namespace: str | None, name: str, propagation: str = "Foreground",
        grace_period_seconds: int | None = None,
    ) -> bool:
        self._record("delete", ref.plural, _where(ref, namespace, name))
        if ref == PODS:
            return self.pods.pop((namespace or "", name), None) is not None
        key = self._key(ref, namespace, name)
        gone = self.objects.pop(key, None)
        if gone is None:
            return False
        self.deleted[key] = gone
        self._collect_garbage(gone["metadata"]["uid"])
        return True

    def evict(self, namespace: str, name: str) -> bool:
        """The pod marked ``DisruptionTarget`` and gone (no kubelet here to give it a grace period)."""
        self._record("create", "pods/eviction", f"{namespace}/{name}")
        return self.pods.pop((namespace, name), None) is not None

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> bool:
        self._record("patch", "pods", f"{namespace}/{name}")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return False
        pod["metadata"].setdefault("annotations", {}).update(annotations)
        return True

    def add_pod_condition(self, namespace: str, name: str, condition: dict[str, Any]) -> bool:
        """The condition set by type, the others kept (as the strategic merge patch of ``pods/status`` does)."""
        self._record("patch", "pods/status", f"{namespace}/{name}")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return False
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != condition["type"]] + [copy.deepcopy(condition)]
        return True

    def add_ephemeral_container(self, namespace: str, name: str, container: dict[str, Any]) -> bool:
        """Added to the pod's ``spec.ephemeralContainers`` (by name, as the strategic merge patch does); no kubelet
        here runs it."""
        self._record("patch", "pods/ephemeralcontainers", f"{namespace}/{name}")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return False
        ephemeral = pod.setdefault("spec", {}).setdefault("ephemeralContainers", [])
        ephemeral[:] = [c for c in ephemeral if c.get("name") != container.get("name")] + [copy.deepcopy(container)]
        return True

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._record("get", "pods", f"{namespace}/{name}")
        pod = self.pods.get((namespace, name))
        return copy.deepcopy(pod) if pod is not None else None

    def list_pods(self, namespace: str, label_selector: str, field_selector: str | None = None) -> list[dict[str, Any]]:
        self._record("list", "pods", namespace)
        return [
            copy.deepcopy(pod)
            for (ns, _), pod in sorted(self.pods.items())
            if ns == namespace and matches(pod["metadata"].get("labels"), label_selector)
            and fields_match(pod, field_selector)
        ]

    def table_in_pages(self, ref: ResourceRef, namespace: str | None, label_selector: str,
                       field_selector: str | None = None, page: int = 1000) -> Iterator[list[dict[str, Any]]]:
        """Pods as the API server prints them (``Name``, ``Status``, ``Node``: :func:`printed_status`)."""
        if ref != PODS:
            raise ApiError(f"list {ref.plural}: this API server in memory prints pods alone", 406)
        pods = [pod for (ns, _), pod in sorted(self.pods.items())
                if ns == namespace and matches(pod["metadata"].get("labels"), label_selector)
                and fields_match(pod, field_selector)]
        for start in range(0, max(len(pods), 1), page):
            self._record("list", "pods", namespace)
            yield [{"Name": pod["metadata"]["name"], "Status": printed_status(pod),
                    "Node": pod["spec"].get("nodeName") or "<none>"} for pod in pods[start:start + page]]

    def read_log(self, namespace: str, pod: dict[str, Any], container: str, tail_lines: int = 200) -> str:
        name = pod["metadata"]["name"]
        self._record("get", "pods/log", f"{namespace}/{name}")
        text = self._log(namespace, name, container, timestamps=False, tail_lines=tail_lines)
        if text is None:
            raise ApiError(f"cannot read the log of pod {name}: the API server answered 404 Not Found", 404)
        return text

    def read_pod_log(self, namespace: str, pod_name: str, **options: Any) -> str:
        self._record("get", "pods/log", f"{namespace}/{pod_name}")
        containers = [c["name"] for c in ((self.pods.get((namespace, pod_name)) or {}).get("spec") or {}).get(
            "containers") or []]
        container = options.get("container") or (containers[0] if len(containers) == 1 else "")
        text = self._log(namespace, pod_name, container, bool(options.get("timestamps")), options.get("tail_lines"))
        if text is None:
            raise NotFoundError(f"cannot read the log of pod {pod_name}: the API server answered 404 Not Found")
        return text

    def follow_pod_log(self, namespace: str, pod_name: str, **options: Any) -> Iterator[bytes]:
        yield self.read_pod_log(namespace, pod_name, **options).encode()  # the log as it is: its container ended

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(SECRETS, namespace, name)

    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        self._record("create", "tokenreviews", "")
        raise ApiError("cannot review a token: this API server in memory authenticates no one", 404)

    def list_events(
        self, namespace: str, involved_name: str, include_children: bool = False
    ) -> list[dict[str, Any]]:
        self._record("list", "events", namespace)

        def wanted(name: str) -> bool:
            return name == involved_name or (include_children and name.startswith(f"{involved_name}-"))

        found = [e for e in self.events if e["metadata"]["namespace"] == namespace
                 and wanted(e["involvedObject"]["name"])]
        return copy.deepcopy(sorted(found, key=lambda e: e["lastTimestamp"]))

    def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str,
                   name: str | None = None) -> None:
        meta = involved["metadata"]
        self._record("create", "events", f"{meta['namespace']}/{meta['name']}")
        if name is not None and any(e["metadata"]["name"] == name for e in self.events):
            return  # 409: an Event of that name exists (KubeApi takes that as posted)
        # What the tests read of an Event; the body KubeApi sends is its own business.
        self.events.append({
            "metadata": {"name": name or f"{meta['name']}.{next(self._ids)}", "namespace": meta["namespace"]},
            "involvedObject": {"kind": involved["kind"], "name": meta["name"], "uid": meta.get("uid")},
            "type": event_type, "reason": reason, "message": message[:1024],
            "lastTimestamp": _timestamp(self.clock()),
        })

    # -- internals ----------------------------------------------------------------------------------------------

    def _record(self, verb: str, resource: str, where: str) -> None:
        self.requests.append((verb, resource, where))

    @staticmethod
    def _ref(obj: dict[str, Any]) -> ResourceRef:
        return _KNOWN[(obj["apiVersion"], obj["kind"])]

    @staticmethod
    def _key(ref: ResourceRef, namespace: str | None, name: str) -> tuple[str, str, str, str]:
        return (ref.group, ref.plural, (namespace or "") if ref.namespaced else "", name)

    def _with_server_fields(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._ids)}")
        meta.setdefault("creationTimestamp", _timestamp(self.clock()))
        meta.setdefault("generation", 1)
        meta.setdefault("resourceVersion", str(next(self._ids)))
        return obj

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._ids))

    def _merge(
        self, ref: ResourceRef, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        key = self._key(ref, namespace, name)
        current = self.objects.get(key)
        if current is None:
            return None
        patched = merge_patch(current, patch)
        if patched != current:
            if patched.get("spec") != current.get("spec"):
                patched["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
            self._bump(patched)
            self.objects[key] = patched
        return copy.deepcopy(self.objects[key])

    def _collect_garbage(self, owner_uid: str) -> None:
        def owned(obj: dict[str, Any]) -> bool:
            return any(r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences") or [])

        for key in [k for k, obj in self.objects.items() if owned(obj)]:
            child = self.deleted[key] = self.objects.pop(key)
            self._collect_garbage(child["metadata"]["uid"])
        for pod_key in [k for k, pod in self.pods.items() if owned(pod)]:
            del self.pods[pod_key]

    def _log(
        self, namespace: str, pod: str, container: str, timestamps: bool, tail_lines: int | None
    ) -> str | None:
        text = self.logs.get((namespace, pod, container))
        if text is None:
            return None
        lines = text.splitlines()
        if tail_lines is not None:
            lines = lines[-tail_lines:] if tail_lines > 0 else []
        if not timestamps:
            lines = [line.split(" ", 1)[1] if " " in line else "" for line in lines]
        return "".join(f"{line}\n" for line in lines)


def _where(ref: ResourceRef, namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if ref.namespaced else name


def _timestamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SyncedWatchCache(ObjectCache):
    """The operator's watch cache as if every watch event had already arrived: it reads the :class:`MemoryApi`'s
    store without recording a request, and remembers the objects deleted through it::

        api = MemoryApi(clock)
        Reconciler(api, signer, cache=SyncedWatchCache(api)).reconcile("ml", "mnist")   # no GETs recorded
    """

    def __init__(self, api: MemoryApi) -> None:
        super().__init__()
        self.api = api

    def get(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.api.stored(ref, namespace, name) if self.serves(ref) else None

    def store(self, ref: ResourceRef, obj: dict[str, Any] | None) -> None:
        """Nothing to do: the store is the truth."""

    def terminating(self, namespace: str, jobset: str) -> int:
        """The pods of the JobSet being deleted (what its child Jobs' ``terminating`` would count)."""
        return sum(1 for (ns, _), pod in self.api.pods.items() if ns == namespace
                   and (pod["metadata"].get("labels") or {}).get(JOBSET_NAME_LABEL) == jobset
                   and pod["metadata"].get("deletionTimestamp"))

    def last_deleted(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        if self.api.stored(ref, namespace, name) is not None:
            return None
        return copy.deepcopy(self.api.deleted.get(self.api._key(ref, namespace, name)))

