"""Names the operator and the client share: API groups, resources, labels, condition types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceRef:
    """One API resource: ``ResourceRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
TRAINJOBS = ResourceRef(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", "TrainJob")
TRAINING_RUNTIMES = ResourceRef(TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIMES = ResourceRef(
    TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
JOBSETS = ResourceRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
COSCHEDULING_PODGROUPS = ResourceRef("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
VOLCANO_PODGROUPS = ResourceRef("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
KUEUE_WORKLOADS = ResourceRef("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
#: Core objects an MPI job needs: its SSH key Secret and its hostfile ConfigMap.
SECRETS = ResourceRef("", "v1", "secrets", "Secret")
#: The operator Service's EndpointSlice, which its leader writes.
ENDPOINT_SLICES = ResourceRef("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
CONFIGMAPS = ResourceRef("", "v1", "configmaps", "ConfigMap")

#: Every resource the operator creates from a plan, by (apiVersion, kind).
RENDERED_RESOURCES = {
    (ref.api_version, ref.kind): ref
    for ref in (JOBSETS, COSCHEDULING_PODGROUPS, VOLCANO_PODGROUPS, SECRETS, CONFIGMAPS)
}
RUNTIME_KINDS = {ref.kind: ref for ref in (TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES)}

#: ``spec.managedBy`` of the jobs this operator reconciles (also when the field is absent).
CONTROLLER_NAME = "trainer.kubeflow.org/trainjob-controller"

JOB_NAME_LABEL = "trainer.kubeflow.org/trainjob-name"
ANCESTOR_STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: The JSON copy of the runtime a job was started from (kind, name, resourceVersion, labels, spec).
RUNTIME_SNAPSHOT_ANNOTATION = "trainer.kubeflow.org/runtime-snapshot"
#: Label JobSet puts on its Jobs and pods: the JobSet's name.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Label JobSet puts on the pods of each replicated job.
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

# TrainJob condition types.
COMPLETE = "Complete"
FAILED = "Failed"
SUSPENDED = "Suspended"
RUNNING = "Running"
FINISHED_CONDITIONS = (COMPLETE, FAILED)

#: Kubeflow Training Operator v1 (:mod:`trainjob.backends.kubernetes.pytorchjob`) and the core objects it creates.
PYTORCHJOBS = ResourceRef("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
PODS = ResourceRef("", "v1", "pods", "Pod")
SERVICES = ResourceRef("", "v1", "services", "Service")
CRDS = ResourceRef("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                   namespaced=False)
#: The label ``trainjob install`` puts on what it installs; a PyTorchJob CRD without it is the Training Operator's.
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "trainjob"
