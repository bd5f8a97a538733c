"""The backend-neutral plan a TrainJob plus its runtime resolve into.

Every backend consumes a :class:`Plan`: the local backend starts one node process per pod of the trainer pod set,
the Kubernetes backend renders a JobSet (and a PodGroup) from it. Nothing in here knows about either backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainjob.constants import (
    COMPLETION_INDEX_ANNOTATION,
    COMPLETION_INDEX_FIELD_PATH,
    MASTER_PORT,
    TRAINER_JOB,
    TRAINER_STEP,
)

__all__ = [
    "COMPLETION_INDEX_ANNOTATION",
    "COMPLETION_INDEX_FIELD_PATH",
    "Container",
    "ContainerPort",
    "ElasticPolicy",
    "EnvVar",
    "MPIPolicy",
    "Plan",
    "PodGroupPolicy",
    "PodSet",
    "Resources",
]


@dataclass
class EnvVar:
    """One entry of a plan container's env: a literal ``value`` or a Kubernetes ``value_from`` source.

    The plan's own form, made from (and rendered back into) Kubernetes env dicts; not the API model
    :class:`trainjob.api.EnvVar` of a TrainJob's ``spec.trainer.env``
    (:func:`~trainjob.runtime.template.env_from_api` converts).
    """

    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None

    def is_completion_index(self) -> bool:
        ref = (self.value_from or {}).get("fieldRef") or {}
        return ref.get("fieldPath") == COMPLETION_INDEX_FIELD_PATH


@dataclass
class ContainerPort:
    container_port: int
    name: str | None = None
    protocol: str = "TCP"


@dataclass
class Resources:
    """Requests and limits as Kubernetes quantity strings (``"2500m"``, ``"16Gi"``, ``"nvidia.com/gpu": "2"``)."""

    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    #: Dynamic resource allocation claims (``[{"name": ...}]``), passed through to the pod.
    claims: list[dict[str, Any]] = field(default_factory=list)

    def effective(self) -> dict[str, str]:
        """Per resource, the request when there is one, else the limit (what the scheduler reserves)."""
        return {**self.limits, **self.requests}


@dataclass
class Container:
    name: str
    image: str | None = None
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: list[EnvVar] = field(default_factory=list)
    ports: list[ContainerPort] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    working_dir: str | None = None

    def env_dict(self, index: int | None = None) -> dict[str, str]:
        """Literal env as a dict; completion-index references resolve to ``index`` when one is given."""
        out: dict[str, str] = {}
        for var in self.env:
            if var.value is not None:
                out[var.name] = var.value
            elif index is not None and var.is_completion_index():
                out[var.name] = str(index)
        return out


@dataclass
class PodSet:
    """A group of identical pods: one replicated job of the JobSet (``node`` for the trainer)."""

    name: str
    count: int
    containers: list[Container]
    #: ``trainer``, ``dataset-initializer``, ``model-initializer`` ... (label trainjob-ancestor-step)
    ancestor_step: str | None = None
    #: The replicated job's template as given by the runtime, kept so rendering loses no field we do not model.
    template: dict[str, Any] = field(default_factory=dict)
    #: Jobs in the replicated job; each runs ``count // replicas`` pods (the trainer: one job of all nodes).
    replicas: int = 1
    #: Pod sets that must reach a status first: ``[{"name": "dataset-initializer", "status": "Complete"}]``.
    depends_on: list[dict[str, Any]] = field(default_factory=list)
    #: JobSet ``groupName`` of the replicated job, when the runtime sets one.
    group_name: str | None = None

    def container(self, name: str | None = None) -> Container:
        """The named container, or the first one (the trainer's is called ``node``)."""
        if name is None:
            return self.containers[0]
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass
class ElasticPolicy:
    min_nodes: int
    max_nodes: int
    max_restarts: int


@dataclass
class PodGroupPolicy:
    """Gang scheduling: all ``min_member`` pods start together or none does."""

    scheduler: str  # "coscheduling" | "volcano"
    min_member: int
    min_resources: dict[str, str] = field(default_factory=dict)
    schedule_timeout_seconds: int | None = None
    queue: str | None = None
    #: Plugin-specific extras (volcano networkTopology ...).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MPIPolicy:
    """An MPI job: a ``launcher`` pod runs ``mpirun`` over ``hosts``, each with ``slots`` processes.

    ``hosts`` are the hostfile's lines in order, DNS names of the pods that run ranks: with ``run_launcher_as_node``
    the launcher first, then every ``node`` pod (``{job}-node-0-{i}.{job}``).
    """

    implementation: str  # "OpenMPI"
    slots: int
    ssh_auth_mount_path: str
    run_launcher_as_node: bool
    hosts: list[str] = field(default_factory=list)

    def hostfile(self) -> str:
        """The hostfile ``mpirun`` reads: ``{host} slots={slots}`` per line."""
        return "".join(f"{host} slots={self.slots}\n" for host in self.hosts)


@dataclass
class Plan:
    """Everything a backend needs to run one TrainJob."""

    job_name: str
    namespace: str
    runtime_kind: str
    runtime_name: str
    pod_sets: list[PodSet]
    #: Trainer pods to start; for an elastic job ``elastic.max_nodes`` (torchrun accepts ``min_nodes`` and up);
    #: for MPI the hosts of the hostfile.
    num_nodes: int
    #: Processes ``torchrun`` starts on each node (``PET_NPROC_PER_NODE``); 1 for plainml; MPI: slots per host.
    num_proc_per_node: int
    ml_policy: str  # "torch" | "plainml" | "mpi"
    elastic: ElasticPolicy | None = None
    #: Set for ``mlPolicy.mpi`` runtimes: the launcher, hosts and slots.
    mpi: MPIPolicy | None = None
    pod_group: PodGroupPolicy | None = None
    master_port: int = MASTER_PORT
    suspend: bool = False
    active_deadline_seconds: int | None = None
    managed_by: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    #: The JobSet spec of the runtime (minus replicatedJobs, which live in pod_sets), for rendering.
    jobset_spec: dict[str, Any] = field(default_factory=dict)
    #: Names of the plugins that ran, in order.
    plugins: list[str] = field(default_factory=list)

    TRAINER_POD_SET = TRAINER_JOB

    def trainer(self) -> PodSet:
        """The trainer pod set: the one labelled ``trainer`` (an MPI job's ``launcher``), else ``node``."""
        for ps in self.pod_sets:
            if ps.ancestor_step == TRAINER_STEP:
                return ps
        for ps in self.pod_sets:
            if ps.name == self.TRAINER_POD_SET:
                return ps
        raise KeyError(f"plan for {self.job_name} has no trainer pod set")

    def master_addr(self) -> str:
        """The DNS name of the first trainer pod: ``{job}-node-0-0.{job}``."""
        return f"{self.job_name}-{self.trainer().name}-0-0.{self.job_name}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
