"""Options for ``TrainerClient.train(options=[...])``, with the Kubeflow SDK's names (``kubeflow.trainer.options``).

Each option is a callable that changes the TrainJob (a dict in Kubernetes shape) before it is created::

    from trainjob.options import Annotations, Labels, Name, RuntimePatch

    client.train(
        trainer=CustomTrainer(func=train, num_nodes=2),
        options=[Name("mnist-ddp"), Labels({"team": "vision"}),
                 RuntimePatch(training_runtime_spec={"template": {"spec": {"replicatedJobs": [
                     {"name": "node", "template": {"spec": {"template": {"spec": {
                         "nodeSelector": {"gpu": "a100"}}}}}}]}}})],
    )

Every option works on both backends: a local job keeps its name, labels and annotations, and its runtime patches
are applied to the plan (what a local process can use of them: the trainer container's env; the rest is rendered
for a cluster). ``TrainerCommand`` and ``TrainerArgs`` are for a ``CustomTrainerContainer`` (a ``CustomTrainer``
makes its own command from its function), as in the Kubeflow SDK. The patch classes (``ContainerPatch`` ...
``TrainingRuntimeSpecPatch``) build the same dicts with snake_case names; plain dicts in API shape work too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainjob.errors import ValidationError
from trainjob.sdk.types import CustomTrainerContainer

#: The manager the SDK's runtime patches are filed under, as in the Kubeflow SDK.
SDK_PATCH_MANAGER = "trainer.kubeflow.org/kubeflow-sdk"


def apply_options(job: dict[str, Any], options: Sequence[Any] | None, trainer: Any, backend: Any) -> dict[str, Any]:
    """``job`` changed by every option in order; ``ValidationError`` for something that is not an option."""
    for index, option in enumerate(options or ()):
        if not callable(option):
            raise ValidationError(
                f"options[{index}]", f"must be an option such as Name(...) or Labels(...), got {option!r}"
            )
        option(job, trainer, backend)
    return job


@dataclass
class Name:
    """The TrainJob's name (an RFC 1035 label) instead of a generated one."""

    name: str

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        job.setdefault("metadata", {})["name"] = self.name


@dataclass
class Labels:
    """Labels on the TrainJob (``metadata.labels``)."""

    labels: dict[str, str]

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        job.setdefault("metadata", {}).setdefault("labels", {}).update(self.labels)


@dataclass
class Annotations:
    """Annotations on the TrainJob (``metadata.annotations``)."""

    annotations: dict[str, str]

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        job.setdefault("metadata", {}).setdefault("annotations", {}).update(self.annotations)


def _container_trainer_only(option: str, trainer: Any) -> None:
    if trainer is not None and not isinstance(trainer, CustomTrainerContainer):
        raise ValidationError(
            "options", f"{option} can only be used with CustomTrainerContainer; a CustomTrainer runs its function "
            f"with the command it makes itself, got {type(trainer).__name__}",
        )


@dataclass
class TrainerCommand:
    """The trainer container's command (``spec.trainer.command``); for a ``CustomTrainerContainer``."""

    command: list[str]

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        _container_trainer_only("TrainerCommand", trainer)
        job.setdefault("spec", {}).setdefault("trainer", {})["command"] = list(self.command)


@dataclass
class TrainerArgs:
    """The trainer container's arguments (``spec.trainer.args``); for a ``CustomTrainerContainer``."""

    args: list[str]

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        _container_trainer_only("TrainerArgs", trainer)
        job.setdefault("spec", {}).setdefault("trainer", {})["args"] = list(self.args)


@dataclass
class ActiveDeadlineSeconds:
    """Fail the job once it has run this many seconds (``spec.activeDeadlineSeconds``)."""

    seconds: int

    def __post_init__(self) -> None:
        if type(self.seconds) is not int or self.seconds < 1:
            raise ValidationError("ActiveDeadlineSeconds.seconds", f"must be an integer >= 1, got {self.seconds!r}")

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        job.setdefault("spec", {})["activeDeadlineSeconds"] = self.seconds


@dataclass
class ContainerPatch:
    """Env, volume mounts and security context for a named container of the patched job."""

    name: str
    env: list[dict[str, Any]] | None = None
    volume_mounts: list[dict[str, Any]] | None = None
    security_context: dict[str, Any] | None = None


@dataclass
class PodSpecPatch:
    """The pod spec fields a runtime patch may set (Kubeflow Trainer v2.2+)."""

    service_account_name: str | None = None
    volumes: list[dict[str, Any]] | None = None
    init_containers: list[ContainerPatch] | None = None
    containers: list[ContainerPatch] | None = None
    image_pull_secrets: list[dict[str, Any]] | None = None
    security_context: dict[str, Any] | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] | None = None
    scheduling_gates: list[dict[str, Any]] | None = None
    termination_grace_period_seconds: int | None = None


@dataclass
class PodTemplatePatch:
    metadata: dict[str, Any] | None = None
    spec: PodSpecPatch | None = None


@dataclass
class JobSpecPatch:
    template: PodTemplatePatch | None = None


@dataclass
class JobTemplatePatch:
    metadata: dict[str, Any] | None = None
    spec: JobSpecPatch | None = None


@dataclass
class ReplicatedJobPatch:
    """Patches for one replicated job of the runtime (``node``, ``dataset-initializer`` ...)."""

    name: str
    template: JobTemplatePatch | None = None


@dataclass
class JobSetSpecPatch:
    replicated_jobs: list[ReplicatedJobPatch] | None = None


@dataclass
class JobSetTemplatePatch:
    metadata: dict[str, Any] | None = None
    spec: JobSetSpecPatch | None = None


@dataclass
class TrainingRuntimeSpecPatch:
    template: JobSetTemplatePatch | None = None


@dataclass
class RuntimePatch:
    """A patch of the job's runtime (``spec.runtimePatches``), filed under the SDK's manager."""

    training_runtime_spec: TrainingRuntimeSpecPatch | dict[str, Any] | None = None
    manager: str = dataclasses.field(default=SDK_PATCH_MANAGER, init=False, repr=False)

    def __call__(self, job: dict[str, Any], trainer: Any, backend: Any) -> None:
        patches = job.setdefault("spec", {}).setdefault("runtimePatches", [])
        patches.append(api_dict(self))


def api_dict(obj: Any) -> Any:
    """A patch dataclass as its API dict: camelCase names, unset fields left out; dicts and lists pass through."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is not None:
                head, *rest = f.name.split("_")
                out[head + "".join(part.title() for part in rest)] = api_dict(value)
        return out
    if isinstance(obj, list):
        return [api_dict(item) for item in obj]
    return obj


__all__ = [
    "ActiveDeadlineSeconds",
    "Annotations",
    "ContainerPatch",
    "JobSetSpecPatch",
    "JobSetTemplatePatch",
    "JobSpecPatch",
    "JobTemplatePatch",
    "Labels",
    "Name",
    "PodSpecPatch",
    "PodTemplatePatch",
    "ReplicatedJobPatch",
    "RuntimePatch",
    "TrainerArgs",
    "TrainerCommand",
    "TrainingRuntimeSpecPatch",
    "apply_options",
]
