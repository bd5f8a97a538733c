"""The local queue: jobs that request resources start only when this machine has them free, like Kueue admission.

This machine's capacity is the cores this process may run on (its CPU affinity), its memory and its visible GPUs
(``CUDA_VISIBLE_DEVICES``, else ``/dev/nvidia<N>``). What a job holds while it runs is its trainer's
``resourcesPerNode`` (requests, else limits) times its nodes:

=======================  ===========================================================================
CPU                      whole cores per node (``2500m`` -> 3), each node pinned to cores no other job holds
memory                   bytes, counted against the machine's memory (not enforced on the processes)
GPUs                     whole GPUs per node, each node given GPUs no other job holds
nothing requested        *best effort*: started at once and holds nothing, as Kubernetes schedules pods
                         without requests (so ``trainjob run train.py`` behaves as before)
=======================  ===========================================================================

A job whose request could never fit this machine is refused at submit with the numbers. One that does not fit
what is free now waits as ``Queued`` (its message and a ``Queued`` event say what for) and is admitted when the
jobs ahead of it have ended: by priority (annotation ``trainjob/priority``, an integer, higher first, default 0),
then in submission order, strictly (a job never starts before one ahead of it that is still waiting, so big jobs
are not starved by small ones).

Oversubscribing keeps the old behaviour (start at once, nodes may share cores): ``TRAINJOB_OVERSUBSCRIBE=1`` in
the submitting environment, or the annotation ``trainjob/oversubscribe: "true"`` on a job. Admission runs when a
job is submitted, resumed, suspended, deleted or ends (its supervisor admits the next ones as it exits), and on
every listing, inside one SQLite write transaction, so processes admitting at once agree::

    admitted = admit(store)          # names of jobs moved Queued -> Created; start their supervisors
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from trainjob.backends.local.process_specs import ProcessSpec, visible_gpus
from trainjob.backends.local.store import ACTIVE_STATUSES, Store
from trainjob.constants import OVERSUBSCRIBE_ANNOTATION, PRIORITY_ANNOTATION
from trainjob.errors import ValidationError
from trainjob.sdk import types

if TYPE_CHECKING:
    from trainjob.api import TrainJob as TrainJobResource
    from trainjob.runtime.plan import Plan

OVERSUBSCRIBE_ENV = "TRAINJOB_OVERSUBSCRIBE"
#: Reason of a job that waits for resources (its message says which); ``Pending`` before the first admission pass.
WAITING_REASON = "WaitingForResources"
PENDING_REASON = "Pending"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Request:
    """What one job holds while it runs: per node, times ``nodes``."""

    nodes: int
    cores_per_node: int = 0
    memory_per_node: int = 0
    gpus_per_node: int = 0

    @property
    def empty(self) -> bool:
        return not (self.cores_per_node or self.memory_per_node or self.gpus_per_node)

    @property
    def cores(self) -> int:
        return self.cores_per_node * self.nodes

    @property
    def memory(self) -> int:
        return self.memory_per_node * self.nodes

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Machine:
    """This machine's capacity: usable core ids, memory in bytes, visible GPU ids."""

    cores: tuple[int, ...]
    memory: int
    gpus: tuple[str, ...]

    @classmethod
    def detect(cls) -> Machine:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        return cls(tuple(cores), psutil.virtual_memory().total, tuple(visible_gpus()))


def job_request(plan: Plan) -> Request:
    """The resources a job's plan holds on this machine (see the module's table)."""
    from trainjob.api.quantity import gpu_count, parse_quantity

    resources = plan.trainer().container().resources.effective()
    cores = math.ceil(parse_quantity(resources["cpu"])) if "cpu" in resources else 0
    memory = math.ceil(parse_quantity(resources["memory"])) if "memory" in resources else 0
    return Request(plan.num_nodes, max(0, cores), max(0, memory), max(0, gpu_count(resources)))


def job_priority(trainjob: TrainJobResource) -> int:
    """The ``trainjob/priority`` annotation as an integer (default 0); ``ValidationError`` when it is not one."""
    value = (trainjob.metadata.annotations or {}).get(PRIORITY_ANNOTATION)
    if value is None:
        return 0
    text = str(value).strip()
    if not text.lstrip("-").isdigit() or abs(int(text)) > 2**31 - 1:
        raise ValidationError(f"metadata.annotations[{PRIORITY_ANNOTATION}]",
                              f"must be an integer from -2147483647 to 2147483647, got {value!r}")
    return int(text)


def oversubscribing(trainjob: TrainJobResource) -> bool:
    """Whether the job skips the queue: ``$TRAINJOB_OVERSUBSCRIBE`` or its ``trainjob/oversubscribe`` annotation."""
    annotation = (trainjob.metadata.annotations or {}).get(OVERSUBSCRIBE_ANNOTATION, "")
    return os.environ.get(OVERSUBSCRIBE_ENV, "").lower() in _TRUE or str(annotation).lower() in _TRUE


def check_fits(request: Request, machine: Machine) -> None:
    """``ValidationError`` with the numbers when ``request`` could never fit ``machine``, even with nothing else
    running."""
    problems = []
    if request.cores > len(machine.cores):
        problems.append(f"{request.nodes} node(s) x {request.cores_per_node} CPU(s) = {request.cores} CPUs, "
                        f"this machine has {len(machine.cores)}")
    if request.memory > machine.memory:
        problems.append(f"{request.nodes} node(s) x {_bytes(request.memory_per_node)} = {_bytes(request.memory)} "
                        f"of memory, this machine has {_bytes(machine.memory)}")
    if request.gpus > len(machine.gpus):
        problems.append(f"{request.nodes} node(s) x {request.gpus_per_node} GPU(s) = {request.gpus} GPUs, "
                        f"this machine has {len(machine.gpus)}")
    if problems:
        raise ValidationError(
            "spec.trainer.resourcesPerNode",
            "the job could never run on this machine: " + "; ".join(problems)
            + f" (request less, or set {OVERSUBSCRIBE_ENV}=1 to run it anyway with nodes sharing what there is)",
        )


def admit(store: Store, machine: Machine | None = None, now: float | None = None) -> list[str]:
    """Admit the queued jobs that fit what is free, in queue order, stopping at the first that does not; returns
    their names (status now ``Created``: the caller starts their supervisors). Jobs left waiting get a message
    saying what they wait for."""
    machine = machine or Machine.detect()
    now = time.time() if now is None else now
    db = store._db
    admitted: list[str] = []
    with store.transaction():
        queued = db.execute(
            "SELECT name, num_nodes, cpus, memory_bytes, gpus, reason, message, created, launch FROM jobs "
            "WHERE status = ? ORDER BY priority DESC, created, rowid", (types.QUEUED,)
        ).fetchall()
        if not queued:
            return []
        held_cores, held_gpus, held_memory, holders = _held(db)
        free_cores = [c for c in machine.cores if c not in held_cores]
        free_gpus = [g for g in machine.gpus if g not in held_gpus]
        free_memory = machine.memory - held_memory
        blocked_at: int | None = None
        for position, row in enumerate(queued):
            nodes = row["num_nodes"]
            request = Request(nodes, row["cpus"] // nodes, row["memory_bytes"] // nodes, row["gpus"] // nodes)
            fits = request.cores <= len(free_cores) and request.gpus <= len(free_gpus) and request.memory <= free_memory
            if blocked_at is None and fits:
                launch = _assign(row["launch"], request, free_cores[: request.cores], free_gpus[: request.gpus])
                free_cores, free_gpus = free_cores[request.cores :], free_gpus[request.gpus :]
                free_memory -= request.memory
                db.execute("UPDATE jobs SET status = ?, reason = ?, message = ?, launch = ? WHERE name = ?",
                           (types.CREATED, "Admitted", "admitted by the local queue", json.dumps(launch), row["name"]))
                if row["reason"] == WAITING_REASON:
                    store.add_event(row["name"], "Admitted", f"resources free after {now - row['created']:.0f}s in the queue")
                admitted.append(row["name"])
                continue
            if blocked_at is None:
                blocked_at = position
            message = _waiting_message(request, machine, len(free_cores), len(free_gpus), free_memory, holders,
                                       ahead=position - blocked_at)
            if (row["reason"], row["message"]) != (WAITING_REASON, message):
                db.execute("UPDATE jobs SET reason = ?, message = ? WHERE name = ?", (WAITING_REASON, message, row["name"]))
            if row["reason"] != WAITING_REASON:
                store.add_event(row["name"], "Queued", message)
    return admitted


def _held(db: Any) -> tuple[set[int], set[str], int, list[str]]:
    """Cores and GPUs the active jobs' nodes are pinned to, memory they requested, and their names."""
    cores: set[int] = set()
    gpus: set[str] = set()
    memory = 0
    holders = []
    marks = ", ".join("?" * len(ACTIVE_STATUSES))
    for row in db.execute(f"SELECT name, memory_bytes, launch FROM jobs WHERE status IN ({marks})", ACTIVE_STATUSES):
        spec = ProcessSpec.from_dict(json.loads(row["launch"]))
        held = False
        for node in spec.nodes:
            cores.update(node.cpus)
            visible = node.env.get("CUDA_VISIBLE_DEVICES", "")
            gpus.update(g for g in visible.split(",") if g)
            held = held or bool(node.cpus) or bool(visible)
        memory += row["memory_bytes"]
        if held or row["memory_bytes"]:
            holders.append(row["name"])
    return cores, gpus, memory, holders


def _assign(launch_json: str, request: Request, cores: list[int], gpus: list[str]) -> dict[str, Any]:
    """The process spec with each node pinned to its own share of ``cores`` and ``gpus``."""
    spec = ProcessSpec.from_dict(json.loads(launch_json))
    for node in spec.nodes:
        i = node.index
        if request.cores_per_node:
            node.cpus = cores[i * request.cores_per_node : (i + 1) * request.cores_per_node]
        if request.gpus_per_node:
            node.env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * request.gpus_per_node : (i + 1) * request.gpus_per_node])
    return spec.to_dict()


def _waiting_message(request: Request, machine: Machine, free_cores: int, free_gpus: int, free_memory: int,
                     holders: list[str], ahead: int) -> str:
    wants = []
    if request.cores:
        wants.append(f"{request.cores} CPU(s) ({free_cores} of {len(machine.cores)} free)")
    if request.memory:
        wants.append(f"{_bytes(request.memory)} of memory ({_bytes(max(0, free_memory))} of {_bytes(machine.memory)} free)")
    if request.gpus:
        wants.append(f"{request.gpus} GPU(s) ({free_gpus} of {len(machine.gpus)} free)")
    message = "waiting for " + ", ".join(wants)
    if ahead:
        message += f"; {ahead} job(s) ahead in the queue"
    if holders:
        shown = ", ".join(holders[:3]) + (f" and {len(holders) - 3} more" if len(holders) > 3 else "")
        message += f"; held by {shown}"
    return message


def _bytes(count: int) -> str:
    for unit, size in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count}B"
