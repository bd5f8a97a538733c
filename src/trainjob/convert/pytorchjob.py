"""Kubeflow Training Operator v1 ``PyTorchJob`` -> ``TrainJob`` (+ a namespaced ``TrainingRuntime`` when needed).

>>> conversion = convert_pytorchjob({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
...     "metadata": {"name": "mnist"}, "spec": {"pytorchReplicaSpecs": {
...         "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": "img",
...             "command": ["torchrun", "--nproc_per_node=2", "--nnodes=$(WORLD_SIZE)", "train.py"]}]}}},
...         "Worker": {"replicas": 3, "template": {"spec": {"containers": [{"name": "pytorch", "image": "img",
...             "command": ["torchrun", "--nproc_per_node=2", "--nnodes=$(WORLD_SIZE)", "train.py"]}]}}}}}})
>>> trainer = conversion.trainjob.spec.trainer
>>> trainer.num_nodes, trainer.num_proc_per_node, trainer.command, conversion.runtime
(4, 2, ['torchrun', 'train.py'], None)

=================================  ==================================================================================
PyTorchJob                         TrainJob / TrainingRuntime
=================================  ==================================================================================
``metadata``                       the TrainJob's name, namespace, labels and annotations; annotation
                                   ``trainjob/converted-from: kubeflow.org/v1 PyTorchJob`` records the origin
Master + Worker ``replicas``       ``trainer.numNodes`` (Master is node 0); elastic: the runtime's
                                   ``elasticPolicy`` decides, ``minReplicas..maxReplicas``
``nprocPerNode``, ``--nproc-per-   ``trainer.numProcPerNode`` (the command's option wins, as in torchrun); a plain
node`` in the command              ``python train.py`` runs one process per node, as v1 ran it
container ``command``/``args``     ``trainer.command`` (:mod:`trainjob.convert.container_command`)
container ``image``, ``env``,      ``trainer.image``, ``trainer.env``, ``trainer.resourcesPerNode``
``resources``
the rest of the pod template       a TrainingRuntime of the job's name and namespace: volumes, mounts, tolerations,
                                   node selector, affinity, security context, scheduler, pod labels ...
``elasticPolicy``                  runtime ``mlPolicy.torch.elasticPolicy`` (minNodes, maxNodes, maxRestarts, metrics)
``restartPolicy: OnFailure``,      runtime JobSet ``failurePolicy.maxRestarts`` = ``backoffLimit`` (default 6, as
``backoffLimit``                   for a Job): a failed node restarts the whole group
``runPolicy``                      ``activeDeadlineSeconds``, ``suspend`` -> TrainJob spec;
                                   ``ttlSecondsAfterFinished`` -> annotation ``trainjob/ttl-seconds-after-finished``
=================================  ==================================================================================

Anything else (``cleanPodPolicy``, ``schedulingPolicy``, rendezvous host/port/conf, differences between the
Master's and the Workers' templates ...) is named in :attr:`Conversion.warnings`; the TrainJob keeps them in
annotation ``trainjob/conversion-warnings`` so they are reported when it is submitted.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from trainjob.api.common import EnvVar, ResourceRequirements
from trainjob.api.errors import quote, validate_model
from trainjob.api.runtime import TrainingRuntime
from trainjob.api.trainjob import Trainer, TrainJob
from trainjob.constants import API_VERSION as TRAINER_API_VERSION
from trainjob.constants import (
    CONVERSION_WARNINGS_ANNOTATION,
    CONVERTED_FROM_ANNOTATION,
    TRAINER_CONTAINER,
    TRAINER_JOB,
    TTL_ANNOTATION,
)
from trainjob.convert.container_command import ContainerCommand, read_container_command
from trainjob.convert.pytorchjob_api import API_VERSION, KIND, MASTER, WORKER, PyTorchJob, ReplicaSpec
from trainjob.errors import ValidationError
from trainjob.runtime.catalog import DEFAULT_RUNTIME

#: What a converted TrainJob (and its runtime) was converted from, in its ``trainjob/converted-from`` annotation.
CONVERTED_FROM = f"{API_VERSION} {KIND}"
#: The container v1 runs as the trainer; the first container when none has this name.
PYTORCH_CONTAINER = "pytorch"
#: Restarts of the JobSet for ``restartPolicy: OnFailure`` without ``backoffLimit``: a Job's default backoffLimit.
DEFAULT_MAX_RESTARTS = 6
#: The rendezvous port of the torch runtime (``PET_MASTER_PORT``).
RUNTIME_MASTER_PORT = "29500"
_TRAINER_FIELDS = ("name", "image", "command", "args", "env", "resources")
_RESTARTING = ("OnFailure", "Always", "ExitCode")


@dataclass
class Conversion:
    """A converted PyTorchJob: the TrainJob, its TrainingRuntime (``None`` when a built-in one does) and what
    could not be carried over."""

    source_name: str
    trainjob: TrainJob
    runtime: TrainingRuntime | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def resources(self) -> list[TrainJob | TrainingRuntime]:
        """The runtime (when there is one) first, then the TrainJob: the order to apply them in."""
        return [*([self.runtime] if self.runtime else []), self.trainjob]

    @property
    def note(self) -> str:
        return f"converted from {CONVERTED_FROM} {self.source_name}"


def convert_pytorchjob(data: Any) -> Conversion:
    """Convert a PyTorchJob (a dict as loaded from YAML); :class:`ValidationError` names the field at fault."""
    job = validate_model(PyTorchJob, data)
    return _Converter(job).convert()


class _Converter:
    def __init__(self, job: PyTorchJob) -> None:
        self.job = job
        self.spec = job.spec
        self.warnings: list[str] = []

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(f"{path}: {message}")

    def convert(self) -> Conversion:
        replicas = self.spec.pytorch_replica_specs
        master, worker = replicas.get(MASTER), replicas.get(WORKER)
        primary_type = MASTER if master is not None else WORKER
        primary = master or worker
        assert primary is not None  # the model requires one of them
        num_nodes = (1 if master is not None else 0) + (_replicas(worker) if worker is not None else 0)
        if num_nodes < 1:
            raise ValidationError("spec.pytorchReplicaSpecs.Worker.replicas",
                                  "must be >= 1 when there is no Master (the job needs at least one node)")
        if master is not None and worker is not None:
            self._compare_templates(master, worker)
        pod_template = copy.deepcopy(primary.template)
        base = f"spec.pytorchReplicaSpecs.{primary_type}.template.spec"
        containers = pod_template.get("spec", {}).get("containers") or []
        if not containers:
            raise ValidationError(f"{base}.containers", f"must hold the trainer container (named {PYTORCH_CONTAINER!r})")
        index = next((i for i, c in enumerate(containers) if c.get("name") == PYTORCH_CONTAINER), None)
        if index is None:
            index = 0
            self.warn(f"{base}.containers", f"no container is named {PYTORCH_CONTAINER!r}; "
                      f"the first one, {containers[0].get('name')!r}, runs the training")
        container = containers[index]
        launch = read_container_command([*(container.get("command") or []), *(container.get("args") or [])])
        trainer = self._trainer(container, launch, f"{base}.containers[{index}]", num_nodes)
        runtime = self._runtime(pod_template, index, primary, num_nodes)
        trainjob = self._trainjob(trainer, runtime)
        return Conversion(self.job.name, trainjob, runtime, self.warnings)

    # -- the trainer ------------------------------------------------------------------------------------------

    def _trainer(self, container: dict[str, Any], launch: ContainerCommand, path: str, num_nodes: int) -> dict[str, Any]:
        trainer: dict[str, Any] = {}
        if container.get("image"):
            trainer["image"] = container["image"]
        if launch.command:
            trainer["command"] = launch.command
        elastic = self.spec.elastic_policy
        if elastic is None:
            trainer["numNodes"] = num_nodes
        nproc = self._num_proc_per_node(launch, path)
        if nproc is not None:
            trainer["numProcPerNode"] = nproc
        self._check_dropped_options(launch, path, num_nodes)
        env = []
        for i, var in enumerate(container.get("env") or []):
            if var.get("name", "").startswith("PET_"):
                self.warn(f"{path}.env[{i}]", f"{var['name']} is left out: the runtime sets the PET_* variables "
                          "(use nprocPerNode and the replica counts instead)")
                continue
            env.append(validate_model(EnvVar, var).to_dict())
        if env:
            trainer["env"] = env
        if container.get("resources"):
            trainer["resourcesPerNode"] = validate_model(ResourceRequirements, container["resources"]).to_dict()
        return trainer

    def _num_proc_per_node(self, launch: ContainerCommand, path: str) -> int | str | None:
        spec_value = self.spec.nproc_per_node
        if spec_value is None and self.spec.elastic_policy is not None:
            spec_value = self.spec.elastic_policy.n_proc_per_node
        if launch.nproc_per_node is not None:
            try:
                value = Trainer.from_dict({"numProcPerNode": launch.nproc_per_node}).num_proc_per_node
            except ValidationError as exc:
                raise ValidationError(f"{path}.command", f"--nproc-per-node {exc.message}") from None
            if spec_value is not None and spec_value != value:
                self.warn("spec.nprocPerNode", f"is {spec_value!r} but the command says --nproc-per-node="
                          f"{launch.nproc_per_node}; the command's value is used, as torchrun does")
            return value
        if launch.wrapped:
            if spec_value not in (None, 1):
                self.warn("spec.nprocPerNode", f"is {spec_value!r} but the command runs the script directly, one "
                          "process per node; it now runs under torchrun with one process per node")
            return 1
        if launch.launcher == "other":
            self.warn(f"{path}.command", "is not torchrun or python: it runs as written on every node, with "
                      "torchrun's settings in the PET_* variables")
        return spec_value

    def _check_dropped_options(self, launch: ContainerCommand, path: str, num_nodes: int) -> None:
        elastic = self.spec.elastic_policy
        nnodes = launch.dropped.get("nnodes")
        if nnodes is not None and "$(" not in nnodes and elastic is None and nnodes != str(num_nodes):
            self.warn(f"{path}.command", f"--nnodes={nnodes} does not match the {num_nodes} node(s) of Master and "
                      f"Worker replicas; the job runs {num_nodes}")
        port = launch.dropped.get("master-port")
        if port is not None and "$(" not in port and port != RUNTIME_MASTER_PORT:
            self.warn(f"{path}.command", f"--master-port={port} is left out: the runtime's rendezvous port is "
                      f"{RUNTIME_MASTER_PORT}")
        for option in ("rdzv-endpoint", "rdzv-conf", "rdzv-id"):
            if option in launch.dropped:
                self.warn(f"{path}.command", f"--{option} is left out: the runtime sets the rendezvous")

    # -- the runtime ------------------------------------------------------------------------------------------

    def _runtime(self, pod_template: dict[str, Any], index: int, primary: ReplicaSpec,
                 num_nodes: int) -> TrainingRuntime | None:
        pod_spec = pod_template.setdefault("spec", {})
        if "restartPolicy" in pod_spec:
            self.warn("template.spec.restartPolicy", "is left out: failed nodes are restarted by the JobSet (failurePolicy)")
            pod_spec.pop("restartPolicy")
        containers = pod_spec["containers"]
        node = {k: v for k, v in containers[index].items() if k not in _TRAINER_FIELDS[1:]}
        node["name"] = TRAINER_CONTAINER
        extra_container_fields = set(node) - {"name"}
        containers[index] = node
        failure_policy = self._failure_policy(primary)
        ml_policy = self._ml_policy()
        needs_runtime = (
            bool(set(pod_spec) - {"containers"})
            or len(containers) > 1
            or bool(extra_container_fields)
            or bool(pod_template.get("metadata"))
            or failure_policy is not None
            or ml_policy.get("torch", {}).get("elasticPolicy") is not None
        )
        if not needs_runtime:
            return None
        pod_meta = pod_template.get("metadata") or {}
        job_template: dict[str, Any] = {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": {**({"metadata": pod_meta} if pod_meta else {}), "spec": pod_spec}},
        }
        jobset_spec: dict[str, Any] = {"replicatedJobs": [{"name": TRAINER_JOB, "template": job_template}]}
        if failure_policy is not None:
            jobset_spec["failurePolicy"] = failure_policy
        spec: dict[str, Any] = {"mlPolicy": ml_policy, "template": {"spec": jobset_spec}}
        return TrainingRuntime.from_dict({
            "apiVersion": TRAINER_API_VERSION,
            "kind": "TrainingRuntime",
            "metadata": {
                "name": self.job.name,
                "namespace": self.job.metadata.namespace,
                "labels": {"trainer.kubeflow.org/framework": "torch"},
                "annotations": {CONVERTED_FROM_ANNOTATION: CONVERTED_FROM},
            },
            "spec": spec,
        })

    def _ml_policy(self) -> dict[str, Any]:
        elastic = self.spec.elastic_policy
        if elastic is None:
            return {"torch": {}}
        replicas = self.spec.pytorch_replica_specs
        count = (1 if MASTER in replicas else 0) + (_replicas(replicas[WORKER]) if WORKER in replicas else 0)
        max_nodes = elastic.max_replicas or count
        min_nodes = elastic.min_replicas or min(count, max_nodes)
        if min_nodes > max_nodes:
            raise ValidationError("spec.elasticPolicy.minReplicas",
                                  f"must be <= the node count {max_nodes} when maxReplicas is not set, got {min_nodes}")
        if count != max_nodes:
            self.warn("spec.elasticPolicy.maxReplicas", f"the job starts {max_nodes} node(s) (maxReplicas), not the "
                      f"{count} of the replica specs; it runs with any count from {min_nodes} up")
        policy: dict[str, Any] = {"minNodes": min_nodes, "maxNodes": max_nodes}
        if elastic.max_restarts is not None:
            policy["maxRestarts"] = elastic.max_restarts
        if elastic.metrics:
            policy["metrics"] = elastic.metrics
        if elastic.rdzv_backend not in (None, "c10d"):
            self.warn("spec.elasticPolicy.rdzvBackend", f"{elastic.rdzv_backend!r} is replaced by c10d, the only "
                      "rendezvous the runtime runs (on the first node)")
        for name, value in (("rdzvHost", elastic.rdzv_host), ("rdzvPort", elastic.rdzv_port),
                            ("rdzvId", elastic.rdzv_id), ("rdzvConf", elastic.rdzv_conf),
                            ("standalone", elastic.standalone)):
            if value is not None:
                self.warn(f"spec.elasticPolicy.{name}", "is not carried over: the runtime sets the rendezvous")
        return {"torch": {"elasticPolicy": policy}}

    def _failure_policy(self, primary: ReplicaSpec) -> dict[str, Any] | None:
        run_policy = self.spec.run_policy
        backoff = run_policy.backoff_limit if run_policy else None
        policies = {s.restart_policy for s in self.spec.pytorch_replica_specs.values()} - {None}
        if len(policies) > 1:
            self.warn("spec.pytorchReplicaSpecs", f"Master and Worker restart policies differ "
                      f"({', '.join(sorted(policies))}); the job restarts as {primary.restart_policy or 'Never'}")
        policy = primary.restart_policy
        if policy in ("Always", "ExitCode"):
            self.warn("restartPolicy", f"{policy} is read as OnFailure: a failed node restarts the whole group "
                      "(any exit code but 0 counts as a failure)")
        if policy in _RESTARTING:
            return {"maxRestarts": DEFAULT_MAX_RESTARTS if backoff is None else backoff}
        if backoff is not None:
            return {"maxRestarts": backoff}
        return None

    def _compare_templates(self, master: ReplicaSpec, worker: ReplicaSpec) -> None:
        differences = _differences(master.template, worker.template, "template")
        if differences:
            shown = ", ".join(differences[:6]) + (f" and {len(differences) - 6} more" if len(differences) > 6 else "")
            self.warn("spec.pytorchReplicaSpecs", f"Master and Worker pod templates differ ({shown}); every node "
                      "runs the Master's")

    # -- the TrainJob -----------------------------------------------------------------------------------------

    def _trainjob(self, trainer: dict[str, Any], runtime: TrainingRuntime | None) -> TrainJob:
        meta = self.job.metadata
        annotations = {**(meta.annotations or {}), CONVERTED_FROM_ANNOTATION: CONVERTED_FROM}
        spec: dict[str, Any] = {
            "runtimeRef": {"name": runtime.name, "kind": "TrainingRuntime"} if runtime else {"name": DEFAULT_RUNTIME},
            "trainer": trainer,
        }
        run_policy = self.spec.run_policy
        if run_policy is not None:
            if run_policy.active_deadline_seconds is not None:
                spec["activeDeadlineSeconds"] = run_policy.active_deadline_seconds
            if run_policy.suspend is not None:
                spec["suspend"] = run_policy.suspend
            if run_policy.ttl_seconds_after_finished is not None:
                annotations[TTL_ANNOTATION] = str(run_policy.ttl_seconds_after_finished)
            if run_policy.clean_pod_policy not in (None, "None"):
                self.warn("spec.runPolicy.cleanPodPolicy", f"{run_policy.clean_pod_policy} is not carried over: "
                          "pods are kept until the TrainJob is deleted (use ttlSecondsAfterFinished to delete it)")
            if run_policy.scheduling_policy is not None:
                self.warn("spec.runPolicy.schedulingPolicy", "is not carried over: gang scheduling comes from a "
                          "runtime's podGroupPolicy (e.g. torch-distributed-volcano)")
            if run_policy.managed_by is not None:
                self.warn("spec.runPolicy.managedBy", f"{run_policy.managed_by!r} is not carried over")
        if self.warnings:
            annotations[CONVERSION_WARNINGS_ANNOTATION] = "\n".join(self.warnings)
        metadata: dict[str, Any] = {"name": meta.name, "namespace": meta.namespace, "annotations": annotations}
        if meta.labels:
            metadata["labels"] = dict(meta.labels)
        return TrainJob.from_dict({
            "apiVersion": TRAINER_API_VERSION,
            "kind": "TrainJob",
            "metadata": metadata,
            "spec": spec,
        })


def _replicas(spec: ReplicaSpec) -> int:
    return 1 if spec.replicas is None else spec.replicas


def _differences(a: Any, b: Any, path: str) -> list[str]:
    """Field paths where ``a`` and ``b`` differ (lists of named items compared by name)."""
    if a == b:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for key in dict.fromkeys([*a, *b]) for p in _differences(a.get(key), b.get(key), f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            name = x.get("name") if isinstance(x, dict) else None
            out += _differences(x, y, f"{path}[{quote(name, 40) if name else i}]".replace("'", ""))
        return out
    return [path]
