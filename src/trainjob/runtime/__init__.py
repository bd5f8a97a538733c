"""The runtime framework: ``resolve(trainjob, runtime) -> Plan`` through plugins in a fixed order.

==========================================  =========================================================================
module                                      holds
==========================================  =========================================================================
:mod:`~trainjob.runtime.trainer_spec`       ``spec.trainer`` / ``spec.initializer`` applied to the runtime's pod sets
:mod:`~trainjob.runtime.plugin`             the plugin base, :class:`Context` and the phase protocols
:mod:`~trainjob.runtime.plugins`            the built-in plugins (``torch``, ``mpi``, ``plainml``, ``coscheduling``,
                                            ``volcano``, ``jobset``)
:mod:`~trainjob.runtime.registry`           which plugins run, in which order (entry points included)
:mod:`~trainjob.runtime.framework`          the phases: validate, ML policy, pod-group policy, build; and rendering
:mod:`~trainjob.runtime.plan`               the backend-neutral :class:`Plan`
:mod:`~trainjob.runtime.launch`             the torch launch contract: :class:`~trainjob.runtime.launch.LaunchValues`,
                                            addressing, ``PET_*`` env
:mod:`~trainjob.runtime.render`             the plan's Kubernetes objects (JobSet, PodGroup, MPI Secret/ConfigMap)
==========================================  =========================================================================

>>> from trainjob.api import load_resources
>>> from trainjob.runtime import find_runtime, resolve
>>> job, = load_resources("job.yaml")                                         # doctest: +SKIP
>>> plan = resolve(job, find_runtime(job.spec.runtime_ref))                     # doctest: +SKIP
>>> plan.trainer().container().env_dict(index=0)["PET_NODE_RANK"]              # doctest: +SKIP
'0'
"""

from trainjob.runtime.catalog import DEFAULT_RUNTIME, builtin_runtimes, find_runtime
from trainjob.runtime.framework import ENTRY_POINT_GROUP, PHASES, Context, Framework, Plugin, resolve
from trainjob.runtime.plan import Plan

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
