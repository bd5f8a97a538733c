"""The API resources the operator and the client read and write (:class:`ResourceRef`), and the names only they use.

The labels, annotations and condition types trainjob shares with Kubeflow Trainer and JobSet are defined in
:mod:`trainjob.constants`; those the operator and the client use are imported here, so they can be imported from
either module.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainjob.constants import API_GROUP as API_GROUP
from trainjob.constants import API_VERSION_NAME as API_VERSION_NAME
from trainjob.constants import COMPLETE as COMPLETE
from trainjob.constants import COMPLETION_INDEX_LABEL as COMPLETION_INDEX_LABEL
from trainjob.constants import FAILED as FAILED
from trainjob.constants import FINISHED_STATUSES as FINISHED_STATUSES
from trainjob.constants import JOBSET_NAME_LABEL as JOBSET_NAME_LABEL
from trainjob.constants import REPLICATED_JOB_LABEL as REPLICATED_JOB_LABEL
from trainjob.constants import RUNNING as RUNNING
from trainjob.constants import RUNTIME_SNAPSHOT_ANNOTATION as RUNTIME_SNAPSHOT_ANNOTATION
from trainjob.constants import SUSPENDED as SUSPENDED
from trainjob.constants import TRAINJOB_NAME_LABEL as TRAINJOB_NAME_LABEL


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


TRAINJOBS = ResourceRef(API_GROUP, API_VERSION_NAME, "trainjobs", "TrainJob")
TRAINING_RUNTIMES = ResourceRef(API_GROUP, API_VERSION_NAME, "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIMES = ResourceRef(
    API_GROUP, API_VERSION_NAME, "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
JOBSETS = ResourceRef("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
COSCHEDULING_PODGROUPS = ResourceRef("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
VOLCANO_PODGROUPS = ResourceRef("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
KUEUE_WORKLOADS = ResourceRef("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
#: A JobSet's child Jobs: their pod counts tell the operator a job's pods are still coming up (:mod:`.pod_start`).
JOBS = ResourceRef("batch", "v1", "jobs", "Job")
#: Core objects an MPI job needs: its SSH key Secret and its hostfile ConfigMap.
SECRETS = ResourceRef("", "v1", "secrets", "Secret")
#: The operator Service's EndpointSlice, which its leader writes.
ENDPOINT_SLICES = ResourceRef("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
CONFIGMAPS = ResourceRef("", "v1", "configmaps", "ConfigMap")
#: The namespace ``trainjob install`` puts the operator, its keys and its settings in.
OPERATOR_NAMESPACE = "trainjob-system"
#: A job's ``/workspace`` claim when its initializers need one (:mod:`trainjob.backends.kubernetes.workspace`).
PERSISTENT_VOLUME_CLAIMS = ResourceRef("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
NAMESPACES = ResourceRef("", "v1", "namespaces", "Namespace", namespaced=False)
#: The operator replicas' leader election Lease.
LEASES = ResourceRef("coordination.k8s.io", "v1", "leases", "Lease")

#: Every resource the operator creates from a plan, by (apiVersion, kind).
RENDERED_RESOURCES = {
    (ref.api_version, ref.kind): ref
    for ref in (JOBSETS, COSCHEDULING_PODGROUPS, VOLCANO_PODGROUPS, SECRETS, CONFIGMAPS, PERSISTENT_VOLUME_CLAIMS)
}
RUNTIME_KINDS = {ref.kind: ref for ref in (TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES)}

#: ``spec.managedBy`` of the jobs this operator reconciles (also when the field is absent).
CONTROLLER_NAME = "trainer.kubeflow.org/trainjob-controller"

#: Kubeflow Training Operator v1 (:mod:`trainjob.backends.kubernetes.pytorchjob`) and the core objects it creates.
PYTORCHJOBS = ResourceRef("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
PODS = ResourceRef("", "v1", "pods", "Pod")
SERVICES = ResourceRef("", "v1", "services", "Service")
CRDS = ResourceRef("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                   namespaced=False)
#: The label ``trainjob install`` puts on what it installs; a PyTorchJob CRD without it is the Training Operator's.
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "trainjob"
