"""SDK trainers and options as a TrainJob, the same for every backend.

``TrainerClient.train`` turns a :class:`~trainjob.sdk.types.CustomTrainer` or
:class:`~trainjob.sdk.types.CustomTrainerContainer` plus its options into a TrainJob (a dict in Kubernetes shape);
the backend then says how the function reaches the nodes (the local backend writes a script next to the job, the
Kubernetes backend ships it in the trainer's environment)::

    job = sdk_trainjob(CustomTrainer(func=train, num_nodes=2), "torch-distributed", "j1a2b3c4d5e6", [Name("x")], b)
    job["spec"]["trainer"]   # {"numNodes": 2}: the command is the backend's to add

A ``CustomTrainer``'s ``resources_per_node`` become requests and equal limits (the API server requires limits for
GPUs); ``gpu`` means ``nvidia.com/gpu``. A :class:`~trainjob.sdk.builtin_trainers.BuiltinTrainer` gets the
``spec.trainer`` the Kubeflow SDK gives it (:func:`~trainjob.sdk.builtin_trainers.builtin_trainer_fields`) and
only a runtime labelled ``trainer.kubeflow.org/framework: torchtune`` (:func:`check_builtin_runtime`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainjob.constants import API_VERSION, TORCHTUNE_FRAMEWORK, TRAINJOB_KIND
from trainjob.errors import ValidationError
from trainjob.sdk.builtin_trainers import BuiltinTrainer, builtin_trainer_fields
from trainjob.sdk.function_script import function_script
from trainjob.sdk.options import apply_options
from trainjob.sdk.trainer_checks import check_index_urls, check_requirements
from trainjob.sdk.types import CustomTrainer, CustomTrainerContainer, Runtime

SDKTrainer = CustomTrainer | CustomTrainerContainer | BuiltinTrainer

#: SDK resource names and the Kubernetes resource they mean.
RESOURCE_ALIASES = {"gpu": "nvidia.com/gpu"}


def check_trainer(trainer: Any) -> SDKTrainer:
    """``trainer`` if the SDK can run it, else ``ValidationError`` naming what can."""
    if isinstance(trainer, CustomTrainer | CustomTrainerContainer | BuiltinTrainer):
        return trainer
    raise ValidationError(
        "trainer", f"must be a CustomTrainer, a CustomTrainerContainer or a BuiltinTrainer, got {trainer!r}"
    )


def check_builtin_runtime(runtime: Runtime) -> None:
    """A BuiltinTrainer runs only on a torchtune runtime, as in the Kubeflow SDK (its message, our error type)."""
    if runtime.trainer.framework != TORCHTUNE_FRAMEWORK:
        raise ValidationError("runtime", f"BuiltinTrainer can't be used with {runtime} runtime")


def resources_per_node(resources: dict[str, Any] | None) -> dict[str, str]:
    """SDK resources (``{"cpu": 2, "gpu": 1, "memory": "8Gi"}``) as Kubernetes quantities."""
    return {RESOURCE_ALIASES.get(key, key): str(value) for key, value in (resources or {}).items()}


def trainer_fields(trainer: CustomTrainer | CustomTrainerContainer | None) -> dict[str, Any]:
    """``spec.trainer`` for what the trainer sets: image, node count, resources, env (not the command)."""
    fields: dict[str, Any] = {}
    if trainer is None:
        return fields
    if trainer.image is not None:
        fields["image"] = trainer.image
    if trainer.num_nodes is not None:
        fields["numNodes"] = trainer.num_nodes
    resources = resources_per_node(trainer.resources_per_node)
    if resources:
        fields["resourcesPerNode"] = {"requests": resources, "limits": dict(resources)}
    if trainer.env:
        fields["env"] = [{"name": key, "value": str(value)} for key, value in trainer.env.items()]
    return fields


def sdk_trainjob(
    trainer: SDKTrainer | None,
    runtime: str,
    name: str,
    options: Sequence[Any] | None,
    backend: Any,
    namespace: str | None = None,
    initializer: dict[str, Any] | None = None,
    source_initializer: Any = None,
) -> dict[str, Any]:
    """The TrainJob for ``trainer`` on ``runtime``, named ``name`` unless an option (``Name``) says otherwise;
    ``initializer`` is its ``spec.initializer`` (:func:`trainjob.sdk.initializers.initializer_spec`) and
    ``source_initializer`` the SDK ``Initializer`` it came from (a BuiltinTrainer's args name the dataset's path)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    job = {
        "apiVersion": API_VERSION,
        "kind": TRAINJOB_KIND,
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": runtime}, "trainer": (
            builtin_trainer_fields(trainer, source_initializer) if isinstance(trainer, BuiltinTrainer)
            else trainer_fields(trainer)
        )},
    }
    if initializer:
        job["spec"]["initializer"] = initializer
    return apply_options(job, options, trainer, backend)


@dataclass(frozen=True)
class TrainerFunction:
    """A ``CustomTrainer``'s function as every node runs it: the script (:mod:`trainjob.sdk.function_script`)
    and the packages it installs first, from ``pip_index_urls``."""

    script: str
    packages: list[str]
    pip_index_urls: list[str]


def trainer_function(trainer: CustomTrainer) -> TrainerFunction:
    """``trainer``'s function checked as :mod:`trainjob.sdk.trainer_checks` says (a ``def`` with its source, no
    lambdas, decorators dropped, only names it imports or defines, ``func_args`` that bind to its signature and are
    JSON) and its packages and index URLs checked again (the fields may have changed since it was made)."""
    return TrainerFunction(
        script=function_script(trainer.func, trainer.func_args),
        packages=check_requirements(trainer.packages_to_install),
        pip_index_urls=check_index_urls(trainer.pip_index_urls),
    )
