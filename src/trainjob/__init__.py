"""trainjob: distributed PyTorch training as real multi-node jobs, on one machine or on Kubernetes.

The SDK's names are importable from here, as in the Kubeflow SDK::

    from trainjob import TrainerClient, CustomTrainer
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_CLIENT_NAMES = ("TrainerClient", "CustomTrainer", "LocalProcessBackendConfig", "KubernetesBackendConfig")

if TYPE_CHECKING:
    from trainjob.client import (
        CustomTrainer,
        KubernetesBackendConfig,
        LocalProcessBackendConfig,
        TrainerClient,
    )

__all__ = ["CustomTrainer", "KubernetesBackendConfig", "LocalProcessBackendConfig", "TrainerClient", "__version__"]


def __getattr__(name: str) -> Any:
    # Loaded on first use so that `import trainjob` (and the CLI) stays fast.
    if name in _CLIENT_NAMES:
        from trainjob import client

        return getattr(client, name)
    raise AttributeError(f"module 'trainjob' has no attribute {name!r}")
