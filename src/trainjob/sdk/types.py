"""The SDK's value types, with the Kubeflow SDK's names and fields so code ports by changing one import.

>>> from trainjob.sdk.types import CustomTrainer
>>> def train(epochs: int) -> None: ...
>>> CustomTrainer(func=train, func_args={"epochs": 2}, num_nodes=2).num_nodes
2

:class:`TrainJob` carries the Kubeflow fields (``name``, ``runtime``, ``steps``, ``num_nodes``,
``creation_timestamp``, ``status``) plus what this project adds (reason, message, processes per node, timings,
training progress), all with defaults so Kubeflow-style construction keeps working.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainjob.constants import COMPLETE as COMPLETE
from trainjob.constants import CREATED as CREATED
from trainjob.constants import FAILED as FAILED
from trainjob.constants import FINISHED_STATUSES, JOB_STATUSES
from trainjob.constants import QUEUED as QUEUED
from trainjob.constants import RUNNING as RUNNING
from trainjob.constants import SUSPENDED as SUSPENDED
from trainjob.progress import Progress as Progress

#: Job statuses, as in the Kubeflow SDK, plus ``Suspended`` and ``Queued`` (waiting in the local queue for resources).
STATUSES = JOB_STATUSES
TERMINAL_STATUSES = frozenset(FINISHED_STATUSES)

UNKNOWN = "Unknown"
DEFAULT_PIP_INDEX_URLS = ("https://pypi.org/simple",)


@dataclass
class CustomTrainer:
    """A self-contained training function, shipped as source and called with ``**func_args`` on every rank.

    ``image`` replaces the runtime's trainer image (on a cluster, and for local jobs with
    ``ContainerBackendConfig``, whose nodes run in it; process nodes run in this Python environment).
    ``resources_per_node`` takes ``cpu``, ``memory``, ``gpu`` (meaning ``nvidia.com/gpu``) or any Kubernetes
    resource name; ``packages_to_install`` (PEP 508 requirements, never pip options) go into a per-job
    environment that still sees the installed torch, from ``pip_index_urls`` (the first is the index, the others
    extra indexes). Both are checked here, the function when the trainer is submitted
    (:mod:`trainjob.sdk.trainer_checks`)::

        CustomTrainer(func=train, num_nodes=2, resources_per_node={"cpu": 1}, packages_to_install=["tqdm"])
    """

    func: Callable[..., Any]
    func_args: dict[str, Any] | None = None
    image: str | None = None
    packages_to_install: list[str] | None = None
    pip_index_urls: list[str] = field(default_factory=lambda: list(DEFAULT_PIP_INDEX_URLS))
    num_nodes: int | None = None
    resources_per_node: dict[str, Any] | None = None
    env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        from trainjob.sdk.trainer_checks import check_index_urls, check_requirements

        if self.packages_to_install is not None:
            self.packages_to_install = check_requirements(self.packages_to_install)
        self.pip_index_urls = check_index_urls(self.pip_index_urls)


@dataclass
class CustomTrainerContainer:
    """A trainer image that holds the whole training program: the runtime's trainer runs ``image`` (its command and
    arguments come from the image, or the ``TrainerCommand`` / ``TrainerArgs`` options)::

        client.train(trainer=CustomTrainerContainer(image="ghcr.io/me/train:1", num_nodes=2),
                     options=[TrainerCommand(["torchrun", "/app/train.py"])])

    Local jobs do not run images: they need the command (the ``TrainerCommand`` option) and run it here.
    """

    image: str
    num_nodes: int | None = None
    resources_per_node: dict[str, Any] | None = None
    env: dict[str, str] | None = None


@dataclass
class RuntimeTrainer:
    """What a runtime's trainer looks like: framework, image, default node count and devices per node."""

    trainer_type: str
    framework: str
    image: str
    num_nodes: int = 1
    device: str = UNKNOWN
    device_count: str = UNKNOWN
    command: tuple[str, ...] = ()


@dataclass
class Runtime:
    """A (Cluster)TrainingRuntime as the SDK shows it; pass one to ``TrainerClient.train(runtime=...)``."""

    name: str
    trainer: RuntimeTrainer
    pretrained_model: str | None = None


@dataclass
class Step:
    """One pod of a job (``node-0``, ``node-1`` ...) and its status."""

    name: str
    status: str | None
    pod_name: str
    device: str = UNKNOWN
    device_count: str = UNKNOWN


@dataclass
class TrainJob:
    """A job as the SDK and the CLI show it; ``resource`` is the full TrainJob in Kubernetes shape."""

    name: str
    runtime: Runtime | None
    steps: list[Step]
    num_nodes: int
    creation_timestamp: datetime
    status: str = UNKNOWN
    reason: str | None = None
    message: str | None = None
    num_proc_per_node: int | None = None
    start_time: datetime | None = None
    completion_time: datetime | None = None
    restarts: int = 0
    progress: Progress | None = None
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def runtime_name(self) -> str:
        return self.runtime.name if self.runtime else UNKNOWN


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What a list of jobs shows of one job (``trainjob list``, the dashboard); times are Unix seconds.

    ``eta_seconds`` is set for an active job only; ``percent`` is what ``update_trainjob_status`` reported."""

    name: str
    status: str
    num_nodes: int
    num_proc_per_node: int | None
    runtime: str
    created: float
    started: float | None = None
    finished: float | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    eta_seconds: float | None = None
    percent: float | None = None

    @classmethod
    def of(cls, job: TrainJob) -> JobSummary:
        """The summary of an SDK job."""
        progress = job.progress
        loss = progress.metrics.get("loss") if progress else None
        return cls(
            name=job.name, status=job.status, num_nodes=job.num_nodes, num_proc_per_node=job.num_proc_per_node,
            runtime=job.runtime_name, created=job.creation_timestamp.timestamp(),
            started=job.start_time.timestamp() if job.start_time else None,
            finished=job.completion_time.timestamp() if job.completion_time else None,
            step=progress.step if progress else None, total_steps=progress.total_steps if progress else None,
            loss=loss, eta_seconds=progress.eta_seconds if progress else None,
            percent=progress.percent if progress else None,
        )


@dataclass
class Event:
    """Something that happened to a job or one of its nodes."""

    involved_object_kind: str
    involved_object_name: str
    message: str
    reason: str
    event_time: datetime
    type: str = "Normal"


@dataclass
class LogLine:
    """One line of a node's output; ``rank`` is the global rank when the line came from a training process,
    ``time`` when it was written (Unix seconds) when the backend knows."""

    node: int
    rank: int | None
    text: str
    time: float | None = None

    def __str__(self) -> str:
        where = f"node-{self.node}" if self.rank is None else f"node-{self.node}/rank-{self.rank}"
        return f"{where} | {self.text}"
