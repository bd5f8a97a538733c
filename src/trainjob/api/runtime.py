"""``TrainingRuntime`` (namespaced) and ``ClusterTrainingRuntime``: the templates platform engineers publish.

A runtime holds the ML policy (``torch``: processes per node and elastic range; ``mpi``), the gang-scheduling
policy (``coscheduling`` or ``volcano``) and a JobSet template whose ``node`` job runs the trainer.

>>> rt = ClusterTrainingRuntime.from_dict({
...     "metadata": {"name": "torch-distributed"},
...     "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
...              "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}}},
... })
>>> rt.spec.ml_policy.torch.num_proc_per_node
'auto'
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, field_validator, model_validator

from trainjob.api.common import (
    MAX_NUM_PROC_PER_NODE,
    Int32,
    KubeModel,
    KubeResource,
    NamespacedObjectMeta,
    NumNodes,
    NumProcPerNode,
    ObjectMeta,
    validate_dns_label,
)
from trainjob.api.errors import shorten
from trainjob.api.podtemplate import check_job_template
from trainjob.constants import TRAINER_CONTAINER


class TorchElasticPolicy(KubeModel):
    """Elastic training: the job runs with any node count in ``minNodes..maxNodes`` (``PET_NNODES=min:max``).

    ``minNodes`` defaults to 1, ``maxRestarts`` (restarts of the worker group, ``PET_MAX_RESTARTS``) to 0.
    """

    max_nodes: NumNodes
    min_nodes: NumNodes | None = None
    max_restarts: Annotated[Int32, Field(ge=0)] | None = None
    #: Autoscaling metrics (HPA ``MetricSpec`` objects); kept, not acted upon.
    metrics: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_nodes is not None and self.min_nodes > self.max_nodes:
            raise ValueError(f"minNodes ({self.min_nodes}) must be <= maxNodes ({self.max_nodes})")
        return self


class EnvInjectionTarget(KubeModel):
    """Containers of replicated job ``jobName`` (other than ``node``) that get the trainer's ``PET_*`` env too."""

    job_name: Annotated[str, Field(min_length=1, max_length=253)]
    container_names: Annotated[list[Annotated[str, Field(max_length=63)]], Field(min_length=1, max_length=8)]

    @field_validator("container_names")
    @classmethod
    def _not_the_trainer(cls, names: list[str]) -> list[str]:
        if TRAINER_CONTAINER in names:
            raise ValueError(f"must not include {TRAINER_CONTAINER!r}: the trainer container always gets the PET_* env")
        return names


class EnvInjection(KubeModel):
    targets: Annotated[list[EnvInjectionTarget], Field(max_length=16)] | None = None


class TorchMLPolicy(KubeModel):
    """v2.1: ``numProcPerNode`` (default ``auto``) and the optional ``elasticPolicy``; v2.3: ``envInjection``
    (``torch: {}`` is the v2.2+ runtime, whose processes per node come from ``trainer.numProcPerNode``)."""

    num_proc_per_node: NumProcPerNode | None = None
    elastic_policy: TorchElasticPolicy | None = None
    env_injection: EnvInjection | None = None


class MPIMLPolicy(KubeModel):
    num_proc_per_node: Annotated[int, Field(ge=1, le=MAX_NUM_PROC_PER_NODE)] | None = None
    mpi_implementation: Literal["OpenMPI", ""] | None = None
    ssh_auth_mount_path: str | None = None
    run_launcher_as_node: bool | None = None


class FluxMLPolicy(KubeModel):
    """Kubeflow Trainer v2.2+'s Flux HPC policy (loaded and checked; no plugin runs it here)."""

    num_proc_per_node: Annotated[int, Field(ge=1, le=MAX_NUM_PROC_PER_NODE)] | None = None


class EmptyMLPolicy(KubeModel):
    """``jax: {}`` and ``xgboost: {}`` (Kubeflow Trainer v2.2+; loaded and checked, no plugin runs them here)."""


class MLPolicy(KubeModel):
    """Default node count plus at most one framework policy (``torch``, ``mpi``; v2.2+: ``flux``, ``jax``,
    ``xgboost``, which load and validate but have no plugin to run them)."""

    num_nodes: NumNodes | None = None
    torch: TorchMLPolicy | None = None
    mpi: MPIMLPolicy | None = None
    flux: FluxMLPolicy | None = None
    jax: EmptyMLPolicy | None = None
    xgboost: EmptyMLPolicy | None = None

    @model_validator(mode="after")
    def _one_policy_and_no_fixed_size_when_elastic(self) -> Self:
        chosen = [name for name in ("torch", "mpi", "flux", "jax", "xgboost") if getattr(self, name) is not None]
        if len(chosen) > 1:
            raise ValueError(f"only one of torch, mpi, flux, jax and xgboost can be set, got {', '.join(chosen)}")
        if self.num_nodes is not None and self.torch is not None and self.torch.elastic_policy is not None:
            raise ValueError(
                "numNodes must not be set together with torch.elasticPolicy "
                "(the node count comes from elasticPolicy minNodes..maxNodes)"
            )
        return self


class CoschedulingPolicy(KubeModel):
    """Gang scheduling with the scheduler-plugins coscheduling plugin; timeout defaults to 60 s."""

    schedule_timeout_seconds: Annotated[Int32, Field(ge=1)] | None = None


class VolcanoNetworkTopology(KubeModel):
    mode: Literal["hard", "soft"] | None = None
    highest_tier_allowed: Annotated[Int32, Field(ge=0)] | None = None


class VolcanoPolicy(KubeModel):
    """Gang scheduling with Volcano; the queue comes from the ``scheduling.volcano.sh/queue-name`` annotation."""

    network_topology: VolcanoNetworkTopology | None = None


class PodGroupPolicy(KubeModel):
    coscheduling: CoschedulingPolicy | None = None
    volcano: VolcanoPolicy | None = None

    @model_validator(mode="after")
    def _one_scheduler(self) -> Self:
        if self.coscheduling is not None and self.volcano is not None:
            raise ValueError("only one of coscheduling and volcano can be set")
        return self


class ReplicatedJob(KubeModel):
    """One replicated job of the JobSet template; ``template`` is a ``batch/v1`` JobTemplateSpec kept as a dict,
    checked by :func:`~trainjob.api.podtemplate.check_job_template` (its ``null`` fields dropped)."""

    name: str
    template: Annotated[dict[str, Any], AfterValidator(check_job_template)]
    replicas: Annotated[Int32, Field(ge=1)] | None = None
    group_name: str | None = None
    depends_on: list[dict[str, Any]] | None = None

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        return validate_dns_label(name)


class JobSetSpec(KubeModel):
    """The JobSet spec of a runtime: replicated jobs are checked, the other JobSet settings are passed through."""

    replicated_jobs: Annotated[list[ReplicatedJob], Field(min_length=1)]
    network: dict[str, Any] | None = None
    success_policy: dict[str, Any] | None = None
    failure_policy: dict[str, Any] | None = None
    startup_policy: dict[str, Any] | None = None
    coordinator: dict[str, Any] | None = None
    managed_by: str | None = None
    suspend: bool | None = None
    ttl_seconds_after_finished: Annotated[Int32, Field(ge=0)] | None = None
    #: JobSet's per-job PersistentVolumeClaims (Kubeflow's torchtune runtimes share one between their steps).
    volume_claim_policies: list[dict[str, Any]] | None = None

    @field_validator("replicated_jobs")
    @classmethod
    def _unique_names(cls, jobs: list[ReplicatedJob]) -> list[ReplicatedJob]:
        counts = Counter(job.name for job in jobs)
        duplicates = sorted(name for name, count in counts.items() if count > 1)
        if duplicates:
            raise ValueError(
                f"replicated job names must be unique, got {shorten(', '.join(duplicates))} more than once"
            )
        return jobs


class TemplateMeta(KubeModel):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class JobSetTemplate(KubeModel):
    metadata: TemplateMeta | None = None
    spec: JobSetSpec


class TrainingRuntimeSpec(KubeModel):
    ml_policy: MLPolicy | None = None
    pod_group_policy: PodGroupPolicy | None = None
    template: JobSetTemplate


class TrainingRuntime(KubeResource):
    """A namespaced runtime; a TrainJob uses it with ``runtimeRef.kind: TrainingRuntime`` in the same namespace."""

    kind: Literal["TrainingRuntime"] = "TrainingRuntime"
    metadata: NamespacedObjectMeta
    spec: TrainingRuntimeSpec


class ClusterTrainingRuntime(KubeResource):
    """A cluster-wide runtime, the default kind of ``runtimeRef``."""

    kind: Literal["ClusterTrainingRuntime"] = "ClusterTrainingRuntime"
    metadata: ObjectMeta
    spec: TrainingRuntimeSpec


#: Either kind of runtime.
Runtime = TrainingRuntime | ClusterTrainingRuntime
