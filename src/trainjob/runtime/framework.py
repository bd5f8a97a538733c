"""The runtime framework: a TrainJob plus its runtime go through plugins, in a fixed order, into a :class:`Plan`.

Phases, in this order (every enabled plugin runs a phase before the next phase starts):

=========================  ===========================================================================
phase                      what happens
=========================  ===========================================================================
``validate``               each plugin returns the problems it sees; all are reported together
``enforce_ml_policy``      node count, processes per node, the framework's env (``torch``, ``mpi``, ``plainml``)
``enforce_pod_group_policy``  gang scheduling: PodGroup requirements and pod labels (``coscheduling``,
                           ``volcano``)
``build``                  final shape of the pod sets and JobSet settings (``jobset``)
=========================  ===========================================================================

Within a phase, plugins run in registry order: the built-ins ``torch``, ``mpi``, ``plainml``, ``coscheduling``,
``volcano``, ``jobset``, then third-party plugins sorted by entry-point name. A third-party plugin is a
:class:`Plugin` subclass (or instance, or a callable returning one) published in the ``trainjob.plugins``
entry-point group; one whose ``name`` equals a built-in's replaces that built-in in place::

    [project.entry-points."trainjob.plugins"]
    priority-class = "my_package.plugins:PriorityClassPlugin"

>>> from trainjob.runtime import builtin_runtimes, resolve           # doctest: +SKIP
>>> plan = resolve(job, builtin_runtimes()["torch-distributed"])    # doctest: +SKIP
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar

from trainjob.api import Runtime, TrainJob
from trainjob.api.errors import quote
from trainjob.errors import ValidationError
from trainjob.runtime.overrides import apply_initializers, apply_trainer
from trainjob.runtime.plan import Plan
from trainjob.runtime.template import pod_sets_from_runtime, trainer_pod_set

ENTRY_POINT_GROUP = "trainjob.plugins"
PHASES = ("validate", "enforce_ml_policy", "enforce_pod_group_policy", "build")


@dataclass
class Context:
    """What plugins see and change: the inputs and the plan being built."""

    trainjob: TrainJob
    runtime: Runtime
    plan: Plan


class Plugin:
    """Base class of runtime plugins; override the phases the plugin takes part in.

    >>> class Tagger(Plugin):
    ...     name = "tagger"
    ...     def build(self, ctx):
    ...         ctx.plan.labels["team"] = "vision"
    """

    #: Unique plugin name, listed in :attr:`Plan.plugins` when the plugin ran.
    name: ClassVar[str] = ""

    def enabled(self, ctx: Context) -> bool:
        """Whether this plugin applies to this job and runtime (default: always)."""
        return True

    def validate(self, ctx: Context) -> list[ValidationError]:
        """Problems with the job or runtime; nothing is changed in this phase."""
        return []

    def enforce_ml_policy(self, ctx: Context) -> None:
        """Set node count, processes per node and the framework's env on the plan."""

    def enforce_pod_group_policy(self, ctx: Context) -> None:
        """Set the plan's gang-scheduling requirement and the pod labels that go with it."""

    def build(self, ctx: Context) -> None:
        """Finish the pod sets and JobSet settings."""


def builtin_plugins() -> list[Plugin]:
    """The built-in plugins in their fixed order."""
    from trainjob.runtime.plugins.coscheduling import CoschedulingPlugin
    from trainjob.runtime.plugins.jobset import JobSetPlugin
    from trainjob.runtime.plugins.mpi import MPIPlugin
    from trainjob.runtime.plugins.plainml import PlainMLPlugin
    from trainjob.runtime.plugins.torch import TorchPlugin
    from trainjob.runtime.plugins.volcano import VolcanoPlugin

    return [TorchPlugin(), MPIPlugin(), PlainMLPlugin(), CoschedulingPlugin(), VolcanoPlugin(), JobSetPlugin()]


def entry_point_plugins(group: str = ENTRY_POINT_GROUP) -> list[Plugin]:
    """Plugins installed by other distributions in the entry-point ``group``, sorted by entry-point name."""
    plugins = []
    for entry in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
        plugins.append(_instantiate(entry.load(), entry.name))
    return plugins


def registered_plugins(extra: Iterable[Plugin] = ()) -> list[Plugin]:
    """Built-ins, then entry-point plugins, then ``extra``; a later plugin replaces an earlier one of its name."""
    ordered: list[Plugin] = []
    for plugin in [*builtin_plugins(), *entry_point_plugins(), *extra]:
        if not plugin.name:
            raise TypeError(f"plugin {plugin!r} has no name")
        position = next((i for i, p in enumerate(ordered) if p.name == plugin.name), None)
        if position is None:
            ordered.append(plugin)
        else:
            ordered[position] = plugin
    return ordered


class Framework:
    """Runs plugins over a job and its runtime.

    >>> Framework().plugin_names()[:2]
    ['torch', 'mpi']
    """

    def __init__(self, plugins: Sequence[Plugin] | None = None) -> None:
        self.plugins = list(plugins) if plugins is not None else registered_plugins()

    def plugin_names(self) -> list[str]:
        return [p.name for p in self.plugins]

    def resolve(self, trainjob: TrainJob, runtime: Runtime) -> Plan:
        """The plan for ``trainjob`` on ``runtime``; raises :class:`ValidationError` listing every problem."""
        _check_runtime_matches(trainjob, runtime)
        ctx = Context(trainjob=trainjob, runtime=runtime, plan=initial_plan(trainjob, runtime))
        active = [p for p in self.plugins if p.enabled(ctx)]
        problems = [problem for plugin in active for problem in plugin.validate(ctx)]
        if problems:
            raise ValidationError.combine(problems)
        for phase in PHASES[1:]:
            for plugin in active:
                getattr(plugin, phase)(ctx)
            if phase == "enforce_ml_policy" and not ctx.plan.ml_policy:
                raise _no_ml_plugin(runtime, active)
        ctx.plan.plugins = [p.name for p in active]
        return ctx.plan


def initial_plan(trainjob: TrainJob, runtime: Runtime) -> Plan:
    """The runtime's pod sets with the TrainJob's trainer and initializer settings applied; plugins do the rest."""
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
    if runtime.kind == "TrainingRuntime" and runtime.metadata.namespace != trainjob.namespace:
        raise ValidationError(
            "spec.runtimeRef",
            f"TrainingRuntime {runtime.name!r} is in namespace {runtime.metadata.namespace!r}, "
            f"the TrainJob in {trainjob.namespace!r}; use a runtime of the job's namespace or a ClusterTrainingRuntime",
        )


def _no_ml_plugin(runtime: Runtime, active: list[Plugin]) -> ValidationError:
    policy = runtime.spec.ml_policy
    kinds = [name for name in ("flux", "jax", "xgboost") if policy is not None and getattr(policy, name)]
    kind = kinds[0] if kinds else "this"
    return ValidationError(
        "spec.mlPolicy",
        f"no installed plugin runs {kind} ML policy (plugins: {', '.join(p.name for p in active)}); "
        "use mlPolicy.torch, mlPolicy.mpi or no mlPolicy",
    )


def _instantiate(obj: Any, entry_name: str) -> Plugin:
    plugin = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Plugin)) else obj
    if not isinstance(plugin, Plugin):
        raise TypeError(
            f"entry point {entry_name!r} in {ENTRY_POINT_GROUP} did not give a trainjob Plugin: {obj!r}"
        )
    return plugin
