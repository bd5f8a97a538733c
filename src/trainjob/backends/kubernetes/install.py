"""Apply the install manifests to a cluster: create each object, or merge-patch it when it exists.

api_client = load_api_client(KubernetesBackendConfig(context="prod"))
for line in apply_manifests(api_client, install_manifests()):
    print(line)                      # "created CustomResourceDefinition trainjobs.trainer.kubeflow.org"
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.manifests import CREATE_ONLY_ANNOTATION
from trainjob.errors import BackendError

if TYPE_CHECKING:
    import kubernetes.client

#: (apiVersion, kind) -> (plural, namespaced) for every kind the install manifests hold.
_KINDS = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Service"): ("services", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): ("clustertrainingruntimes", False),
    ("kueue.x-k8s.io/v1beta1", "ResourceFlavor"): ("resourceflavors", False),
    ("kueue.x-k8s.io/v1beta1", "ClusterQueue"): ("clusterqueues", False),
    ("kueue.x-k8s.io/v1beta1", "LocalQueue"): ("localqueues", True),
}


def object_path(obj: dict[str, Any], named: bool) -> str:
    """The REST path of ``obj`` (``named``: including its name)."""
    plural, namespaced = _KINDS[(obj["apiVersion"], obj["kind"])]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    if namespaced:
        base += f"/namespaces/{obj['metadata']['namespace']}"
    path = f"{base}/{plural}"
    return f"{path}/{obj['metadata']['name']}" if named else path


def apply_manifests(
    client: kubernetes.client.ApiClient, objects: list[dict[str, Any]], wait_for_crds: float = 60.0
) -> Iterator[str]:
    """Create or update each object in order; yields one line per object. Custom kinds wait for their CRD.
    Objects annotated ``trainjob/create-only`` that exist are kept as they are."""
    for obj in objects:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        deadline = time.monotonic() + wait_for_crds
        while True:
            status = _request(client, "POST", object_path(obj, named=False), obj)
            if status == 404 and obj["kind"] == "ClusterTrainingRuntime" and time.monotonic() < deadline:
                time.sleep(1.0)  # the CRD was just created and is not served yet
                continue
            break
        if status == 409 and _create_only(obj):
            yield f"kept {what}"  # possibly Kubeflow Trainer's own: its values win
            continue
        if status == 409 and _foreign_crd(client, obj):
            yield (f"skipped {what}: it exists and trainjob did not install it (the Training Operator's?); "
                   "trainjob's operator leaves these jobs to the controller that owns it")
            continue
        if status == 409:
            status = _request(client, "PATCH", object_path(obj, named=True), obj)
            verb = "configured"
        else:
            verb = "created"
        if status >= 300:
            raise BackendError(f"cannot apply {what}: the API server answered {status}")
        yield f"{verb} {what}"


def _foreign_crd(client: kubernetes.client.ApiClient, obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is a CRD of trainjob's own (labelled ``app.kubernetes.io/part-of: trainjob``) whose
    namesake on the cluster lacks that label: another controller's, left alone."""
    from trainjob.backends.kubernetes.pytorchjob import owns_crd
    from trainjob.backends.kubernetes.resources import PART_OF_LABEL

    if obj["kind"] != "CustomResourceDefinition" or PART_OF_LABEL not in (obj["metadata"].get("labels") or {}):
        return False
    from trainjob.backends.kubernetes.kubeapi import KubeApi

    return not owns_crd(KubeApi(client), obj["metadata"]["name"])


def _create_only(obj: dict[str, Any]) -> bool:
    return (obj["metadata"].get("annotations") or {}).get(CREATE_ONLY_ANNOTATION) == "true"


def _request(client: kubernetes.client.ApiClient, method: str, path: str, body: dict[str, Any]) -> int:
    """Send one request; the HTTP status. The client's request API changed in kubernetes 36 (``param_serialize``);
    both shapes are supported, as pyproject's range promises."""
    from kubernetes.client.exceptions import ApiException

    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    headers = {"Content-Type": content_type, "Accept": "application/json"}
    try:
        if hasattr(client, "param_serialize"):  # kubernetes >= 36
            method_, url, headers, serialized, _ = client.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = client.call_api(method_, url, header_params=headers, body=serialized)
            response.read()
            return int(response.status)
        _, status, _ = client.call_api(
            path, method, header_params=headers, body=body, auth_settings=["BearerToken"],
            _return_http_data_only=False, _preload_content=False,
        )
        return int(status)
    except ApiException as exc:  # kubernetes < 36 raises for every status past 299
        return int(exc.status)
    except Exception as exc:
        raise BackendError(f"cannot reach the Kubernetes API server: {exc}") from exc
