"""The torch plugin: what ``torchrun`` on every node needs, for runtimes with ``mlPolicy.torch``.

The plugin resolves the launch values (node count, processes per node, port, elastic range) onto the plan; the
one function :func:`trainjob.runtime.launch.torchrun_env` turns them, with the JobSet's addressing
(:func:`~trainjob.runtime.launch.kubernetes_addressing`), into the environment of the trainer (``node``)
container. The ``PET_*`` variables and their values are tabled in :mod:`trainjob.runtime.launch`.

``PET_*`` names in ``spec.trainer.env`` are rejected: they would silently fight those values.
Elastic jobs start ``maxNodes`` pods; gang scheduling requires ``minNodes`` of them. The containers a v2.3
runtime names in ``mlPolicy.torch.envInjection`` (sidecars, init containers) get the same ``PET_*`` variables.
A trainer command of exactly ``tune run`` (Kubeflow's BuiltinTrainer) is validated and completed with recipe and
config by :mod:`trainjob.runtime.plugins.torchtune`.
"""

from __future__ import annotations

from trainjob.api import TorchElasticPolicy, TrainJob
from trainjob.api.common import MAX_NUM_PROC_PER_NODE
from trainjob.api.errors import quote
from trainjob.api.quantity import cpu_count, gpu_count
from trainjob.constants import PET_PREFIX, TRAINER_CONTAINER
from trainjob.errors import ValidationError
from trainjob.runtime.launch import kubernetes_addressing, resolve_launch_values, torchrun_env
from trainjob.runtime.patches import pod_patches
from trainjob.runtime.plan import ContainerPort, ElasticPolicy, EnvVar, Plan, Resources
from trainjob.runtime.plugin import Context, MLPolicyEnforcer, Plugin, Validator
from trainjob.runtime.plugins.torchtune import is_torchtune_job, torchtune_command, validate_torchtune
from trainjob.runtime.template import env_to_dict, main_container, pod_spec, upsert_env
from trainjob.runtime.trainer_spec import requested_num_nodes


def resolve_num_proc_per_node(setting: int | str | None, resources: Resources) -> int:
    """Processes per node for a ``numProcPerNode`` setting and the trainer container's resources.

    ==========  ================================================================================
    setting     result
    ==========  ================================================================================
    integer     kept as is
    ``auto``    the GPU count when GPUs are requested, else the CPU count (also when unset)
    ``cpu``     the CPU count, even when GPUs are requested
    ``gpu``     the GPU count; an error when no GPU is requested
    ==========  ================================================================================

    A count past :data:`~trainjob.api.common.MAX_NUM_PROC_PER_NODE` (1,024) is an error.

    The CPU count is the ``cpu`` quantity rounded up with a floor of 1 (``"2.5"`` and ``"2500m"`` -> 3,
    ``"0.7"`` -> 1); with no ``cpu`` requested at all it is 1. GPUs are every resource whose name mentions
    ``gpu`` (``nvidia.com/gpu``, ``amd.com/gpu``). Per resource a request wins over a limit.

    >>> resolve_num_proc_per_node("auto", Resources(limits={"cpu": "16", "nvidia.com/gpu": "4"}))
    4
    >>> resolve_num_proc_per_node("cpu", Resources(requests={"cpu": "2500m", "nvidia.com/gpu": "4"}))
    3
    """
    if isinstance(setting, int):
        return setting
    effective = resources.effective()
    gpus = gpu_count(effective)
    if setting == "gpu":
        if gpus < 1:
            raise ValueError(
                "is 'gpu' but the trainer requests no GPU (e.g. nvidia.com/gpu in resourcesPerNode); "
                "request GPUs or use auto, cpu or an integer"
            )
        return _at_most_max(setting, gpus, "GPUs")
    if setting == "cpu" or gpus <= 0:
        return _at_most_max(setting, cpu_count(effective.get("cpu")), "CPUs")
    return _at_most_max(setting, gpus, "GPUs")


def _at_most_max(setting: str, count: int, what: str) -> int:
    if count > MAX_NUM_PROC_PER_NODE:
        raise ValueError(
            f"is {setting!r}, which gives one process per requested {what[:-1]}: {quote(count)} per node; at most "
            f"{MAX_NUM_PROC_PER_NODE} are allowed: request fewer {what} or set an integer"
        )
    return count


def torch_env(plan: Plan) -> list[EnvVar]:
    """The ``PET_*`` variables of the trainer container of ``plan``: its launch values, addressed as in a JobSet."""
    return torchrun_env(resolve_launch_values(plan), kubernetes_addressing(plan))


class TorchPlugin(Plugin, Validator, MLPolicyEnforcer):
    """Node count, processes per node, ``PET_*`` env and port 29500 for ``mlPolicy.torch`` runtimes.
    Phases: validate, ML policy."""

    name = "torch"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.ml_policy
        return policy is not None and policy.torch is not None

    def validate(self, ctx: Context) -> list[ValidationError]:
        problems = _reserved_env_problems(ctx.trainjob)
        jobs = {p.name: p for p in ctx.plan.pod_sets}
        for job, name, path in _env_injection_targets(ctx):
            if job not in jobs:
                problems.append(ValidationError(f"{path}.jobName", f"runtime {ctx.runtime.name!r} has no job {quote(job)}"))
                continue
            known = [c.name for c in jobs[job].containers]
            known += [c.get("name") for c in pod_spec(jobs[job].template).get("initContainers") or []]
            if name not in known:
                problems.append(ValidationError(
                    f"{path}.containerNames", f"job {job!r} has no container {quote(name)} ({', '.join(known)})"
                ))
        trainer = ctx.trainjob.spec.trainer
        if trainer is not None and trainer.num_nodes is not None and _elastic_policy(ctx) is not None:
            problems.append(
                ValidationError(
                    "spec.trainer.numNodes",
                    f"must not be set: runtime {ctx.runtime.name!r} is elastic "
                    "(mlPolicy.torch.elasticPolicy decides the node count between minNodes and maxNodes)",
                )
            )
        if is_torchtune_job(ctx.trainjob):
            resources = main_container(ctx.plan.trainer(), TRAINER_CONTAINER).resources
            problems += validate_torchtune(ctx.trainjob, resources)
        return problems

    def enforce_ml_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        elastic = _elastic_policy(ctx)
        if elastic is not None:
            plan.elastic = ElasticPolicy(
                min_nodes=elastic.min_nodes or 1,
                max_nodes=elastic.max_nodes,
                max_restarts=elastic.max_restarts or 0,
            )
            plan.num_nodes = elastic.max_nodes
        else:
            plan.num_nodes = requested_num_nodes(ctx.trainjob, ctx.runtime)
        trainer = plan.trainer()
        trainer.count = plan.num_nodes
        container = main_container(trainer, TRAINER_CONTAINER)
        setting, path, where = _num_proc_setting(ctx)
        try:
            plan.num_proc_per_node = resolve_num_proc_per_node(setting, container.resources)
        except ValueError as exc:  # QuantityError included
            raise ValidationError(path, f"{where}{exc}") from None
        plan.ml_policy = "torch"
        if is_torchtune_job(ctx.trainjob):
            container.command = torchtune_command(ctx.trainjob, ctx.runtime, plan, container.resources)
        upsert_env(container, torch_env(plan))
        if not any(p.container_port == plan.master_port for p in container.ports):
            container.ports.append(ContainerPort(container_port=plan.master_port))
        _inject_env(ctx, torch_env(plan))


def _env_injection_targets(ctx: Context) -> list[tuple[str, str, str]]:
    """(job, container, field path) for every container ``mlPolicy.torch.envInjection`` names."""
    policy = ctx.runtime.spec.ml_policy
    injection = policy.torch.env_injection if policy is not None and policy.torch is not None else None
    return [
        (target.job_name, name, f"spec.mlPolicy.torch.envInjection.targets[{i}]")
        for i, target in enumerate((injection.targets if injection else None) or [])
        for name in target.container_names
    ]


def _inject_env(ctx: Context, env: list[EnvVar]) -> None:
    jobs = {p.name: p for p in ctx.plan.pod_sets}
    for job, name, _ in _env_injection_targets(ctx):
        pod_set = jobs[job]
        if any(c.name == name for c in pod_set.containers):
            upsert_env(pod_set.container(name), env)
            continue
        for init in pod_spec(pod_set.template).get("initContainers") or []:
            if init.get("name") == name:
                names = {var.name for var in env}
                init["env"] = [v for v in init.get("env") or [] if v.get("name") not in names]
                init["env"] += [env_to_dict(var) for var in env]


def _elastic_policy(ctx: Context) -> TorchElasticPolicy | None:
    policy = ctx.runtime.spec.ml_policy
    return policy.torch.elastic_policy if policy is not None and policy.torch is not None else None


def _num_proc_setting(ctx: Context) -> tuple[int | str | None, str, str]:
    """The ``numProcPerNode`` in force, its field path and (for the runtime's) which runtime it is in."""
    trainer = ctx.trainjob.spec.trainer
    if trainer is not None and trainer.num_proc_per_node is not None:
        return trainer.num_proc_per_node, "spec.trainer.numProcPerNode", ""
    policy = ctx.runtime.spec.ml_policy
    torch_policy = policy.torch if policy is not None else None
    setting = torch_policy.num_proc_per_node if torch_policy is not None else None
    where = f"(in {ctx.runtime.kind} {ctx.runtime.name!r}) "
    return setting if setting is not None else "auto", "spec.mlPolicy.torch.numProcPerNode", where


def _reserved_env_problems(trainjob: TrainJob) -> list[ValidationError]:
    problems = []
    trainer = trainjob.spec.trainer
    for i, var in enumerate((trainer.env if trainer else None) or []):
        if var.name.startswith(PET_PREFIX):
            problems.append(_reserved(f"spec.trainer.env[{i}].name", var.name))
    for patch in pod_patches(trainjob):
        for j, container in enumerate((patch.spec.containers if patch.spec else None) or []):
            for k, var in enumerate(container.env or []):
                if var.name.startswith(PET_PREFIX):
                    problems.append(_reserved(f"{patch.path}.spec.containers[{j}].env[{k}].name", var.name))
    return problems


def _reserved(path: str, name: str) -> ValidationError:
    return ValidationError(
        path,
        f"{quote(name)} is reserved: the torch plugin sets PET_* variables from numNodes, numProcPerNode and the "
        "runtime; set those fields instead",
    )
