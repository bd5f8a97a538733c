"""trainjob: distributed PyTorch training as real multi-node jobs, on one machine or on Kubernetes.

The SDK's names are importable from here, as in the Kubeflow SDK (``kubeflow.trainer``)::

    from trainjob import TrainerClient, CustomTrainer
    from trainjob import ContainerBackendConfig        # TrainerClient(ContainerBackendConfig()): nodes as containers
    from trainjob import update_trainjob_status        # inside a training function: progress for the job's status
    from trainjob import Initializer, S3DatasetInitializer  # data and model before the nodes start
    from trainjob import BuiltinTrainer, TorchTuneConfig    # fine-tune an LLM on a torchtune runtime
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_CLIENT_NAMES = (
    "TrainerClient", "CustomTrainer", "CustomTrainerContainer", "LocalProcessBackendConfig", "KubernetesBackendConfig",
    "ContainerBackendConfig",
)

_INITIALIZER_NAMES = (
    "Initializer", "HuggingFaceDatasetInitializer", "S3DatasetInitializer", "HuggingFaceModelInitializer",
    "S3ModelInitializer", "DataCacheInitializer",
)

_BUILTIN_TRAINER_NAMES = (
    "BuiltinTrainer", "TorchTuneConfig", "LoraConfig", "TorchTuneInstructDataset", "DataType", "Loss",
)

if TYPE_CHECKING:
    from trainjob.sdk.builtin_trainers import (
        BuiltinTrainer,
        DataType,
        LoraConfig,
        Loss,
        TorchTuneConfig,
        TorchTuneInstructDataset,
    )
    from trainjob.sdk.client import (
        ContainerBackendConfig,
        CustomTrainer,
        CustomTrainerContainer,
        KubernetesBackendConfig,
        LocalProcessBackendConfig,
        TrainerClient,
    )
    from trainjob.sdk.initializers import (
        DataCacheInitializer,
        HuggingFaceDatasetInitializer,
        HuggingFaceModelInitializer,
        Initializer,
        S3DatasetInitializer,
        S3ModelInitializer,
    )
    from trainjob.torch.metrics import update_trainjob_status

__all__ = [
    "BuiltinTrainer",
    "ContainerBackendConfig",
    "CustomTrainer",
    "CustomTrainerContainer",
    "DataCacheInitializer",
    "DataType",
    "HuggingFaceDatasetInitializer",
    "HuggingFaceModelInitializer",
    "Initializer",
    "KubernetesBackendConfig",
    "LocalProcessBackendConfig",
    "LoraConfig",
    "Loss",
    "S3DatasetInitializer",
    "S3ModelInitializer",
    "TorchTuneConfig",
    "TorchTuneInstructDataset",
    "TrainerClient",
    "__version__",
    "update_trainjob_status",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use so that `import trainjob` (and the CLI) stays fast.
    if name in _CLIENT_NAMES:
        from trainjob.sdk import client

        return getattr(client, name)
    if name in _INITIALIZER_NAMES:
        from trainjob.sdk import initializers

        return getattr(initializers, name)
    if name in _BUILTIN_TRAINER_NAMES:
        from trainjob.sdk import builtin_trainers

        return getattr(builtin_trainers, name)
    if name == "update_trainjob_status":
        from trainjob.torch.metrics import update_trainjob_status

        return update_trainjob_status
    raise AttributeError(f"module 'trainjob' has no attribute {name!r}")
