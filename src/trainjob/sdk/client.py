"""The Python SDK: ``TrainerClient`` with the Kubeflow SDK's names, so code ports by changing its import.

>>> from trainjob.sdk.client import TrainerClient, CustomTrainer               # doctest: +SKIP
>>> def train(epochs: int):
...     import torch.distributed as dist
...     dist.init_process_group("gloo")
...     print(f"rank {dist.get_rank()} of {dist.get_world_size()}, {epochs} epochs")
>>> client = TrainerClient()                                                # doctest: +SKIP
>>> name = client.train(trainer=CustomTrainer(func=train, func_args={"epochs": 2}, num_nodes=2))  # doctest: +SKIP
>>> client.wait_for_job_status(name).status                                # doctest: +SKIP
'Complete'
>>> for line in client.get_job_logs(name, follow=True): print(line)        # doctest: +SKIP

The backend follows the config's type: ``LocalProcessBackendConfig`` (the default: processes on this machine,
state under ``$TRAINJOB_HOME``), ``ContainerBackendConfig`` (the same, each node a container of the job's image,
on Docker or Podman) or ``KubernetesBackendConfig`` (TrainJobs on a cluster). ``train`` takes the
Kubeflow SDK's ``options`` (:mod:`trainjob.sdk.options`: ``Name``, ``Labels``, ``Annotations``, ``TrainerCommand``,
``TrainerArgs``, ``RuntimePatch``) and a ``CustomTrainer`` or ``CustomTrainerContainer``; inside the job,
:func:`trainjob.torch.metrics.update_trainjob_status` reports progress (``from trainjob import
update_trainjob_status``, as ``from kubeflow.trainer import update_trainjob_status``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainjob.backends.base import Backend
from trainjob.backends.local.client.backend import (
    ContainerBackendConfig,
    LocalBackend,
    LocalProcessBackendConfig,
)
from trainjob.errors import ValidationError
from trainjob.sdk.types import (
    COMPLETE,
    CustomTrainer,
    CustomTrainerContainer,
    Event,
    Runtime,
    RuntimeTrainer,
    Step,
    TrainJob,
)

#: Config class name -> (module, backend class); backends are imported only when used.
BACKENDS: dict[str, tuple[str, str]] = {
    "LocalProcessBackendConfig": ("trainjob.backends.local.client.backend", "LocalBackend"),
    # trainjob's or the Kubeflow SDK's: the local backend with its nodes as containers
    "ContainerBackendConfig": ("trainjob.backends.local.client.backend", "LocalBackend"),
    "KubernetesBackendConfig": ("trainjob.backends.kubernetes", "KubernetesBackend"),
}


def backend_for(config: Any | None = None) -> Backend:
    """The backend for ``config``, chosen by its type; ``None`` means local processes."""
    if config is None:
        return LocalBackend()
    for cls in type(config).__mro__:
        if cls.__name__ in BACKENDS:
            module_name, class_name = BACKENDS[cls.__name__]
            return getattr(importlib.import_module(module_name), class_name)(config)
    raise ValidationError(
        "backend_config", f"must be one of {', '.join(BACKENDS)}, got {type(config).__name__}"
    )


class TrainerClient:
    """Create, watch and delete TrainJobs; every call goes to the backend the config selects."""

    def __init__(self, backend_config: Any | None = None) -> None:
        self.backend = backend_for(backend_config)

    def list_runtimes(self) -> list[Runtime]:
        """The runtimes jobs can use (``torch-distributed`` is the default)."""
        return self.backend.list_runtimes()

    def get_runtime(self, name: str) -> Runtime:
        return self.backend.get_runtime(name)

    def get_runtime_packages(self, runtime: Runtime | str) -> None:
        """Print the Python version, the installed packages and (where there are any) the GPUs that a job on
        ``runtime`` runs with."""
        return self.backend.get_runtime_packages(runtime)

    def train(
        self,
        runtime: Runtime | str | None = None,
        initializer: Any | None = None,
        trainer: CustomTrainer | CustomTrainerContainer | None = None,
        options: Sequence[Any] | None = None,
    ) -> str:
        """Start ``trainer`` on every node; returns the new job's name.

        A ``CustomTrainer``'s function runs on every process of every node; ``options`` change the TrainJob
        before it is created::

            client.train(trainer=CustomTrainer(func=train), options=[Name("mnist"), Labels({"team": "cv"})])
        """
        return self.backend.train(runtime=runtime, initializer=initializer, trainer=trainer, options=options)

    def list_jobs(self, runtime: Runtime | None = None) -> list[TrainJob]:
        return self.backend.list_jobs(runtime=runtime)

    def get_job(self, name: str) -> TrainJob:
        return self.backend.get_job(name)

    def get_job_logs(self, name: str, step: str = "node-0", follow: bool | None = False) -> Iterator[str]:
        """Lines of one step (``node-0``, ``node-1`` ...); with ``follow`` they stream until the job ends."""
        return self.backend.get_job_logs(name, step=step, follow=bool(follow))

    def get_job_events(self, name: str) -> list[Event]:
        return self.backend.get_job_events(name)

    def wait_for_job_status(
        self,
        name: str,
        status: set[str] | None = None,
        timeout: int = 600,
        polling_interval: int = 2,
        callbacks: Sequence[Callable[[TrainJob], None]] | None = None,
    ) -> TrainJob:
        """Wait until the job reaches one of ``status`` (default ``{"Complete"}``).

        Raises :class:`trainjob.errors.JobFailedError` (a ``RuntimeError``) as soon as the job fails, its message
        naming the rank and the exception (``node-1 rank 1: NameError: name 'lr' is not defined``), and
        ``TimeoutError`` after ``timeout`` seconds. ``callbacks`` are called with the job every
        ``polling_interval`` seconds, and with the job the wait ends on.
        """
        return self.backend.wait_for_job_status(
            name, status=status or {COMPLETE}, timeout=timeout, polling_interval=polling_interval, callbacks=callbacks
        )

    def delete_job(self, name: str) -> None:
        """Stop every process of the job and remove it."""
        self.backend.delete_job(name)

    def suspend_job(self, name: str) -> None:
        self.backend.suspend_job(name)

    def resume_job(self, name: str) -> None:
        self.backend.resume_job(name)


__all__ = [
    "ContainerBackendConfig",
    "CustomTrainer",
    "CustomTrainerContainer",
    "Event",
    "LocalProcessBackendConfig",
    "Runtime",
    "RuntimeTrainer",
    "Step",
    "TrainJob",
    "TrainerClient",
    "backend_for",
]


def __getattr__(name: str) -> Any:
    # KubernetesBackendConfig lives with its backend; importing it here lazily keeps the local path light.
    if name == "KubernetesBackendConfig":
        from trainjob.backends.kubernetes.config import KubernetesBackendConfig

        return KubernetesBackendConfig
    raise AttributeError(name)
