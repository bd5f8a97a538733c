"""A small typed layer over the Kubernetes API: objects as plain dicts, ``None`` for "not found".

The operator and the SDK backend both talk to the API server through :class:`KubeApi`, over a
:class:`~trainjob.backends.kubernetes.rest.RestClient` (the operator: no ``kubernetes`` package in its process) or
the ``kubernetes`` client's ``ApiClient`` (any kubeconfig; the CLI and the SDK)::

    api = KubeApi(load_api_client(KubernetesBackendConfig()))
    job = api.get(TRAINJOBS, "default", "mnist")          # dict or None
    api.patch_status(TRAINJOBS, "default", "mnist", {"status": {...}})
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.resources import PODS, RENDERED_RESOURCES, SECRETS, ResourceRef
from trainjob.backends.kubernetes.rest import ClientTransport, RestClient, RestError
from trainjob.errors import AlreadyExistsError, BackendError

if TYPE_CHECKING:
    import kubernetes.client

    from trainjob.backends.kubernetes.rest import Transport

#: A merge patch (RFC 7386), what every ``patch`` sends; pods' subresources take a strategic merge patch.
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
#: What ``kubectl get`` asks for: the server's printed columns (``Table``), with JSON as the fallback.
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
_GONE = object()


def path_of(ref: ResourceRef, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    """The API path of ``ref``'s collection, or of object ``name`` (and its subresource ``sub``).

    >>> path_of(PODS, "ml", "mnist-0", "log")
    '/api/v1/namespaces/ml/pods/mnist-0/log'
    """
    base = f"/apis/{ref.group}/{ref.version}" if ref.group else f"/api/{ref.version}"
    where = f"/namespaces/{namespace}" if ref.namespaced and namespace else ""
    return f"{base}{where}/{ref.plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


class KubeApi:
    """Get, list, create, patch and delete objects, pods' logs and events, over ``client``: a
    :class:`~trainjob.backends.kubernetes.rest.RestClient` or a ``kubernetes`` ``ApiClient``."""

    def __init__(self, client: RestClient | kubernetes.client.ApiClient) -> None:
        self.client = client
        self.transport: Transport = client if isinstance(client, RestClient) else ClientTransport(client)

    def close(self) -> None:
        self.transport.close()

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        """The ``kubernetes`` client's ``CoreV1Api`` on the same ``ApiClient``, for tools and tests that want its
        models (there is none over a :class:`~trainjob.backends.kubernetes.rest.RestClient`)."""
        return self._typed("CoreV1Api")  # type: ignore[no-any-return]

    @property
    def custom(self) -> kubernetes.client.CustomObjectsApi:
        """The ``kubernetes`` client's ``CustomObjectsApi`` on the same ``ApiClient`` (as :attr:`core`)."""
        return self._typed("CustomObjectsApi")  # type: ignore[no-any-return]

    def _typed(self, name: str) -> Any:
        if isinstance(self.client, RestClient):
            raise AttributeError(f"{name}: this KubeApi talks through a RestClient, without the kubernetes client")
        import kubernetes.client

        return getattr(kubernetes.client, name)(self.client)

    def _call(self, method: str, path: str, doing: str, *, query: dict[str, Any] | None = None, body: Any = None,
              content_type: str = "application/json", gone: tuple[int, ...] = (),
              timeout: float | None = None, accept: str = "application/json") -> Any:
        """The decoded answer; :data:`_GONE` when the status is one of ``gone``; else :class:`ApiError`
        naming what was being done."""
        try:
            response = self.transport.request(method, path, query=query, body=body, content_type=content_type,
                                              timeout=timeout, accept=accept)
        except RestError as exc:
            if exc.status in gone:
                return _GONE
            raise _backend_error(exc, doing) from exc
        data = response.data
        return json.loads(data) if data else {}

    # -- any resource ---------------------------------------------------------------------------------------------

    def get(self, ref: ResourceRef, namespace: str | None, name: str,
            timeout: float | None = None) -> dict[str, Any] | None:
        found = self._call("GET", path_of(ref, namespace, name), f"get {ref.kind} {name}", gone=(404,),
                           timeout=timeout)
        return None if found is _GONE else found

    def list(
        self, ref: ResourceRef, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        listing = self._call("GET", path_of(ref, namespace), f"list {ref.plural}", query=query)
        return list(listing.get("items") or [])

    def create(self, obj: dict[str, Any], ref: ResourceRef | None = None,
               timeout: float | None = None) -> dict[str, Any]:
        """Create ``obj``; its resource comes from ``apiVersion``/``kind`` unless ``ref`` is given."""
        ref = ref or RENDERED_RESOURCES[(obj["apiVersion"], obj["kind"])]
        namespace, name = obj["metadata"].get("namespace"), obj["metadata"].get("name")
        created = self._call("POST", path_of(ref, namespace), f"create {ref.kind} {name}", body=obj, gone=(409,),
                             timeout=timeout)
        if created is _GONE:
            raise AlreadyExistsError(f"{ref.kind} {namespace}/{name} exists already")
        return dict(created)

    def replace(self, obj: dict[str, Any], ref: ResourceRef, timeout: float | None = None) -> dict[str, Any] | None:
        """Replace ``obj`` (PUT; its ``metadata.resourceVersion``, when set, must still be the stored one:
        :class:`ApiError` with status 409 otherwise); ``None`` when it is gone."""
        meta = obj["metadata"]
        replaced = self._call("PUT", path_of(ref, meta.get("namespace"), meta["name"]),
                              f"replace {ref.kind} {meta['name']}", body=obj, gone=(404,), timeout=timeout)
        return None if replaced is _GONE else replaced

    def patch(
        self, ref: ResourceRef, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch the object; ``None`` when it is gone."""
        patched = self._call("PATCH", path_of(ref, namespace, name), f"patch {ref.kind} {name}", body=patch,
                             content_type=MERGE_PATCH, gone=(404,))
        return None if patched is _GONE else patched

    def patch_status(
        self, ref: ResourceRef, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch ``status`` through the status subresource; the object as it now is, ``None`` when it is
        gone."""
        patched = self._call("PATCH", path_of(ref, namespace, name, "status"),
                             f"update the status of {ref.kind} {name}", body={"status": status},
                             content_type=MERGE_PATCH, gone=(404,))
        return None if patched is _GONE else patched

    def delete(
        self, ref: ResourceRef, namespace: str | None, name: str, propagation: str = "Foreground",
        grace_period_seconds: int | None = None,
    ) -> bool:
        """Delete (``Foreground`` propagation unless told otherwise); ``False`` when there was nothing to delete.
        ``grace_period_seconds=0`` removes a finished pod at once, so one of the same name can be created right
        after."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        return self._call("DELETE", path_of(ref, namespace, name), f"delete {ref.kind} {name}", body=body,
                          gone=(404,)) is not _GONE

    # -- pods -----------------------------------------------------------------------------------------------------

    def list_pods(self, namespace: str, label_selector: str, field_selector: str | None = None) -> list[dict[str, Any]]:
        """The pods with these labels; ``field_selector`` (``status.phase=Pending,spec.nodeName!=``) has the API
        server leave out the others, so they are neither sent nor decoded here."""
        query = {"labelSelector": label_selector, **({"fieldSelector": field_selector} if field_selector else {})}
        listing = self._call("GET", path_of(PODS, namespace), f"list pods {label_selector}", query=query)
        return list(listing.get("items") or [])

    def table_in_pages(self, ref: ResourceRef, namespace: str | None, label_selector: str,
                       field_selector: str | None = None, page: int = 1000) -> Iterator[list[dict[str, Any]]]:
        """The objects a listing finds as the API server prints them for ``kubectl get`` (a ``Table``), each a
        dict of column name to cell (``Name``, ``Status``, ``Node`` for pods), ``page`` rows at a time (a request
        each). A row is some 150 bytes where a pod is some 5 KiB: a job of a thousand nodes is looked over without
        sending or decoding its pods."""
        query: dict[str, Any] = {"labelSelector": label_selector, "limit": page, "includeObject": "None",
                                 **({"fieldSelector": field_selector} if field_selector else {})}
        while True:
            table = self._call("GET", path_of(ref, namespace), f"list {ref.plural} {label_selector}", query=query,
                               accept=TABLE)
            if table.get("kind") != "Table":
                raise ApiError(f"list {ref.plural} {label_selector}: the API server answered a "
                               f"{table.get('kind') or 'body'} where a meta.k8s.io/v1 Table was asked for")
            columns = [column["name"] for column in table.get("columnDefinitions") or []]
            yield [dict(zip(columns, row.get("cells") or [], strict=False)) for row in table.get("rows") or []]
            more = (table.get("metadata") or {}).get("continue")
            if not more:
                return
            query = {**query, "continue": more}

    def evict(self, namespace: str, name: str) -> bool:
        """Evict a pod through the Eviction API (the API server marks it ``DisruptionTarget`` and deletes it with
        its grace period); ``False`` when it is gone already."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        return self._call("POST", path_of(PODS, namespace, name, "eviction"), f"evict pod {name}", body=body,
                          gone=(404,)) is not _GONE

    def add_pod_condition(self, namespace: str, name: str, condition: dict[str, Any]) -> bool:
        """Set one condition of a pod's status (a strategic merge patch of ``pods/status``: the conditions merge
        by type, the others stay), as Kubernetes' components mark ``DisruptionTarget``; ``False`` when the pod is
        gone."""
        return self._call("PATCH", path_of(PODS, namespace, name, "status"), f"set condition {condition['type']} "
                          f"of pod {name}", body={"status": {"conditions": [condition]}},
                          content_type=STRATEGIC_MERGE_PATCH, gone=(404,)) is not _GONE

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> bool:
        """Set annotations of a pod (a merge patch of its metadata); ``False`` when it is gone."""
        return self._call("PATCH", path_of(PODS, namespace, name), f"annotate pod {name}",
                          body={"metadata": {"annotations": annotations}}, content_type=STRATEGIC_MERGE_PATCH,
                          gone=(404,)) is not _GONE

    def add_ephemeral_container(self, namespace: str, name: str, container: dict[str, Any]) -> bool:
        """Add an ephemeral container to a pod (its ``ephemeralcontainers`` subresource, as ``kubectl debug``;
        a strategic merge patch keeps the ones it has); ``False`` when the pod is gone."""
        return self._call("PATCH", path_of(PODS, namespace, name, "ephemeralcontainers"),
                          f"add an ephemeral container to pod {name}",
                          body={"spec": {"ephemeralContainers": [container]}},
                          content_type=STRATEGIC_MERGE_PATCH, gone=(404,)) is not _GONE

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as a dict; ``None`` when it is gone."""
        return self.get(PODS, namespace, name)

    def read_log(self, namespace: str, pod: dict[str, Any], container: str, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of a container's log (through the API server's ``pods/log``)."""
        name = pod["metadata"]["name"]
        try:
            response = self.transport.request("GET", path_of(PODS, namespace, name, "log"),
                                              query={"container": container, "tailLines": tail_lines})
        except RestError as exc:
            raise _backend_error(exc, f"read the log of pod {name}") from exc
        return response.data.decode(errors="replace")

    def read_pod_log(self, namespace: str, pod_name: str, **options: Any) -> str:
        """A pod's log (``options``: ``timestamps``, ``tail_lines``, ``since_seconds``, ``previous``,
        ``container``); ``NotFoundError`` when there is none to read (no previous container, pod gone)."""
        from trainjob.errors import NotFoundError

        try:
            response = self.transport.request("GET", path_of(PODS, namespace, pod_name, "log"),
                                              query=_log_query(options))
        except RestError as exc:
            if exc.status in (400, 404):
                raise NotFoundError(str(_backend_error(exc, f"read the log of pod {pod_name}"))) from exc
            raise _backend_error(exc, f"read the log of pod {pod_name}") from exc
        return response.data.decode(errors="replace")

    def follow_pod_log(self, namespace: str, pod_name: str, **options: Any) -> Iterator[bytes]:
        """A pod's log as it is written (``follow``), in chunks, until its container ends (``options`` as
        :meth:`read_pod_log`'s)."""
        try:
            response = self.transport.request("GET", path_of(PODS, namespace, pod_name, "log"),
                                              query={**_log_query(options), "follow": "true"}, preload=False)
        except RestError as exc:
            raise _backend_error(exc, f"follow the log of pod {pod_name}") from exc
        try:
            yield from response.stream(4096)
        finally:
            response.release_conn()

    # -- secrets, token reviews, events ---------------------------------------------------------------------------

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret as a dict (its ``data`` base64-encoded); ``None`` when there is none."""
        return self.get(SECRETS, namespace, name)

    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """The API server's ``TokenReview`` of ``token`` for ``audiences``: its ``status`` (``authenticated``,
        ``user``, ``audiences``, ``error``)."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": audiences}}
        answer = self._call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", "review a token", body=review)
        return dict(answer.get("status") or {})

    def list_events(
        self, namespace: str, involved_name: str, include_children: bool = False
    ) -> list[dict[str, Any]]:
        """Events about ``involved_name`` (and, with ``include_children``, objects named ``{name}-...``), oldest first."""
        query = None if include_children else {"fieldSelector": f"involvedObject.name={involved_name}"}
        listing = self._call("GET", f"/api/v1/namespaces/{namespace}/events", f"list events of {involved_name}",
                             query=query)

        def wanted(name: str) -> bool:
            return name == involved_name or (include_children and name.startswith(f"{involved_name}-"))

        items = [e for e in listing.get("items") or [] if wanted(e["involvedObject"]["name"])]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str,
                   name: str | None = None) -> None:
        """Record a ``Normal``/``Warning`` Event about ``involved`` (shown by ``kubectl describe``). With ``name``
        the Event is posted under that name, so posting it again (after a crash cut the first answer off) is a
        409, taken as posted: never two."""
        meta = involved["metadata"]
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {**({"name": name} if name else {"generateName": f"{meta['name']}."}),
                         "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "trainjob-operator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._call("POST", f"/api/v1/namespaces/{meta['namespace']}/events", f"post an event about {meta['name']}",
                   body=event, gone=(409,) if name else ())


def _log_query(options: dict[str, Any]) -> dict[str, Any]:
    """The ``pods/log`` query of the ``kubernetes`` client's keyword names (``tail_lines`` ...)."""
    names = {"tail_lines": "tailLines", "since_seconds": "sinceSeconds", "limit_bytes": "limitBytes",
             "insecure_skip_tls_verify_backend": "insecureSkipTLSVerifyBackend"}
    return {names.get(key, key): (str(value).lower() if isinstance(value, bool) else value)
            for key, value in options.items() if value is not None}


class ApiError(BackendError):
    """The API server refused a request or could not be reached; ``status`` is the HTTP status (``None``: no answer)."""

    def __init__(self, message: str, status: int | None = None, answer: str = "") -> None:
        super().__init__(message)
        self.status = status
        #: What the API server answered (or why there was no answer), without what was being done.
        self.answer = answer or message


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _backend_error(exc: Exception, doing: str) -> ApiError:
    status = _status(exc)
    if status is None or status == 0:
        answer = f"the Kubernetes API server is unreachable ({exc})"
        return ApiError(f"cannot {doing}: {answer}", answer=answer)
    reason = getattr(exc, "reason", "") or ""
    body = getattr(exc, "body", "") or ""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError):
        body = json.loads(body).get("message", body)
    answer = f"the API server answered {status} {reason}: {body}".rstrip(": ")
    return ApiError(f"cannot {doing}: {answer}", status, answer)
