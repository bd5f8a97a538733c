"""Kubernetes objects from a :class:`Plan`, each rendered by the plugin that owns it.

============================  ===============================================================================
object                        plugin
============================  ===============================================================================
JobSet                        ``jobset`` (:func:`~trainjob.runtime.plugins.jobset.render_jobset`),
                              ``jobset.x-k8s.io/v1alpha2``
PodGroup (gang scheduling)    ``coscheduling`` (``scheduling.x-k8s.io/v1alpha1``) or ``volcano``
                              (``scheduling.volcano.sh/v1beta1``)
Secret, ConfigMap             ``mpi``: the SSH keys and the hostfile (:mod:`trainjob.runtime.plugins.mpi`)
============================  ===============================================================================

This module is the entry point callers use; the framework's :meth:`~trainjob.runtime.framework.Framework.render`
runs the plugins' render phase.

>>> from trainjob.runtime import builtin_runtimes, resolve                        # doctest: +SKIP
>>> objects = render_objects(resolve(job, builtin_runtimes()["torch-distributed"]))  # doctest: +SKIP
>>> [o["kind"] for o in objects]                                                  # doctest: +SKIP
['JobSet']
"""

from __future__ import annotations

from typing import Any

from trainjob.runtime.framework import default_framework
from trainjob.runtime.plan import Plan
from trainjob.runtime.plugins.jobset import render_jobset

__all__ = ["render_jobset", "render_objects"]


def render_objects(plan: Plan) -> list[dict[str, Any]]:
    """The JobSet, followed by the PodGroup when the plan asks for gang scheduling, then an MPI plan's Secret and
    ConfigMap (labelled like the PodGroup)."""
    return default_framework().render(plan)
