"""A job bigger than this machine runs here anyway: alone, scaled to the machine, with a warning saying how.

Code written for a cluster (``num_nodes=4, resources_per_node={"cpu": 8, "memory": "32Gi", "gpu": 2}``) runs on a
laptop unchanged, as Kubeflow's local backend and TorchX's local scheduler run it. The plan keeps its shape (nodes,
processes per node: ``auto`` with 2 GPUs per node still gives 2), only what the machine lacks is scaled:

=======  ========================================================================================================
CPU      asked for more cores than there are: the machine's cores are divided among the nodes (each node pinned
         to ``cores // nodes`` of them, at least one, so nodes share cores when there are more nodes than cores)
         and ``OMP_NUM_THREADS`` is that share divided by the node's processes, unless the job sets it
GPU      asked for more GPUs than there are: each node gets ``gpus // nodes`` of them, at most what it asked,
         unless that would make processes that asked for a GPU each share one; then the ranks see none
         (``CUDA_VISIBLE_DEVICES`` empty, on every node alike) and fall back as their code decides
memory   asked for more than there is: not enforced (it never is here), only said
=======  ========================================================================================================

What fits is left as asked. The job waits in the local queue until no other job runs, and nothing else is admitted
while it runs (:func:`~trainjob.backends.local.queue.admit`). A ``ScaledToMachine`` Warning event says
exactly what was scaled, and the job's message carries a summary for its whole life (``trainjob get``)::

    scaling = scale_to_machine(spec, request, machine, processes_per_node=2, job_sets_omp=False)
    scaling.summary   # '32 CPUs asked, the 4 node(s) share 2 core(s); 8 GPUs asked, there are 0: the ranks see none'

Strict resources refuse such a job at submit instead (:func:`strict_resources`, in this order): the job's
annotation ``trainjob/strict-resources: "true"`` (``trainjob run --strict-resources``), then
``LocalProcessBackendConfig(strict_resources=...)``, ``$TRAINJOB_STRICT_RESOURCES``, ``strict_resources:`` in the
config file (:mod:`trainjob.settings`); off by default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainjob.backends.local.process_specs import ProcessSpec, share_cpus
from trainjob.backends.local.queue import Machine, Request, format_bytes
from trainjob.constants import STRICT_RESOURCES_ANNOTATION
from trainjob.errors import ValidationError

if TYPE_CHECKING:
    from trainjob.api import TrainJob as TrainJobResource

STRICT_RESOURCES_ENV = "TRAINJOB_STRICT_RESOURCES"
SCALED_REASON = "ScaledToMachine"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
#: The notes of the process spec that a ``ScaledToMachine`` event says better.
_SUPERSEDED_NOTES = ("CPUsShared", "GPUsUnavailable")


@dataclass(frozen=True)
class Scaling:
    """What was scaled: ``summary`` for the job's message, ``detail`` for the ``ScaledToMachine`` event."""

    summary: str
    detail: str


def strict_resources(trainjob: TrainJobResource, configured: bool | None = None) -> str | None:
    """Where strict resources are switched on for ``trainjob`` (``"TRAINJOB_STRICT_RESOURCES=1"`` ...), or ``None``
    when a job bigger than this machine may run scaled; ``configured`` is the backend's setting (``None``: unset)."""
    annotation = (trainjob.metadata.annotations or {}).get(STRICT_RESOURCES_ANNOTATION)
    if annotation is not None:
        on = _flag(str(annotation), f"metadata.annotations[{STRICT_RESOURCES_ANNOTATION}]")
        return f'annotation {STRICT_RESOURCES_ANNOTATION}: "{annotation}"' if on else None
    if configured is not None:
        return "LocalProcessBackendConfig(strict_resources=True)" if configured else None
    env = os.environ.get(STRICT_RESOURCES_ENV)
    if env is not None:
        return f"{STRICT_RESOURCES_ENV}={env}" if _flag(env, STRICT_RESOURCES_ENV) else None
    from trainjob.settings import load_config

    config, path = load_config()
    return f"strict_resources: true in {path}" if config.get("strict_resources") else None


def _flag(value: str, path: str) -> bool:
    text = value.strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValidationError(path, f"must be true or false (1/0, yes/no, on/off), got {value!r}")
    return text in _TRUE


def scale_to_machine(spec: ProcessSpec, request: Request, machine: Machine, processes_per_node: int,
                     job_sets_omp: bool) -> Scaling:
    """Lay ``spec``'s nodes out over ``machine`` as the module's table says (``spec`` is changed in place) and say
    what was scaled. ``job_sets_omp``: the job's own env sets ``OMP_NUM_THREADS`` (left as it is)."""
    nodes = len(spec.nodes)
    summary: list[str] = []
    detail: list[str] = []
    if request.cores > len(machine.cores):
        cpu_sets, _ = share_cpus(nodes, None, list(machine.cores))
        threads = max(1, len(cpu_sets[0]) // max(1, processes_per_node))
        for node, cpus in zip(spec.nodes, cpu_sets, strict=True):
            node.cpus = cpus
            if not job_sets_omp:
                node.env["OMP_NUM_THREADS"] = str(threads)
        shared = len(cpu_sets[0]) * nodes > len(machine.cores)
        summary.append(f"{request.cores} CPUs asked, the {nodes} node(s) {'share' if shared else 'divide'} "
                       f"{len(machine.cores)} core(s)")
        detail.append(
            f"CPU: {request.nodes} node(s) x {request.cores_per_node} = {request.cores} asked, this machine has "
            f"{len(machine.cores)}: each node gets {len(cpu_sets[0])} core(s) ({_layout(cpu_sets)})"
            + (", shared between nodes" if shared else "")
            + (f", OMP_NUM_THREADS={threads}" if not job_sets_omp else ", OMP_NUM_THREADS as the job sets it")
        )
    if request.gpus > len(machine.gpus):
        per_node = min(request.gpus_per_node, len(machine.gpus) // nodes)
        if request.gpus_per_node >= processes_per_node > per_node:
            per_node = 0  # ranks that asked for a GPU each would share one, which NCCL refuses: none rather
        gpu_sets = [list(machine.gpus[i * per_node : (i + 1) * per_node]) for i in range(nodes)]
        for node, gpus in zip(spec.nodes, gpu_sets, strict=True):
            node.env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        given = ("the ranks see none (CUDA_VISIBLE_DEVICES is empty) and fall back as their code decides"
                 if per_node == 0 else f"each node gets {per_node} ({_layout(gpu_sets)})")
        summary.append(f"{request.gpus} GPUs asked, there are {len(machine.gpus)}: "
                       + ("the ranks see none" if per_node == 0 else f"{per_node} per node"))
        detail.append(f"GPU: {request.nodes} node(s) x {request.gpus_per_node} = {request.gpus} asked, this machine "
                      f"has {len(machine.gpus)}: {given}")
    if request.memory > machine.memory:
        summary.append(f"{format_bytes(request.memory)} of memory asked, there is {format_bytes(machine.memory)}: "
                       "not enforced")
        detail.append(f"memory: {request.nodes} node(s) x {format_bytes(request.memory_per_node)} = "
                      f"{format_bytes(request.memory)} asked, this machine has {format_bytes(machine.memory)}: not "
                      "enforced")
    spec.notes = [note for note in spec.notes if note[0] not in _SUPERSEDED_NOTES]
    return Scaling(
        summary="; ".join(summary),
        detail=("the job asks for more than this machine has, so it runs alone (once no other job runs), scaled "
                f"to it: {'; '.join(detail)}. Set {STRICT_RESOURCES_ENV}=1 (or strict_resources: true in the "
                "config file, or trainjob run --strict-resources) to refuse such jobs instead"),
    )


def _layout(sets: list[list[int]] | list[list[str]]) -> str:
    """``node-0: 0-3, node-1: 4-7``; the first 8 nodes, then how many more."""
    shown = [f"node-{i}: {_ids(ids) or 'none'}" for i, ids in enumerate(sets[:8])]
    return ", ".join(shown) + (f" and {len(sets) - 8} more" if len(sets) > 8 else "")


def _ids(ids: list[int] | list[str]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``; GPU ids as they are, joined by commas."""
    if not all(isinstance(i, int) for i in ids):
        return ",".join(map(str, ids))
    runs: list[list[int]] = []
    for i in ids:
        if runs and isinstance(i, int) and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([int(i)])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)
