"""The plugins the framework runs: the built-ins in a fixed order, then third-party plugins from entry points.

Built-ins, in order: ``torch``, ``mpi``, ``ray``, ``plainml`` (ML policy), ``coscheduling``, ``volcano`` (gang
scheduling), ``jobset`` (final pod templates and JobSet settings). Third-party plugins follow, sorted by
entry-point name. A third-party plugin is a :class:`~trainjob.runtime.plugin.Plugin` subclass (or instance, or a
callable returning one) published in the ``trainjob.plugins`` entry-point group; one whose ``name`` equals a
built-in's replaces that built-in in place::

    [project.entry-points."trainjob.plugins"]
    priority-class = "my_package.plugins:PriorityClassPlugin"

This module imports the plugins; the plugins import only :mod:`trainjob.runtime.plugin`, so there is no import
circle between the framework and its plugins.

>>> [p.name for p in builtin_plugins()]
['torch', 'mpi', 'ray', 'plainml', 'coscheduling', 'volcano', 'jobset']
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import metadata
from typing import Any

from trainjob.runtime.plugin import Plugin
from trainjob.runtime.plugins.coscheduling import CoschedulingPlugin
from trainjob.runtime.plugins.jobset import JobSetPlugin
from trainjob.runtime.plugins.mpi import MPIPlugin
from trainjob.runtime.plugins.plainml import PlainMLPlugin
from trainjob.runtime.plugins.ray import RayPlugin
from trainjob.runtime.plugins.torch import TorchPlugin
from trainjob.runtime.plugins.volcano import VolcanoPlugin

ENTRY_POINT_GROUP = "trainjob.plugins"
#: The built-in plugin classes in the order their plugins run within a phase.
BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    TorchPlugin,
    MPIPlugin,
    RayPlugin,
    PlainMLPlugin,
    CoschedulingPlugin,
    VolcanoPlugin,
    JobSetPlugin,
)


def builtin_plugins() -> list[Plugin]:
    """The built-in plugins in their fixed order (new instances)."""
    return [cls() for cls in BUILTIN_PLUGINS]


def entry_point_plugins(group: str = ENTRY_POINT_GROUP) -> list[Plugin]:
    """Plugins installed by other distributions in the entry-point ``group``, sorted by entry-point name."""
    return [
        _instantiate(entry.load(), entry.name, group)
        for entry in sorted(metadata.entry_points(group=group), key=lambda e: e.name)
    ]


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


def _instantiate(obj: Any, entry_name: str, group: str = ENTRY_POINT_GROUP) -> Plugin:
    plugin = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Plugin)) else obj
    if not isinstance(plugin, Plugin):
        raise TypeError(f"entry point {entry_name!r} in {group} did not give a trainjob Plugin: {obj!r}")
    return plugin
