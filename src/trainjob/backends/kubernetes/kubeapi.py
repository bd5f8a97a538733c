"""A small typed layer over the ``kubernetes`` client: objects as plain dicts, ``None`` for "not found".

The operator and the SDK backend both talk to the API server through :class:`KubeApi`::

    api = KubeApi(load_api_client(KubernetesBackendConfig()))
    job = api.get(TRAINJOBS, "default", "mnist")          # dict or None
    api.patch_status(TRAINJOBS, "default", "mnist", {"status": {...}})
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.resources import RENDERED_RESOURCES, ResourceRef
from trainjob.errors import AlreadyExistsError, BackendError

if TYPE_CHECKING:
    import kubernetes.client


class KubeApi:
    """Get, list, create, patch and delete custom objects, pods and events."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        import kubernetes.client

        self.client = client
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)

    # -- custom objects -------------------------------------------------------------------------------------------

    def get(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            if ref.namespaced:
                return self.custom.get_namespaced_custom_object(
                    ref.group, ref.version, namespace, ref.plural, name
                )
            return self.custom.get_cluster_custom_object(ref.group, ref.version, ref.plural, name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise _backend_error(exc, f"get {ref.kind} {name}") from exc

    def list(
        self, ref: ResourceRef, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        kwargs = {"label_selector": label_selector} if label_selector else {}
        try:
            if ref.namespaced and namespace:
                listing = self.custom.list_namespaced_custom_object(
                    ref.group, ref.version, namespace, ref.plural, **kwargs
                )
            else:
                listing = self.custom.list_cluster_custom_object(ref.group, ref.version, ref.plural, **kwargs)
        except Exception as exc:
            raise _backend_error(exc, f"list {ref.plural}") from exc
        return list(listing.get("items", []))

    def create(self, obj: dict[str, Any], ref: ResourceRef | None = None) -> dict[str, Any]:
        """Create ``obj``; its resource comes from ``apiVersion``/``kind`` unless ``ref`` is given."""
        ref = ref or RENDERED_RESOURCES[(obj["apiVersion"], obj["kind"])]
        namespace = obj["metadata"].get("namespace")
        try:
            if not ref.group:  # a core object (an MPI job's Secret and ConfigMap, a PyTorchJob's pods and services)
                create = {"Secret": self.core.create_namespaced_secret,
                          "ConfigMap": self.core.create_namespaced_config_map,
                          "Pod": self.core.create_namespaced_pod,
                          "Service": self.core.create_namespaced_service}[ref.kind]
                return dict(self.core.api_client.sanitize_for_serialization(create(namespace, obj)))
            if ref.namespaced:
                return self.custom.create_namespaced_custom_object(
                    ref.group, ref.version, namespace, ref.plural, obj
                )
            return self.custom.create_cluster_custom_object(ref.group, ref.version, ref.plural, obj)
        except Exception as exc:
            name = obj["metadata"].get("name")
            if _status(exc) == 409:
                raise AlreadyExistsError(f"{ref.kind} {namespace}/{name} exists already") from exc
            raise _backend_error(exc, f"create {ref.kind} {name}") from exc

    def patch(
        self, ref: ResourceRef, namespace: str | None, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch the object; ``None`` when it is gone."""
        try:
            if not ref.namespaced:
                return self.custom.patch_cluster_custom_object(
                    ref.group, ref.version, ref.plural, name, patch
                )
            return self.custom.patch_namespaced_custom_object(
                ref.group, ref.version, namespace, ref.plural, name, patch
            )
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise _backend_error(exc, f"patch {ref.kind} {name}") from exc

    def patch_status(
        self, ref: ResourceRef, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch ``status`` through the status subresource; the object as it now is, ``None`` when it is
        gone."""
        try:
            return self.custom.patch_namespaced_custom_object_status(
                ref.group, ref.version, namespace, ref.plural, name, {"status": status}
            )
        except Exception as exc:
            if _status(exc) != 404:
                raise _backend_error(exc, f"update the status of {ref.kind} {name}") from exc
            return None

    def delete(
        self, ref: ResourceRef, namespace: str | None, name: str, propagation: str = "Foreground",
        grace_period_seconds: int | None = None,
    ) -> bool:
        """Delete (``Foreground`` propagation unless told otherwise); ``False`` when there was nothing to delete.
        Core objects (pods, services) are deleted through the core API; ``grace_period_seconds=0`` removes a
        finished pod at once, so one of the same name can be created right after."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            if not ref.group:
                delete = {"Pod": self.core.delete_namespaced_pod,
                          "Service": self.core.delete_namespaced_service}[ref.kind]
                delete(name, namespace, body=body)
            elif ref.namespaced:
                self.custom.delete_namespaced_custom_object(
                    ref.group, ref.version, namespace, ref.plural, name, body=body
                )
            else:
                self.custom.delete_cluster_custom_object(ref.group, ref.version, ref.plural, name, body=body)
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise _backend_error(exc, f"delete {ref.kind} {name}") from exc
        return True

    # -- core -----------------------------------------------------------------------------------------------------

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        try:
            listing = self.core.list_namespaced_pod(
                namespace, label_selector=label_selector, _preload_content=False
            )
        except Exception as exc:
            raise _backend_error(exc, f"list pods {label_selector}") from exc
        return list(json.loads(listing.data).get("items", []))

    def evict(self, namespace: str, name: str) -> bool:
        """Evict a pod through the Eviction API (the API server marks it ``DisruptionTarget`` and deletes it with
        its grace period); ``False`` when it is gone already."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body)
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise _backend_error(exc, f"evict pod {name}") from exc
        return True

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> bool:
        """Set annotations of a pod (a merge patch of its metadata); ``False`` when it is gone."""
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise _backend_error(exc, f"annotate pod {name}") from exc
        return True

    def add_ephemeral_container(self, namespace: str, name: str, container: dict[str, Any]) -> bool:
        """Add an ephemeral container to a pod (its ``ephemeralcontainers`` subresource, as ``kubectl debug``);
        ``False`` when the pod is gone."""
        try:
            self.core.patch_namespaced_pod_ephemeralcontainers(
                name, namespace, {"spec": {"ephemeralContainers": [container]}})
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise _backend_error(exc, f"add an ephemeral container to pod {name}") from exc
        return True

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as a dict; ``None`` when it is gone."""
        try:
            return json.loads(self.core.read_namespaced_pod(name, namespace, _preload_content=False).data)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise _backend_error(exc, f"read pod {name}") from exc

    def read_log(self, namespace: str, pod: dict[str, Any], container: str, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of a container's log (through the API server's ``pods/log``)."""
        try:
            return str(
                self.core.read_namespaced_pod_log(
                    pod["metadata"]["name"], namespace, container=container, tail_lines=tail_lines
                )
            )
        except Exception as exc:
            raise _backend_error(exc, f"read the log of pod {pod['metadata']['name']}") from exc

    def read_pod_log(self, namespace: str, pod_name: str, **options: Any) -> str:
        """A pod's log (``options``: ``timestamps``, ``tail_lines``, ``since_seconds``, ``previous`` ...);
        ``NotFoundError`` when there is none to read (no previous container, pod gone)."""
        from trainjob.errors import NotFoundError

        try:
            return str(self.core.read_namespaced_pod_log(pod_name, namespace, **options))
        except Exception as exc:
            if _status(exc) in (400, 404):
                raise NotFoundError(str(_backend_error(exc, f"read the log of pod {pod_name}"))) from exc
            raise _backend_error(exc, f"read the log of pod {pod_name}") from exc

    def list_events(
        self, namespace: str, involved_name: str, include_children: bool = False
    ) -> list[dict[str, Any]]:
        """Events about ``involved_name`` (and, with ``include_children``, objects named ``{name}-...``), oldest first."""
        selector = None if include_children else f"involvedObject.name={involved_name}"
        try:
            listing = self.core.list_namespaced_event(
                namespace, field_selector=selector, _preload_content=False
            )
        except Exception as exc:
            raise _backend_error(exc, f"list events of {involved_name}") from exc

        def wanted(name: str) -> bool:
            return name == involved_name or (include_children and name.startswith(f"{involved_name}-"))

        items = [e for e in json.loads(listing.data).get("items", []) if wanted(e["involvedObject"]["name"])]
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
        try:
            # read as bytes, not made into the client's V1Event model (its timestamps parsed by dateutil)
            self.core.create_namespaced_event(meta["namespace"], event, _preload_content=False).read()
        except Exception as exc:
            if name and _status(exc) == 409:
                return
            raise _backend_error(exc, f"post an event about {meta['name']}") from exc


class ApiError(BackendError):
    """The API server refused a request or could not be reached; ``status`` is the HTTP status (``None``: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _backend_error(exc: Exception, doing: str) -> ApiError:
    status = _status(exc)
    if status is None or status == 0:
        return ApiError(f"cannot {doing}: the Kubernetes API server is unreachable ({exc})")
    reason = getattr(exc, "reason", "") or ""
    body = getattr(exc, "body", "") or ""
    try:
        import json

        body = json.loads(body).get("message", body)
    except (ValueError, AttributeError):
        pass
    return ApiError(f"cannot {doing}: the API server answered {status} {reason}: {body}".rstrip(": "), status)
