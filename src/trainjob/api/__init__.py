"""Kubeflow Trainer ``trainer.kubeflow.org/v1alpha1`` resources: typed, validated, loaded from and dumped to YAML.

>>> from trainjob.api import load_resources, dump_yaml
>>> job, = load_resources("job.yaml")                     # doctest: +SKIP
>>> job.spec.trainer.num_nodes                            # doctest: +SKIP
4
>>> print(dump_yaml([job]))                               # doctest: +SKIP
"""

from trainjob.api.common import (
    API_GROUP,
    API_VERSION,
    Condition,
    EnvVar,
    EnvVarSource,
    FieldRef,
    KubeModel,
    ObjectMeta,
    ResourceRequirements,
)
from trainjob.api.io import Resource, dump_yaml, load_resources, read_documents, resource_from_dict
from trainjob.api.runtime import (
    ClusterTrainingRuntime,
    CoschedulingPolicy,
    JobSetSpec,
    JobSetTemplate,
    MLPolicy,
    MPIMLPolicy,
    PodGroupPolicy,
    ReplicatedJob,
    Runtime,
    TorchElasticPolicy,
    TorchMLPolicy,
    TrainingRuntime,
    TrainingRuntimeSpec,
    VolcanoPolicy,
)
from trainjob.api.trainjob import (
    Initializer,
    InitializerSource,
    JobStatus,
    PodTemplateOverride,
    RuntimePatch,
    RuntimeRef,
    Trainer,
    TrainerStatus,
    TrainJob,
    TrainJobSpec,
    TrainJobStatus,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "ClusterTrainingRuntime",
    "Condition",
    "CoschedulingPolicy",
    "EnvVar",
    "EnvVarSource",
    "FieldRef",
    "Initializer",
    "InitializerSource",
    "JobSetSpec",
    "JobSetTemplate",
    "JobStatus",
    "KubeModel",
    "MLPolicy",
    "MPIMLPolicy",
    "ObjectMeta",
    "PodGroupPolicy",
    "PodTemplateOverride",
    "RuntimePatch",
    "ReplicatedJob",
    "Resource",
    "ResourceRequirements",
    "Runtime",
    "RuntimeRef",
    "TorchElasticPolicy",
    "TorchMLPolicy",
    "TrainJob",
    "TrainJobSpec",
    "TrainJobStatus",
    "TrainerStatus",
    "Trainer",
    "TrainingRuntime",
    "TrainingRuntimeSpec",
    "VolcanoPolicy",
    "dump_yaml",
    "load_resources",
    "read_documents",
    "resource_from_dict",
]
