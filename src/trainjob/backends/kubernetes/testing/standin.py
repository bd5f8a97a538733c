"""A Kubernetes API server stand-in on loopback, for tests and benchmarks: kmock's emulator, made more realistic.

kmock (by kopf's author) serves the Kubernetes REST conventions (discovery, list, watch, get, create, merge-patch,
delete) from memory. :class:`ApiStandIn` adds what the operator and the client rely on from a real API server:

- ``metadata.uid``, ``creationTimestamp``, ``resourceVersion`` and ``generation`` on create, ``201 Created``;
- label and field selectors on list and watch (``labelSelector=a=b,c``, ``fieldSelector=involvedObject.name=x``);
- admission: validators per resource reject bad objects with ``422 Invalid`` like schema validation does;
- garbage collection: deleting an owner deletes the objects whose ``ownerReferences`` name its uid;
- pod logs (``pods/<name>/log``, with ``follow=true``) from :attr:`ApiStandIn.pod_logs`.

It is not a Kubernetes: no controllers run (no JobSet controller, no kubelet); tests play those parts by patching
status. :mod:`.server` runs it on a port, in a thread or as a process.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import dicts, enums, rendering  # the emulator's own request/patch types
from kmock._internal.k8s import KubernetesObjectConflictError

#: Resources the stand-in serves: (group/version/plural, kind, namespaced, subresources).
RESOURCES: tuple[tuple[str, str, bool, tuple[str, ...]], ...] = (
    ("v1/namespaces", "Namespace", False, ()),
    ("v1/pods", "Pod", True, ("status", "log")),
    ("v1/serviceaccounts", "ServiceAccount", True, ()),
    ("apps/v1/deployments", "Deployment", True, ("status",)),
    ("rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", False, ()),
    ("rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", False, ()),
    ("v1/events", "Event", True, ()),
    ("v1/services", "Service", True, ()),
    ("v1/configmaps", "ConfigMap", True, ()),
    ("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition", False, ()),
    ("trainer.kubeflow.org/v1alpha1/trainjobs", "TrainJob", True, ("status",)),
    ("trainer.kubeflow.org/v1alpha1/trainingruntimes", "TrainingRuntime", True, ()),
    ("trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", "ClusterTrainingRuntime", False, ()),
    ("jobset.x-k8s.io/v1alpha2/jobsets", "JobSet", True, ("status",)),
    ("scheduling.x-k8s.io/v1alpha1/podgroups", "PodGroup", True, ("status",)),
    ("scheduling.volcano.sh/v1beta1/podgroups", "PodGroup", True, ("status",)),
)

#: A validator gets the object as it would be stored and returns the problems found (empty when valid).
Validator = Callable[[dict[str, Any]], list[str]]

_TERMINAL_POD_PHASES = ("Succeeded", "Failed")
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")


@attrs.define(kw_only=True)
class ApiStandIn(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator plus uids, versions, selectors, admission, cascading deletion and pod logs."""

    #: ``"jobset.x-k8s.io/v1alpha2/jobsets" -> validator``; applied to creates and to the result of patches.
    validators: dict[str, Validator] = attrs.field(factory=dict)
    #: ``(namespace, pod name) -> log text``; tests append to it to play the container runtime.
    pod_logs: dict[tuple[str, str], str] = attrs.field(factory=dict)
    #: Resources that accept objects (``group/version/plural``); drop one to play a cluster without that CRD.
    served: set[str] = attrs.field(factory=lambda: {key for key, *_ in RESOURCES})
    #: Every write admission refused: (user agent, "Kind name", problems).
    rejections: list[tuple[str, str, list[str]]] = attrs.field(factory=list)
    #: Namespace objects by name.
    namespaces: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    _versions: Iterable[int] = attrs.field(factory=lambda: itertools.count(1), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, kind, namespaced, subresources in RESOURCES:
            self.resources[key] = kmock.ResourceInfo(
                kind=kind,
                namespaced=namespaced,
                verbs={"get", "list", "watch", "create", "patch", "delete"},
                subresources=set(subresources),
            )

    # -- request interception ---------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock reads ``/api/v1/namespaces/<name>`` as a namespace prefix, so Namespace objects are served here.
        match = _NAMESPACE_PATH.match(raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        return await self._serve_namespace(raw_request, match.group(1))

    async def _serve_namespace(
        self, raw: aiohttp.web.BaseRequest, name: str | None
    ) -> aiohttp.web.StreamResponse:
        body = await raw.json() if raw.can_read_body else None
        if raw.method == "GET" and name is None:
            return aiohttp.web.json_response(
                {"kind": "NamespaceList", "apiVersion": "v1", "items": list(self.namespaces.values())}
            )
        if raw.method == "POST" and name is None and isinstance(body, dict):
            name = body.get("metadata", {}).get("name", "")
            if name in self.namespaces:
                return await self._render_error(KubernetesObjectConflictError())
            body["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            self.namespaces[name] = body
            return aiohttp.web.json_response(body, status=201)
        if name not in self.namespaces:
            return await self._render_error(kmock.KubernetesObjectNotFoundError())
        if raw.method == "PATCH" and isinstance(body, dict):
            self.namespaces[name] = dict(dicts.patch_dict(self.namespaces[name], body))
        elif raw.method == "DELETE":
            return aiohttp.web.json_response(self.namespaces.pop(name))
        return aiohttp.web.json_response(self.namespaces[name])

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """Object requests are served here by key; the rest (discovery) goes through kmock's reactions."""
        if request.subresource == "log" and request.action == enums.action.FETCH:
            return await self._serve_log(request)
        is_object_request = request.resource is not None and bool(request.resource.plural)
        if not is_object_request or request.action is None or request.subresource not in (None, "status"):
            return await super()._handle(request)  # discovery: /api, /apis/<group>/<version> ...
        assert request.resource is not None
        if _resource_key(request.resource) not in self.served:
            raise kmock.KubernetesResourceNotFoundError()
        if request.action == enums.action.WATCH:
            return await self._stream_watch(request)
        if request.action == enums.action.LIST:
            return aiohttp.web.json_response(await self._serve_list(request))
        status, obj = await self._write(request) if request.action != enums.action.FETCH else (200, None)
        if request.action == enums.action.FETCH:
            obj = self._live_object(request)
            if obj is None:
                raise kmock.KubernetesObjectNotFoundError()
        if request.action == enums.action.DELETE:
            await self._collect_garbage()
        return aiohttp.web.json_response(obj, status=status)

    async def _write(self, request: rendering.Request) -> tuple[int, dict[str, Any]]:
        """Create, merge-patch or delete one object (with admission), publishing the watch event."""
        assert request.resource is not None
        if not isinstance(request.data, dict) and request.action != enums.action.DELETE:
            raise kmock.KubernetesError(
                status=415, reason="UnsupportedMediaType", message="only merge patches"
            )
        async with self._lock:
            if request.action == enums.action.CREATE:
                obj = self._complete_new_object(request)
                self._admit(request, obj)
                key = (request.resource, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                if key in self._objects and not self._objects[key].deleted:
                    raise KubernetesObjectConflictError()
                if key in self._objects:
                    self._objects[key].create(obj)
                else:
                    self._objects[key] = obj
                return 201, await self._publish(key, "ADDED")
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            stored = self._objects[key]
            if request.action == enums.action.UPDATE:
                self._admit(request, self._patched(request))
                stored.patch(request.data)
                meta = stored.raw.get("metadata", {})
                if not (meta.get("deletionTimestamp") and not meta.get("finalizers")):
                    return 200, await self._publish(key, "MODIFIED")
            elif stored.raw.get("metadata", {}).get("finalizers"):  # DELETE waits for the finalizers
                if not stored.raw["metadata"].get("deletionTimestamp"):
                    stored.patch({"metadata": {"deletionTimestamp": _now()}})
                return 200, await self._publish(key, "MODIFIED")
            raw = stored.raw
            stored.delete()
            await self._buses[request.resource].put({"type": "DELETED", "object": raw})
            return 200, raw

    async def _publish(self, key: Any, event_type: str) -> dict[str, Any]:
        raw = self._objects[key].raw
        await self._buses[key[0]].put({"type": event_type, "object": raw})
        return raw

    async def _stream_watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        assert request._raw_request is not None
        await response.prepare(request._raw_request)  # type: ignore[arg-type]
        async for event in self._serve_watch(request):
            if isinstance(event, dict):
                await response.write(json.dumps(event).encode() + b"\n")
        return response

    def _complete_new_object(self, request: rendering.Request) -> dict[str, Any]:
        obj: dict[str, Any] = request.data
        meta = obj.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = str(next(self._versions))  # type: ignore[call-overload]
        meta["generation"] = 1
        return obj

    def _patched(self, request: rendering.Request) -> dict[str, Any]:
        """Stamp a new resourceVersion (and generation for spec changes) into the patch; return the result."""
        meta = request.data.setdefault("metadata", {}) or {}
        request.data["metadata"] = meta
        meta["resourceVersion"] = str(next(self._versions))  # type: ignore[call-overload]
        key = (request.resource, request.namespace, request.name)
        current = self._objects[key].raw if key in self._objects and not self._objects[key].deleted else {}
        if "spec" in request.data:
            meta["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1
        return dict(dicts.patch_dict(current, request.data))

    def _admit(self, request: rendering.Request, obj: dict[str, Any]) -> None:
        assert request.resource is not None
        validator = self.validators.get(_resource_key(request.resource))
        problems = validator(obj) if validator else []
        if problems:
            name = obj.get("metadata", {}).get("name")
            self.rejections.append(
                (request.headers.get("User-Agent", ""), f"{obj.get('kind')} {name}", problems)
            )
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f"{obj.get('kind')}.{request.resource.group} {name!r} is invalid: "
                + "; ".join(problems),
                details={"name": name, "causes": [{"message": p} for p in problems]},
            )

    async def _collect_garbage(self) -> None:
        """Delete every object whose owners are all gone, repeatedly (owners of owners), like the API's GC."""
        while True:
            async with self._lock:
                live_uids = {
                    obj.raw.get("metadata", {}).get("uid")
                    for obj in self._objects.values()
                    if not obj.deleted
                }
                orphans = [
                    (key, obj)
                    for key, obj in self._objects.items()
                    if not obj.deleted
                    and (owners := obj.raw.get("metadata", {}).get("ownerReferences"))
                    and not any(ref.get("uid") in live_uids for ref in owners)
                ]
                for (resource, _, _), obj in orphans:
                    raw = obj.raw
                    obj.delete()
                    await self._buses[resource].put({"type": "DELETED", "object": raw})
            if not orphans:
                return

    # -- serving ------------------------------------------------------------------------------------------------

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        listing = await super()._serve_list(request)
        assert isinstance(listing, dict)
        listing["items"] = [obj for obj in listing["items"] if _selected(obj, request.params)]
        listing["metadata"]["resourceVersion"] = str(next(self._versions))  # type: ignore[call-overload]
        return listing

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or _selected(event.get("object", {}), request.params):
                yield event

    async def _serve_log(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """``GET pods/<name>/log``: the text so far, or with ``follow=true`` a stream until the pod finishes."""
        key = (request.namespace or "", request.name or "")
        if self._live_object(request) is None:
            return await self._render_error(kmock.KubernetesObjectNotFoundError())
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if request.params.get("follow") != "true":
            return aiohttp.web.Response(body=self.pod_logs.get(key, "").encode(), headers=headers)
        response = aiohttp.web.StreamResponse(headers=headers)
        assert request._raw_request is not None
        await response.prepare(request._raw_request)  # type: ignore[arg-type]
        sent = 0
        while True:
            text = self.pod_logs.get(key, "")
            if len(text) > sent:
                await response.write(text[sent:].encode())
                sent = len(text)
            pod = self._live_object(request)
            finished = pod is None or pod.get("status", {}).get("phase") in _TERMINAL_POD_PHASES
            if finished and len(self.pod_logs.get(key, "")) == sent:
                await response.write_eof()
                return response
            await asyncio.sleep(0.05)

    def _live_object(self, request: rendering.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return self._objects[key].raw


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resource_key(resource: kmock.resource) -> str:
    prefix = f"{resource.group}/{resource.version}" if resource.group else str(resource.version)
    return f"{prefix}/{resource.plural}"


def _selected(obj: dict[str, Any], params: dict[str, str] | Any) -> bool:
    """Whether ``obj`` matches the request's ``labelSelector`` and ``fieldSelector`` (equality and existence)."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (params.get("labelSelector") or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.strip() not in labels:
            return False
    for term in filter(None, (params.get("fieldSelector") or "").split(",")):
        key, value = term.replace("==", "=").split("=", 1)
        field: Any = obj
        for part in key.strip().split("."):
            field = field.get(part) if isinstance(field, dict) else None
        if str(field if field is not None else "") != value.strip():
            return False
    return True
