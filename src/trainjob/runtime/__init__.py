"""The runtime framework: ``resolve(trainjob, runtime) -> Plan`` through plugins in a fixed order.

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
