"""Kubeflow Training Operator v1 ``PyTorchJob`` (``kubeflow.org/v1``), read and checked so it can be converted.

Only what conversion needs is modelled; the pod templates are kept as dicts, checked like a runtime's
(:mod:`trainjob.api.podtemplate`). The fields, as the v1 operator defines them:

====================================  =====================================================================
field                                 meaning
====================================  =====================================================================
``spec.pytorchReplicaSpecs``          ``Master`` (at most one pod: node 0) and ``Worker`` (the other nodes);
                                      each has ``replicas`` (default 1), ``restartPolicy`` (``Always``,
                                      ``OnFailure``, ``Never``, ``ExitCode``) and a pod ``template``
``spec.nprocPerNode``                 processes per pod: ``auto``, ``cpu``, ``gpu`` or an integer (a string)
``spec.elasticPolicy``                ``minReplicas``, ``maxReplicas``, ``rdzvBackend`` (``c10d``, ``etcd``,
                                      ``etcd-v2``), ``rdzvHost``/``Port``/``Id``/``Conf``, ``standalone``,
                                      ``nProcPerNode`` (old spelling of ``nprocPerNode``), ``maxRestarts``,
                                      ``metrics``
``spec.runPolicy``                    ``cleanPodPolicy`` (``All``, ``Running``, ``None``),
                                      ``ttlSecondsAfterFinished``, ``activeDeadlineSeconds``,
                                      ``backoffLimit``, ``schedulingPolicy``, ``suspend``, ``managedBy``
====================================  =====================================================================

>>> job = PyTorchJob.from_dict({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "a"},
...     "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {"containers": [
...         {"name": "pytorch", "image": "img"}]}}}}}})
>>> job.spec.pytorch_replica_specs["Worker"].replicas
2
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, field_validator, model_validator

from trainjob.api.common import Int32, Int64, KubeModel, NamespacedObjectMeta, NumProcPerNode
from trainjob.api.errors import quote, validate_model
from trainjob.api.podtemplate import PodTemplate, check_job_template
from trainjob.constants import PYTORCHJOB_API_VERSION

API_VERSION = PYTORCHJOB_API_VERSION
KIND = "PyTorchJob"
MASTER = "Master"
WORKER = "Worker"
REPLICA_TYPES = (MASTER, WORKER)


def _check_pod_template(template: dict[str, Any]) -> dict[str, Any]:
    validate_model(PodTemplate, template)  # paths inside the pod template, then nulls dropped as for runtimes
    return check_job_template({"spec": {"template": template}})["spec"]["template"]


class RDZVConf(KubeModel):
    key: str | None = None
    value: str | None = None


class ElasticPolicy(KubeModel):
    min_replicas: Annotated[Int32, Field(ge=1)] | None = None
    max_replicas: Annotated[Int32, Field(ge=1)] | None = None
    rdzv_backend: Literal["c10d", "etcd", "etcd-v2"] | None = None
    rdzv_port: Annotated[Int32, Field(ge=1, le=65535)] | None = None
    rdzv_host: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: list[RDZVConf] | None = None
    standalone: bool | None = None
    n_proc_per_node: Annotated[Int32, Field(ge=1)] | None = None
    max_restarts: Annotated[Int32, Field(ge=0)] | None = None
    metrics: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})")
        return self


class SchedulingPolicy(KubeModel):
    min_available: Int32 | None = None
    queue: str | None = None
    min_resources: dict[str, Any] | None = None
    priority_class: str | None = None
    schedule_timeout_seconds: Int32 | None = None


class RunPolicy(KubeModel):
    clean_pod_policy: Literal["All", "Running", "None"] | None = None
    ttl_seconds_after_finished: Annotated[Int32, Field(ge=0)] | None = None
    active_deadline_seconds: Annotated[Int64, Field(ge=1)] | None = None
    backoff_limit: Annotated[Int32, Field(ge=0)] | None = None
    scheduling_policy: SchedulingPolicy | None = None
    suspend: bool | None = None
    managed_by: str | None = None


class ReplicaSpec(KubeModel):
    replicas: Annotated[Int32, Field(ge=0)] | None = None
    restart_policy: Literal["Always", "OnFailure", "Never", "ExitCode"] | None = None
    template: Annotated[dict[str, Any], AfterValidator(_check_pod_template)]


class PyTorchJobSpec(KubeModel):
    run_policy: RunPolicy | None = None
    elastic_policy: ElasticPolicy | None = None
    nproc_per_node: NumProcPerNode | None = None
    pytorch_replica_specs: dict[str, ReplicaSpec]

    @field_validator("pytorch_replica_specs")
    @classmethod
    def _master_and_workers(cls, specs: dict[str, ReplicaSpec]) -> dict[str, ReplicaSpec]:
        unknown = [name for name in specs if name not in REPLICA_TYPES]
        if unknown:
            raise ValueError(
                f"unknown replica type {quote(unknown[0])}; a PyTorchJob has Master (node 0) and Worker replicas"
            )
        if not specs:
            raise ValueError("needs a Master or a Worker replica spec (Master: node 0, Worker: the other nodes)")
        master = specs.get(MASTER)
        if master is not None and master.replicas not in (None, 1):
            raise ValueError(
                f"Master replicas must be 1 (the Master is node 0), got {master.replicas}; "
                "put the other nodes under Worker"
            )
        return specs


class PyTorchJob(KubeModel):
    """A ``kubeflow.org/v1`` PyTorchJob; ``status`` is accepted and ignored."""

    api_version: Literal["kubeflow.org/v1"] = API_VERSION
    kind: Literal["PyTorchJob"] = KIND
    metadata: NamespacedObjectMeta
    spec: PyTorchJobSpec
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name
