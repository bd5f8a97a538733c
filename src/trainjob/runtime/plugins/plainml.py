"""The plainml plugin: runtimes without a framework policy (no ``mlPolicy``, or one with only ``numNodes``), Ray
runtimes (:mod:`~trainjob.runtime.plugins.ray`) aside.

The trainer job gets ``spec.trainer.numNodes`` pods (else the runtime's ``mlPolicy.numNodes``, else 1), one
process each; ``spec.trainer.env`` is already on the container and no ``PET_*`` variable is added, so any
launcher (a shell script, ``python -m``, an MPI-less custom rendezvous) can run.
"""

from __future__ import annotations

from trainjob.errors import ValidationError
from trainjob.runtime.plugin import Context, MLPolicyEnforcer, Plugin, Validator
from trainjob.runtime.plugins.ray import is_ray_runtime
from trainjob.runtime.trainer_spec import requested_num_nodes


class PlainMLPlugin(Plugin, Validator, MLPolicyEnforcer):
    """Node count for runtimes whose ``mlPolicy`` sets neither ``torch`` nor ``mpi``. Phases: validate, ML policy."""

    name = "plainml"

    def enabled(self, ctx: Context) -> bool:
        policy = ctx.runtime.spec.ml_policy
        if is_ray_runtime(ctx.runtime):
            return False
        return policy is None or all(
            getattr(policy, name) is None for name in ("torch", "mpi", "flux", "jax", "xgboost")
        )

    def validate(self, ctx: Context) -> list[ValidationError]:
        trainer = ctx.trainjob.spec.trainer
        if trainer is not None and trainer.num_proc_per_node is not None:
            return [
                ValidationError(
                    "spec.trainer.numProcPerNode",
                    f"only applies to runtimes with mlPolicy.torch; {ctx.runtime.kind} {ctx.runtime.name!r} has "
                    "none (every node runs one process); remove the field or pick a torch runtime",
                )
            ]
        return []

    def enforce_ml_policy(self, ctx: Context) -> None:
        plan = ctx.plan
        plan.num_nodes = requested_num_nodes(ctx.trainjob, ctx.runtime)
        plan.trainer().count = plan.num_nodes
        plan.num_proc_per_node = 1
        plan.ml_policy = "plainml"
