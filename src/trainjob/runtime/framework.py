"""The runtime framework: a TrainJob plus its runtime go through plugins, phase by phase, into a :class:`Plan`;
the plugins that own Kubernetes objects then render the plan.

Resolving, in order (every enabled plugin finishes a phase before the next phase starts):

1. :func:`initial_plan`: the runtime's pod sets with ``spec.trainer`` and ``spec.initializer`` applied
   (:mod:`trainjob.runtime.trainer_spec`);
2. ``validate`` (:class:`~trainjob.runtime.plugin.Validator`): every plugin's problems, reported together;
3. ``enforce_ml_policy`` (:class:`~trainjob.runtime.plugin.MLPolicyEnforcer`): node count, processes per node,
   the framework's env; then :func:`require_ml_policy`: some plugin must have taken the runtime's ML policy;
4. ``enforce_pod_group_policy`` (:class:`~trainjob.runtime.plugin.PodGroupEnforcer`): gang scheduling;
5. ``build`` (:class:`~trainjob.runtime.plugin.Builder`): final pod sets and JobSet settings.

Rendering (:meth:`Framework.render`, used by :func:`trainjob.runtime.render.render_objects`): the
:class:`~trainjob.runtime.plugin.Renderer` plugins that took part in the plan give their objects, the workload
first: the JobSet (``jobset``, a builder), then the PodGroup (``coscheduling`` / ``volcano``, gang plugins), then
what an ML policy adds (``mpi``: its Secret and ConfigMap).

A :class:`Framework` sorts its plugins into the phases once, when it is made; within a phase they run in registry
order (:mod:`trainjob.runtime.registry`: built-ins, then entry-point plugins). The plugin base and the phase
protocols live in :mod:`trainjob.runtime.plugin`; ``Plugin`` and ``Context`` are importable from here too.

How a torch job's ``numProcPerNode`` reaches the processes, module by module: the YAML's
``spec.trainer.numProcPerNode`` (else the runtime's ``mlPolicy.torch.numProcPerNode``) -> ``trainjob.api``'s
``Trainer.num_proc_per_node`` -> the torch plugin's ``enforce_ml_policy``
(:func:`~trainjob.runtime.plugins.torch.resolve_num_proc_per_node`) -> ``Plan.num_proc_per_node`` ->
:func:`~trainjob.runtime.launch.resolve_launch_values` -> :func:`~trainjob.runtime.launch.torchrun_env` with the backend's
:class:`~trainjob.runtime.launch.Addressing` -> ``PET_NPROC_PER_NODE`` in the JobSet's ``node`` container, or in
a local node process's env.

>>> from trainjob.runtime import builtin_runtimes, resolve           # doctest: +SKIP
>>> plan = resolve(job, builtin_runtimes()["torch-distributed"])    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

from trainjob.api import Runtime, TrainJob
from trainjob.api.errors import quote
from trainjob.constants import TRAINING_RUNTIME_KIND
from trainjob.errors import ValidationError
from trainjob.runtime.plan import Plan
from trainjob.runtime.plugin import (
    PHASES,
    Builder,
    Context,
    MLPolicyEnforcer,
    Plugin,
    PodGroupEnforcer,
    Renderer,
    Validator,
)
from trainjob.runtime.registry import (
    ENTRY_POINT_GROUP,
    builtin_plugins,
    entry_point_plugins,
    registered_plugins,
)
from trainjob.runtime.template import pod_sets_from_runtime, trainer_pod_set
from trainjob.runtime.trainer_spec import apply_initializers, apply_trainer

__all__ = [
    "ENTRY_POINT_GROUP",
    "PHASES",
    "Context",
    "Framework",
    "Plugin",
    "builtin_plugins",
    "default_framework",
    "entry_point_plugins",
    "initial_plan",
    "registered_plugins",
    "require_ml_policy",
    "resolve",
]


class Framework:
    """Runs plugins over a job and its runtime, and renders the plans they make.

    >>> [p.name for p in Framework().plugins][:2]
    ['torch', 'mpi']
    >>> [p.name for p in Framework().builders]
    ['jobset']
    """

    def __init__(self, plugins: Sequence[Plugin] | None = None) -> None:
        self.plugins = list(plugins) if plugins is not None else registered_plugins()
        self.validators = [p for p in self.plugins if isinstance(p, Validator)]
        self.ml_policy_enforcers = [p for p in self.plugins if isinstance(p, MLPolicyEnforcer)]
        self.pod_group_enforcers = [p for p in self.plugins if isinstance(p, PodGroupEnforcer)]
        self.builders = [p for p in self.plugins if isinstance(p, Builder)]
        self.renderers = sorted((p for p in self.plugins if isinstance(p, Renderer)), key=_render_stage)

    def resolve(self, trainjob: TrainJob, runtime: Runtime) -> Plan:
        """The plan for ``trainjob`` on ``runtime``; raises :class:`ValidationError` listing every problem."""
        _check_runtime_matches(trainjob, runtime)
        ctx = Context(trainjob=trainjob, runtime=runtime, plan=initial_plan(trainjob, runtime))
        active = [p for p in self.plugins if p.enabled(ctx)]
        ran = {id(p) for p in active}
        problems = [problem for p in self.validators if id(p) in ran for problem in p.validate(ctx)]
        if problems:
            raise ValidationError.combine(problems)
        for enforcer in self.ml_policy_enforcers:
            if id(enforcer) in ran:
                enforcer.enforce_ml_policy(ctx)
        require_ml_policy(ctx, active)
        for gang in self.pod_group_enforcers:
            if id(gang) in ran:
                gang.enforce_pod_group_policy(ctx)
        for builder in self.builders:
            if id(builder) in ran:
                builder.build(ctx)
        ctx.plan.plugins = [p.name for p in active]
        return ctx.plan

    def render(self, plan: Plan) -> list[dict[str, Any]]:
        """The Kubernetes objects of ``plan``, each from the plugin that owns it if that plugin took part: the
        JobSet, then the PodGroup when the plan asks for gang scheduling, then an MPI plan's Secret and ConfigMap."""
        ran = set(plan.plugins)
        return [obj for renderer in self.renderers if renderer.name in ran for obj in renderer.render(plan)]


def require_ml_policy(ctx: Context, active: Sequence[Plugin]) -> None:
    """The step after the ML policy phase: some plugin must have set ``plan.ml_policy``; else no installed plugin
    runs the runtime's ML policy (``flux``, ``jax``, ``xgboost`` ...) and the job cannot run."""
    if ctx.plan.ml_policy:
        return
    policy = ctx.runtime.spec.ml_policy
    kinds = [name for name in ("flux", "jax", "xgboost") if policy is not None and getattr(policy, name)]
    kind = kinds[0] if kinds else "this"
    raise ValidationError(
        "spec.mlPolicy",
        f"no installed plugin runs {kind} ML policy (plugins: {', '.join(p.name for p in active)}); "
        "use mlPolicy.torch, mlPolicy.mpi or no mlPolicy",
    )


def _render_stage(plugin: Plugin) -> int:
    """Objects come workload first: builders' (the JobSet), then gang plugins' (the PodGroup), then ML plugins'."""
    for stage, phase in enumerate((Builder, PodGroupEnforcer, MLPolicyEnforcer)):
        if isinstance(plugin, phase):
            return stage
    return 3


def initial_plan(trainjob: TrainJob, runtime: Runtime) -> Plan:
    """Step 1 of resolving: the runtime's pod sets with ``spec.trainer`` and ``spec.initializer`` applied
    (:mod:`trainjob.runtime.trainer_spec`); plugins do the rest."""
    pod_sets = pod_sets_from_runtime(runtime)
    trainer = trainer_pod_set(pod_sets, runtime.name)
    trainer.replicas = 1  # one Indexed Job whose completion index is the node rank
    apply_trainer(trainjob, trainer, runtime)
    apply_initializers(trainjob, pod_sets, runtime.name)
    template = runtime.spec.template
    template_meta = template.metadata
    jobset_spec = template.spec.to_dict()
    jobset_spec.pop("replicatedJobs", None)
    spec = trainjob.spec
    return Plan(
        job_name=trainjob.name,
        namespace=trainjob.namespace,
        runtime_kind=runtime.kind,
        runtime_name=runtime.name,
        pod_sets=pod_sets,
        num_nodes=trainer.count,
        num_proc_per_node=1,
        ml_policy="",
        suspend=bool(spec.suspend),
        active_deadline_seconds=spec.active_deadline_seconds,
        managed_by=spec.managed_by,
        labels={**((template_meta.labels if template_meta else None) or {}), **(spec.labels or {})},
        annotations={
            **((template_meta.annotations if template_meta else None) or {}),
            **(spec.annotations or {}),
        },
        jobset_spec=copy.deepcopy(jobset_spec),
    )


@functools.cache
def default_framework() -> Framework:
    """The framework with every registered plugin, built once per process."""
    return Framework()


def resolve(trainjob: TrainJob, runtime: Runtime) -> Plan:
    """The plan for ``trainjob`` on ``runtime`` with the registered plugins.

    >>> from trainjob.runtime import builtin_runtimes                      # doctest: +SKIP
    >>> resolve(job, builtin_runtimes()["torch-distributed"]).num_nodes    # doctest: +SKIP
    2
    """
    return default_framework().resolve(trainjob, runtime)


def _check_runtime_matches(trainjob: TrainJob, runtime: Runtime) -> None:
    ref = trainjob.spec.runtime_ref
    if (ref.kind, ref.name) != (runtime.kind, runtime.name):
        raise ValidationError(
            "spec.runtimeRef",
            f"refers to {ref.kind} {quote(ref.name)}, but {runtime.kind} {runtime.name!r} was given to resolve it",
        )
    if runtime.kind == TRAINING_RUNTIME_KIND and runtime.metadata.namespace != trainjob.namespace:
        raise ValidationError(
            "spec.runtimeRef",
            f"TrainingRuntime {runtime.name!r} is in namespace {runtime.metadata.namespace!r}, "
            f"the TrainJob in {trainjob.namespace!r}; use a runtime of the job's namespace or a ClusterTrainingRuntime",
        )
