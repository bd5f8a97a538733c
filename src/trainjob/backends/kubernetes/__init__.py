"""The Kubernetes backend: TrainJobs as objects on a cluster, reconciled into JobSets by ``trainjob operator``.

The SDK picks it from the config type, the CLI through :func:`create_backend`::

    from trainjob.backends.kubernetes import KubernetesBackendConfig, create_backend

    backend = create_backend(namespace="ml-team", context="prod")   # what `--backend kubernetes` uses
    print([job.name for job in backend.list_jobs()])

Importing this package is cheap; the ``kubernetes`` client loads when a backend is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.config import KubernetesBackendConfig

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend", "KubernetesBackendConfig", "create_backend"]


def create_backend(
    namespace: str | None = None, config_file: str | None = None, context: str | None = None
) -> KubernetesBackend:
    """A :class:`KubernetesBackend` from CLI-style options (``--namespace``, ``--kubeconfig``, ``--context``)."""
    from trainjob.backends.kubernetes.backend import KubernetesBackend

    return KubernetesBackend(
        KubernetesBackendConfig(namespace=namespace, config_file=config_file, context=context)
    )


def __getattr__(name: str) -> Any:
    if name == "KubernetesBackend":
        from trainjob.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend
    raise AttributeError(name)
