"""The ``TrainJob`` resource: what a data scientist submits.

>>> job = TrainJob.from_dict({
...     "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
...     "metadata": {"name": "mnist"},
...     "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
... })
>>> job.spec.trainer.num_nodes, job.metadata.namespace, job.spec.runtime_ref.kind
(2, 'default', 'ClusterTrainingRuntime')

Both generations of the Kubeflow Trainer API load (docs/resources-and-runtimes.md has the table):

==========================================  ==========================================================
v2.1 (the seeds)                            v2.2 / v2.3 (today)
==========================================  ==========================================================
``spec.podTemplateOverrides``               ``spec.runtimePatches`` (keyed by ``manager``)
``spec.labels``, ``spec.annotations``       ``runtimePatches[].trainingRuntimeSpec.template.metadata``
``trainer.numProcPerNode: auto|cpu|gpu|N``  ``trainer.numProcPerNode: N`` (an integer)
(none)                                      ``spec.activeDeadlineSeconds``, ``status.trainerStatus``
==========================================  ==========================================================

``spec.activeDeadlineSeconds`` fails the job with reason ``DeadlineExceeded`` when it runs longer than that many
seconds; ``status.trainerStatus`` is the progress rank 0 reports (:mod:`trainjob.progress`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from trainjob.api.common import (
    API_GROUP,
    Condition,
    EnvVar,
    Int32,
    Int64,
    KubeModel,
    KubeResource,
    LocalObjectReference,
    NamespacedObjectMeta,
    NumNodes,
    NumProcPerNode,
    ResourceRequirements,
    validate_dns_label,
)
from trainjob.api.errors import quote

CLUSTER_TRAINING_RUNTIME = "ClusterTrainingRuntime"
TRAINING_RUNTIME = "TrainingRuntime"
MANAGED_BY_VALUES = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")


class RuntimeRef(KubeModel):
    """Which (Cluster)TrainingRuntime the job runs on."""

    name: Annotated[str, Field(min_length=1)]
    api_group: str = API_GROUP
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = CLUSTER_TRAINING_RUNTIME


class Trainer(KubeModel):
    """Overrides for the runtime's trainer (``node``) container and its node count."""

    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    num_nodes: NumNodes | None = None
    num_proc_per_node: NumProcPerNode | None = None
    resources_per_node: ResourceRequirements | None = None


class InitializerSource(KubeModel):
    """Where the dataset or model comes from; ``storageUri`` is passed as ``STORAGE_URI``."""

    storage_uri: str | None = None
    env: list[EnvVar] | None = None
    secret_ref: LocalObjectReference | None = None


class Initializer(KubeModel):
    dataset: InitializerSource | None = None
    model: InitializerSource | None = None


class TargetJob(KubeModel):
    name: str


class ContainerOverride(KubeModel):
    """Env and volume mounts added to a named container of the targeted jobs."""

    name: str
    env: list[EnvVar] | None = None
    volume_mounts: list[dict[str, Any]] | None = None


class PodTemplateOverrideMeta(KubeModel):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    name: str | None = None
    namespace: str | None = None
    finalizers: list[str] | None = None


class PodTemplateSpecOverride(KubeModel):
    service_account_name: str | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] | None = None
    volumes: list[dict[str, Any]] | None = None
    init_containers: list[ContainerOverride] | None = None
    containers: list[ContainerOverride] | None = None
    scheduling_gates: list[LocalObjectReference] | None = None
    image_pull_secrets: list[LocalObjectReference] | None = None


class PodTemplateOverride(KubeModel):
    """Pod template changes for the replicated jobs named in ``targetJobs``; later entries win."""

    target_jobs: Annotated[list[TargetJob], Field(min_length=1)]
    metadata: PodTemplateOverrideMeta | None = None
    spec: PodTemplateSpecOverride | None = None


class MetadataPatch(KubeModel):
    """Labels and annotations: all a runtime patch may change of an object's metadata."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ContainerPatch(ContainerOverride):
    """A v2.2+ container patch: env, volume mounts and the security context of a named container."""

    security_context: dict[str, Any] | None = None


class PodSpecPatch(KubeModel):
    """The pod spec fields a runtime patch may set (Kubeflow Trainer v2.2+); merged as ``podTemplateOverrides``."""

    service_account_name: str | None = None
    volumes: list[dict[str, Any]] | None = None
    init_containers: Annotated[list[ContainerPatch], Field(max_length=64)] | None = None
    containers: Annotated[list[ContainerPatch], Field(max_length=64)] | None = None
    image_pull_secrets: list[LocalObjectReference] | None = None
    security_context: dict[str, Any] | None = None
    node_selector: dict[str, str] | None = None
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] | None = None
    scheduling_gates: list[LocalObjectReference] | None = None
    termination_grace_period_seconds: Annotated[Int64, Field(ge=0)] | None = None


class PodTemplatePatch(KubeModel):
    metadata: MetadataPatch | None = None
    spec: PodSpecPatch | None = None


class JobSpecPatch(KubeModel):
    template: PodTemplatePatch | None = None


class JobTemplatePatch(KubeModel):
    metadata: MetadataPatch | None = None
    spec: JobSpecPatch | None = None


class ReplicatedJobPatch(KubeModel):
    """Patches for the runtime's replicated job ``name`` (``node``, ``dataset-initializer`` ...)."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    template: JobTemplatePatch | None = None


class JobSetSpecPatch(KubeModel):
    replicated_jobs: Annotated[list[ReplicatedJobPatch], Field(max_length=100)] | None = None


class JobSetTemplatePatch(KubeModel):
    metadata: MetadataPatch | None = None
    spec: JobSetSpecPatch | None = None


class TrainingRuntimeSpecPatch(KubeModel):
    template: JobSetTemplatePatch | None = None


class RuntimePatch(KubeModel):
    """One owner's changes to the job's runtime (Kubeflow Trainer v2.2+), applied in list order.

    ``manager`` names the owner (the SDK files its patch under ``trainer.kubeflow.org/kubeflow-sdk``); ``time`` is
    when it was last written."""

    manager: Annotated[str, Field(min_length=1, max_length=253)]
    time: str | None = None
    training_runtime_spec: TrainingRuntimeSpecPatch | None = None


class TrainJobSpec(KubeModel):
    runtime_ref: RuntimeRef
    trainer: Trainer | None = None
    initializer: Initializer | None = None
    #: v2.1: labels and annotations for the JobSet and its jobs (v2.2+: ``runtimePatches``).
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    #: v2.1 (v2.2+: ``runtimePatches``).
    pod_template_overrides: list[PodTemplateOverride] | None = None
    #: v2.2+.
    runtime_patches: Annotated[list[RuntimePatch], Field(max_length=16)] | None = None
    suspend: bool | None = None
    managed_by: str | None = None
    #: v2.2+ (an extension of this project before): fail the job after this many seconds of running.
    active_deadline_seconds: Annotated[Int64, Field(ge=1)] | None = None

    @field_validator("runtime_patches")
    @classmethod
    def _one_patch_per_manager(cls, patches: list[RuntimePatch] | None) -> list[RuntimePatch] | None:
        seen: set[str] = set()
        for patch in patches or []:
            if patch.manager in seen:
                raise ValueError(f"manager {quote(patch.manager)} has more than one patch; merge them into one")
            seen.add(patch.manager)
        return patches

    @field_validator("managed_by")
    @classmethod
    def _known_manager(cls, value: str | None) -> str | None:
        if value is not None and value not in MANAGED_BY_VALUES:
            raise ValueError(f"must be one of {', '.join(MANAGED_BY_VALUES)}, got {quote(value)}")
        return value


class JobStatus(KubeModel):
    """Pod counts of one replicated job (``node``, ``dataset-initializer`` ...)."""

    name: str
    ready: Annotated[Int32, Field(ge=0)] = 0
    succeeded: Annotated[Int32, Field(ge=0)] = 0
    failed: Annotated[Int32, Field(ge=0)] = 0
    active: Annotated[Int32, Field(ge=0)] = 0
    suspended: Annotated[Int32, Field(ge=0)] = 0


class Metric(KubeModel):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    value: Annotated[str, Field(min_length=1, max_length=64)]


class TrainerStatus(KubeModel):
    """Progress the trainer reports (Kubeflow Trainer v2.2+): percent done, seconds left, metrics as strings."""

    progress_percentage: Annotated[Int32, Field(ge=0, le=100)] | None = None
    estimated_remaining_seconds: Annotated[Int32, Field(ge=0)] | None = None
    metrics: Annotated[list[Metric], Field(max_length=256)] | None = None
    last_updated_time: str


class TrainJobStatus(KubeModel):
    conditions: list[Condition] | None = None
    jobs_status: list[JobStatus] | None = None
    trainer_status: TrainerStatus | None = None

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, if set: ``status.condition("Complete")``."""
        return next((c for c in self.conditions or [] if c.type == type_), None)


class TrainJobMeta(NamespacedObjectMeta):
    """TrainJob names become pod host names, so they must be DNS labels (at most 63 characters)."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_dns_label(name)


class TrainJob(KubeResource):
    """A training job: a runtime reference plus per-job overrides."""

    kind: Literal["TrainJob"] = "TrainJob"
    metadata: TrainJobMeta
    spec: TrainJobSpec
    status: TrainJobStatus | None = None

    @property
    def namespace(self) -> str:
        return self.metadata.namespace
