"""What a runtime plugin is: a named :class:`Plugin` that takes part in some of the phases, each a small protocol.

=============================  ==========================  ====================================================
phase (protocol)               method                      what the plugin does
=============================  ==========================  ====================================================
:class:`Validator`             ``validate(ctx)``           returns the problems it sees; nothing changes yet
:class:`MLPolicyEnforcer`      ``enforce_ml_policy(ctx)``  node count, processes per node, the framework's env
                                                           (``torch``, ``mpi``, ``plainml``)
:class:`PodGroupEnforcer`      ``enforce_pod_group_policy  gang scheduling: the PodGroup requirement and the pod
                               (ctx)``                     labels that go with it (``coscheduling``,
                                                           ``volcano``)
:class:`Builder`               ``build(ctx)``              the final pod sets and JobSet settings (``jobset``)
:class:`Renderer`              ``render(plan)``            the Kubernetes objects the plugin owns, from the
                                                           finished plan: the JobSet (``jobset``), the PodGroup
                                                           (``coscheduling``, ``volcano``), an MPI job's Secret
                                                           and ConfigMap (``mpi``)
=============================  ==========================  ====================================================

A plugin implements the methods of the phases it takes part in and nothing else; whether it does is checked with
``isinstance(plugin, Builder)`` and so on (the protocols are ``runtime_checkable``). A plugin written for the
earlier base class, which overrode some of ``validate`` / ``enforce_ml_policy`` / ``enforce_pod_group_policy`` /
``build``, is a plugin of exactly those phases.

This module imports no plugin: plugins import it, the registry (:mod:`trainjob.runtime.registry`) imports the
plugins, and the framework (:mod:`trainjob.runtime.framework`) imports the registry.

>>> class Tagger(Plugin):
...     name = "tagger"
...     def build(self, ctx):
...         ctx.plan.labels["team"] = "vision"
>>> isinstance(Tagger(), Builder), isinstance(Tagger(), Validator)
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from trainjob.api import Runtime, TrainJob
from trainjob.errors import ValidationError
from trainjob.runtime.plan import Plan

__all__ = [
    "PHASES",
    "Builder",
    "Context",
    "MLPolicyEnforcer",
    "Plugin",
    "PodGroupEnforcer",
    "Renderer",
    "Validator",
]


@dataclass
class Context:
    """What plugins see and change: the inputs and the plan being built."""

    trainjob: TrainJob
    runtime: Runtime
    plan: Plan


class Plugin:
    """Base class of runtime plugins: a name and whether the plugin applies to a job; the phases it takes part in
    are the protocols below whose methods it defines."""

    #: Unique plugin name, listed in :attr:`Plan.plugins` when the plugin ran.
    name: ClassVar[str] = ""

    def enabled(self, ctx: Context) -> bool:
        """Whether this plugin applies to this job and runtime (default: always)."""
        return True


@runtime_checkable
class Validator(Protocol):
    """Phase 1: problems with the job or runtime; all plugins' problems are reported together."""

    def validate(self, ctx: Context) -> list[ValidationError]: ...


@runtime_checkable
class MLPolicyEnforcer(Protocol):
    """Phase 2: node count, processes per node and the framework's env on the plan (sets ``plan.ml_policy``)."""

    def enforce_ml_policy(self, ctx: Context) -> None: ...


@runtime_checkable
class PodGroupEnforcer(Protocol):
    """Phase 3: the plan's gang-scheduling requirement and the pod labels that go with it."""

    def enforce_pod_group_policy(self, ctx: Context) -> None: ...


@runtime_checkable
class Builder(Protocol):
    """Phase 4: the final pod sets and JobSet settings."""

    def build(self, ctx: Context) -> None: ...


@runtime_checkable
class Renderer(Protocol):
    """After resolving: the Kubernetes objects this plugin owns for a plan it took part in (maybe none)."""

    def render(self, plan: Plan) -> list[dict[str, Any]]: ...


#: The phases of resolving, in order: (method name, protocol).
PHASE_PROTOCOLS: tuple[tuple[str, type], ...] = (
    ("validate", Validator),
    ("enforce_ml_policy", MLPolicyEnforcer),
    ("enforce_pod_group_policy", PodGroupEnforcer),
    ("build", Builder),
)
PHASES = tuple(name for name, _ in PHASE_PROTOCOLS)
