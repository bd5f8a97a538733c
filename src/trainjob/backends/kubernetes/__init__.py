"""The Kubernetes backend: TrainJobs as objects on a cluster, reconciled into JobSets by ``trainjob operator``.

The SDK and the CLI pick it from the config type (:func:`trainjob.sdk.client.backend_for`)::

    from trainjob.backends.kubernetes import KubernetesBackend, KubernetesBackendConfig

    backend = KubernetesBackend(KubernetesBackendConfig(namespace="ml-team", context="prod"))
    print([job.name for job in backend.list_jobs()])

Importing this package is cheap; the ``kubernetes`` client loads when a backend is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainjob.backends.kubernetes.config import KubernetesBackendConfig

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend", "KubernetesBackendConfig"]


def __getattr__(name: str) -> Any:
    if name == "KubernetesBackend":
        from trainjob.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend
    raise AttributeError(name)
