"""The runtime framework: ``resolve(trainjob, runtime) -> Plan`` through plugins in a fixed order.

==========================================  =========================================================================
module                                      holds
==========================================  =========================================================================
:mod:`~trainjob.runtime.catalog`            the runtimes shipped in ``runtime/builtin/`` and lookup of a ``runtimeRef``
:mod:`~trainjob.runtime.trainer_spec`       ``spec.trainer`` / ``spec.initializer`` applied to the runtime's pod sets
:mod:`~trainjob.runtime.patches`            a job's changes to its runtime's template, from either API generation
:mod:`~trainjob.runtime.template`           between the runtime's JobSet template and the plan's typed pod sets
:mod:`~trainjob.runtime.plugin`             the plugin base, :class:`Context` and the phase protocols
:mod:`~trainjob.runtime.plugins`            the built-in plugins (``torch``, ``mpi``, ``plainml``, ``ray``,
                                            ``coscheduling``, ``volcano``, ``jobset``)
:mod:`~trainjob.runtime.registry`           which plugins run, in which order (entry points included)
:mod:`~trainjob.runtime.framework`          the phases: validate, ML policy, pod-group policy, build; and rendering
:mod:`~trainjob.runtime.gang`               what a gang needs, and the PodGroup the gang plugins render
:mod:`~trainjob.runtime.plan`               the backend-neutral :class:`Plan`
:mod:`~trainjob.runtime.launch`             the torch launch contract: :class:`~trainjob.runtime.launch.LaunchValues`,
                                            addressing, and the ``PET_*`` table
:mod:`~trainjob.runtime.nccl`               NCCL profiles and the NCCL set-up mistakes worth a warning
:mod:`~trainjob.runtime.render`             the plan's Kubernetes objects (JobSet, PodGroup, MPI Secret/ConfigMap)
:mod:`~trainjob.runtime.submit_events`      the events a backend records when a job is submitted
==========================================  =========================================================================

>>> from trainjob.api import load_resources
>>> from trainjob.runtime import find_runtime, resolve
>>> job, = load_resources("job.yaml")                                         # doctest: +SKIP
>>> plan = resolve(job, find_runtime(job.spec.runtime_ref))                     # doctest: +SKIP
>>> plan.trainer().container().env_dict(index=0)["PET_NODE_RANK"]              # doctest: +SKIP
'0'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainjob.runtime.catalog import DEFAULT_RUNTIME, builtin_runtimes, find_runtime
    from trainjob.runtime.framework import ENTRY_POINT_GROUP, PHASES, Context, Framework, Plugin, resolve
    from trainjob.runtime.plan import Plan

#: Where each name of this package is defined. They are imported on first use, so that a process that needs one
#: light module (a supervisor reading :mod:`~trainjob.runtime.launch`) does not load the framework and the API.
_EXPORTS = {
    "DEFAULT_RUNTIME": "trainjob.runtime.catalog",
    "builtin_runtimes": "trainjob.runtime.catalog",
    "find_runtime": "trainjob.runtime.catalog",
    "ENTRY_POINT_GROUP": "trainjob.runtime.framework",
    "PHASES": "trainjob.runtime.framework",
    "Context": "trainjob.runtime.framework",
    "Framework": "trainjob.runtime.framework",
    "Plugin": "trainjob.runtime.framework",
    "resolve": "trainjob.runtime.framework",
    "Plan": "trainjob.runtime.plan",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    try:  # a submodule reached as an attribute (``trainjob.runtime.catalog``), as an eager import made possible
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_RUNTIME",
    "ENTRY_POINT_GROUP",
    "PHASES",
    "Context",
    "Framework",
    "Plan",
    "Plugin",
    "builtin_runtimes",
    "find_runtime",
    "resolve",
]
