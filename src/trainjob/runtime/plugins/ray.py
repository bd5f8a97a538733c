"""The ray plugin: a Ray cluster per job, for runtimes labelled ``trainer.kubeflow.org/framework: ray``.

Kubeflow Trainer's API has no Ray ML policy, so the runtime is told apart by its framework label (the shipped
one is ``ray-distributed``); its ``mlPolicy`` sets at most ``numNodes``. Every trainer pod runs
:mod:`trainjob.ray.node` with the TrainJob's command as the driver:

=========================  ==========================================================================
what                       value
=========================  ==========================================================================
nodes                      ``spec.trainer.numNodes``, else the runtime's ``mlPolicy.numNodes``, else 1
container command, args    ``python -m trainjob.ray.node``, then the TrainJob's command and args (the
                           driver, run once on node 0; ``torchrun X`` is read as ``python X``)
``PET_NNODES``             the node count: node 0 starts the driver once that many Ray nodes are up
``PET_NODE_RANK``          the pod's completion index (0: the Ray head)
``PET_MASTER_ADDR``        ``{job}-node-0-0.{job}``, as the torch runtime's master: the head's address
``PET_MASTER_PORT``        6379, the head's (GCS) port, also opened as container port
``TRAINJOB_RAY_NUM_CPUS``  ``resourcesPerNode``'s CPUs, when set: what each node offers Ray
``TRAINJOB_RAY_NUM_GPUS``  ``resourcesPerNode``'s GPUs, when any
=========================  ==========================================================================

Locally the master is ``127.0.0.1`` and a free port (:mod:`trainjob.backends.local.process_specs`). A job with
no command is refused (a Ray job needs a driver), so is ``numProcPerNode`` (Ray starts the workers, as many as
the driver's ``ScalingConfig`` asks) and a driver whose literal ``storage_path`` this machine's Python cannot
reach (:mod:`trainjob.ray_storage`; checked when the driver script is readable here).
"""

from __future__ import annotations

from pathlib import Path

from trainjob.api import Runtime
from trainjob.api.quantity import cpu_count, gpu_count
from trainjob.constants import (
    FRAMEWORK_LABEL,
    PET_NNODES,
    RAY_NUM_CPUS_ENV,
    RAY_NUM_GPUS_ENV,
    TRAINER_CONTAINER,
)
from trainjob.errors import ValidationError
from trainjob.runtime.launch import addressing_env, kubernetes_addressing
from trainjob.runtime.plan import ContainerPort, EnvVar
from trainjob.runtime.plugin import Context, MLPolicyEnforcer, Plugin, Validator
from trainjob.runtime.template import main_container, upsert_env
from trainjob.runtime.trainer_spec import requested_num_nodes

FRAMEWORK = "ray"
#: The Ray head's GCS port in a JobSet.
HEAD_PORT = 6379
NODE_MODULE = "trainjob.ray.node"


def is_ray_runtime(runtime: Runtime) -> bool:
    """Whether ``runtime`` is labelled ``trainer.kubeflow.org/framework: ray``."""
    return (runtime.metadata.labels or {}).get(FRAMEWORK_LABEL) == FRAMEWORK


def node_command(driver: list[str]) -> tuple[list[str], list[str]]:
    """The trainer container's (command, args) for a ``driver`` command.

    >>> node_command(["python", "ray_train.py", "--epochs", "3"])
    (['python', '-m', 'trainjob.ray.node'], ['python', 'ray_train.py', '--epochs', '3'])
    """
    return ["python", "-m", NODE_MODULE], list(driver)


class RayPlugin(Plugin, Validator, MLPolicyEnforcer):
    """Node count, the node command and the head's address for Ray runtimes. Phases: validate, ML policy."""

    name = "ray"

    def enabled(self, ctx: Context) -> bool:
        return is_ray_runtime(ctx.runtime)

    def validate(self, ctx: Context) -> list[ValidationError]:
        problems = []
        policy = ctx.runtime.spec.ml_policy
        if policy is not None and (policy.torch is not None or policy.mpi is not None):
            problems.append(ValidationError(
                "spec.mlPolicy",
                f"runtime {ctx.runtime.name!r} is a Ray runtime ({FRAMEWORK_LABEL}: {FRAMEWORK}); it takes only "
                "mlPolicy.numNodes, not torch or mpi (Ray starts the workers)",
            ))
        trainer = ctx.trainjob.spec.trainer
        if trainer is not None and trainer.num_proc_per_node is not None:
            problems.append(ValidationError(
                "spec.trainer.numProcPerNode",
                f"does not apply to Ray runtime {ctx.runtime.name!r}: Ray starts as many workers as the driver's "
                "ScalingConfig(num_workers=...) asks; remove the field",
            ))
        driver = _driver(ctx)
        if not driver:
            problems.append(ValidationError(
                "spec.trainer.command",
                f"Ray runtime {ctx.runtime.name!r} runs a driver script on node 0; give its command "
                "(e.g. [python, ray_train.py], or trainjob run --runtime ray-distributed ray_train.py), got none",
            ))
        else:
            problems += _storage_problems(driver)
        return problems

    def enforce_ml_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        plan.num_nodes = requested_num_nodes(ctx.trainjob, ctx.runtime)
        trainer = plan.trainer()
        trainer.count = plan.num_nodes
        plan.num_proc_per_node = 1
        plan.master_port = HEAD_PORT
        plan.ml_policy = FRAMEWORK
        container = main_container(trainer, TRAINER_CONTAINER)
        container.command, container.args = node_command(_driver(ctx))
        env = [EnvVar(PET_NNODES, str(plan.num_nodes)),
               *addressing_env(kubernetes_addressing(plan), master_port=HEAD_PORT)]
        resources = container.resources.effective()
        if "cpu" in resources:
            env.append(EnvVar(RAY_NUM_CPUS_ENV, str(cpu_count(resources["cpu"]))))
        if gpu_count(resources):
            env.append(EnvVar(RAY_NUM_GPUS_ENV, str(gpu_count(resources))))
        upsert_env(container, env)
        if not any(p.container_port == HEAD_PORT for p in container.ports):
            container.ports.append(ContainerPort(container_port=HEAD_PORT))


def _driver(ctx: Context) -> list[str]:
    """The trainer container's command and args as resolved from the TrainJob and the runtime."""
    container = main_container(ctx.plan.trainer(), TRAINER_CONTAINER)
    return [*container.command, *container.args]


def _storage_problems(driver: list[str]) -> list[ValidationError]:
    from trainjob.ray_storage import driver_script, storage_paths, storage_problem

    script = driver_script(driver)
    if script is None or not Path(script).is_file():
        return []
    return [
        ValidationError("spec.trainer.command", f"driver {script}: {problem}")
        for problem in map(storage_problem, storage_paths(script)) if problem
    ]
