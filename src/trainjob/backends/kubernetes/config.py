"""How to reach a Kubernetes cluster: the SDK's ``KubernetesBackendConfig`` and the API client built from it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainjob.errors import BackendError

if TYPE_CHECKING:
    import kubernetes.client


@dataclass
class KubernetesBackendConfig:
    """Where TrainJobs go when the Kubernetes backend is used.

    ``namespace`` defaults to the kubeconfig context's namespace, then ``default``; ``config_file`` to
    ``$KUBECONFIG`` or ``~/.kube/config``; ``context`` to the current context. Inside a pod with none of them
    set, the in-cluster service account is used::

        from trainjob import TrainerClient
        from trainjob.backends.kubernetes import KubernetesBackendConfig

        client = TrainerClient(KubernetesBackendConfig(namespace="ml-team", context="prod"))
    """

    namespace: str | None = None
    config_file: str | None = None
    context: str | None = None


def load_api_client(
    config: KubernetesBackendConfig, user_agent: str | None = None
) -> kubernetes.client.ApiClient:
    """An API client for ``config`` (kubeconfig file and context, or the in-cluster service account)."""
    import kubernetes.client
    import kubernetes.config

    configuration = kubernetes.client.Configuration()
    try:
        if _in_cluster(config):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(
                config_file=config.config_file, context=config.context, client_configuration=configuration
            )
    except (kubernetes.config.ConfigException, OSError) as exc:
        where = config.config_file or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise BackendError(
            f"cannot load the Kubernetes configuration from {where}"
            f"{f' (context {config.context!r})' if config.context else ''}: {exc}; "
            "pass KubernetesBackendConfig(config_file=..., context=...) or set KUBECONFIG"
        ) from exc
    client = kubernetes.client.ApiClient(configuration)
    if user_agent:
        client.user_agent = user_agent
    return client


def resolve_namespace(config: KubernetesBackendConfig) -> str:
    """The namespace jobs go to: the configured one, the kubeconfig context's, the pod's own, or ``default``."""
    if config.namespace:
        return config.namespace
    if _in_cluster(config):
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as fh:
                return fh.read().strip() or "default"
        except OSError:
            return "default"
    try:
        import kubernetes.config

        contexts, current = kubernetes.config.list_kube_config_contexts(config_file=config.config_file)
        chosen = (
            next((c for c in contexts if c["name"] == config.context), current) if config.context else current
        )
        return (chosen or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: the client reports it when it connects
        return "default"


def _in_cluster(config: KubernetesBackendConfig) -> bool:
    return (
        config.config_file is None
        and config.context is None
        and "KUBECONFIG" not in os.environ
        and "KUBERNETES_SERVICE_HOST" in os.environ
        and not os.path.exists(os.path.expanduser("~/.kube/config"))
    )
