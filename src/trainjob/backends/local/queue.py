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

A job whose request could never fit this machine runs alone, scaled to it
(:mod:`~trainjob.backends.local.client.scaling`), unless strict resources refuse it at submit with the numbers. One
that does not fit what is free now waits as ``Queued`` (its message and a ``Queued`` event say what for) and is
admitted when the jobs ahead of it have ended: by priority (higher first, default 0), then in submission order,
strictly (a job never starts before one ahead of it that is still waiting, so big jobs are not starved by small
ones). A scaled job waits until no other job runs, and nothing else is admitted while it runs.

The queue reads Kueue's labels, so one manifest means the same on both backends:

====================================  ============================================================================
``kueue.x-k8s.io/queue-name``         the LocalQueue: this machine has one queue, which every name means; the
                                      name is shown in the job's messages
``kueue.x-k8s.io/priority-class``     a WorkloadPriorityClass name, whose value comes from ``priority_classes`` in
                                      the config file (:mod:`trainjob.settings`) and ``$TRAINJOB_PRIORITY_CLASSES``
                                      (``high=1000,low=-10``, which wins); an integer name is its own value; any
                                      other name is refused at submit
``trainjob/priority`` annotation      an integer; wins over the class
====================================  ============================================================================

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
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainjob.backends.local.process_specs import ProcessSpec, visible_gpus
from trainjob.backends.local.store import ACTIVE_STATUSES, Store
from trainjob.constants import (
    KUEUE_PRIORITY_CLASS_LABEL,
    KUEUE_QUEUE_NAME_LABEL,
    OVERSUBSCRIBE_ANNOTATION,
    PRIORITY_ANNOTATION,
)
from trainjob.errors import ValidationError
from trainjob.sdk import types

if TYPE_CHECKING:
    from trainjob.api import TrainJob as TrainJobResource
    from trainjob.runtime.plan import Plan

OVERSUBSCRIBE_ENV = "TRAINJOB_OVERSUBSCRIBE"
PRIORITY_CLASSES_ENV = "TRAINJOB_PRIORITY_CLASSES"
#: Reason of a job that waits for resources (its message says which); ``Pending`` before the first admission pass.
WAITING_REASON = "WaitingForResources"
PENDING_REASON = "Pending"
_TRUE = {"1", "true", "yes", "on"}
_INT32 = 2**31 - 1
_INTEGER = re.compile(r"[+-]?\d+")


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
        import psutil  # only a job that asks for resources needs the machine's memory

        return cls(tuple(cores), psutil.virtual_memory().total, tuple(visible_gpus()))


def job_request(plan: Plan) -> Request:
    """The resources a job's plan holds on this machine (see the module's table)."""
    from trainjob.api.quantity import gpu_count, parse_quantity

    resources = plan.trainer().container().resources.effective()
    cores = math.ceil(parse_quantity(resources["cpu"])) if "cpu" in resources else 0
    memory = math.ceil(parse_quantity(resources["memory"])) if "memory" in resources else 0
    return Request(plan.num_nodes, max(0, cores), max(0, memory), max(0, gpu_count(resources)))


@dataclass(frozen=True)
class Priority:
    """A job's place in the queue (``value``, higher first) and where it came from (``None``: the default 0)."""

    value: int = 0
    source: str | None = None

    def describe(self) -> str:
        """``priority 1000 (kueue.x-k8s.io/priority-class high)``."""
        return f"priority {self.value}" + (f" ({self.source})" if self.source else "")


def job_priority(trainjob: TrainJobResource) -> Priority:
    """The job's priority: its ``trainjob/priority`` annotation, else its ``kueue.x-k8s.io/priority-class``
    (:func:`class_priority`), else 0; ``ValidationError`` naming the annotation or label when it means nothing."""
    value = (trainjob.metadata.annotations or {}).get(PRIORITY_ANNOTATION)
    priority_class = (trainjob.metadata.labels or {}).get(KUEUE_PRIORITY_CLASS_LABEL)
    if value is not None:
        text = str(value).strip()
        if not _INTEGER.fullmatch(text) or abs(int(text)) > _INT32:
            raise ValidationError(f"metadata.annotations[{PRIORITY_ANNOTATION}]",
                                  f"must be an integer from -2147483647 to 2147483647, got {value!r}")
        over = f", over {KUEUE_PRIORITY_CLASS_LABEL} {priority_class}" if priority_class is not None else ""
        return Priority(int(text), f"annotation {PRIORITY_ANNOTATION}{over}")
    if priority_class is None:
        return Priority()
    return Priority(class_priority(str(priority_class)), f"{KUEUE_PRIORITY_CLASS_LABEL} {priority_class}")


def class_priority(name: str) -> int:
    """The value of WorkloadPriorityClass ``name`` here: from :func:`priority_classes`, else ``name`` itself when
    it is an integer; ``ValidationError`` saying what is known and how to define it otherwise."""
    classes, where = priority_classes()
    if name in classes:
        return classes[name]
    if _INTEGER.fullmatch(name) and abs(int(name)) <= _INT32:
        return int(name)
    known = ", ".join(f"{k}={v}" for k, v in sorted(classes.items())) or "none"
    raise ValidationError(
        f"metadata.labels[{KUEUE_PRIORITY_CLASS_LABEL}]",
        f"unknown WorkloadPriorityClass {name!r}: this machine has no Kueue, and the local queue knows {known} "
        f"({where}); define it in {PRIORITY_CLASSES_ENV} (e.g. {PRIORITY_CLASSES_ENV}={name}=1000) or under "
        "priority_classes: in the trainjob config file, or name an integer priority",
    )


def priority_classes() -> tuple[dict[str, int], str]:
    """WorkloadPriorityClass names and values known here, and where they were read: ``priority_classes`` of the
    config file, then ``$TRAINJOB_PRIORITY_CLASSES`` (``high=1000,low=-10``; its names win)."""
    from trainjob.settings import load_config

    config, path = load_config()
    classes: dict[str, int] = dict(config.get("priority_classes") or {})
    sources = [f"priority_classes in {path}"] if "priority_classes" in config else []
    raw = os.environ.get(PRIORITY_CLASSES_ENV, "")
    if raw.strip():
        for entry in raw.split(","):
            name, sep, value = (part.strip() for part in entry.partition("="))
            if not sep or not name or not _INTEGER.fullmatch(value) or abs(int(value)) > _INT32:
                raise ValidationError(PRIORITY_CLASSES_ENV, "must be NAME=INTEGER pairs separated by commas "
                                      f"(high=1000,low=-10), got {entry.strip()!r} in {raw!r}")
            classes[name] = int(value)
        sources.append(PRIORITY_CLASSES_ENV)
    return classes, " and ".join(sources) or f"neither {PRIORITY_CLASSES_ENV} nor the config file defines classes"


def queue_name(trainjob: TrainJobResource) -> str | None:
    """The job's ``kueue.x-k8s.io/queue-name`` label: the one local queue, by the name the manifest gives it."""
    value = (trainjob.metadata.labels or {}).get(KUEUE_QUEUE_NAME_LABEL)
    return None if value is None else str(value)


def oversubscribing(trainjob: TrainJobResource) -> bool:
    """Whether the job skips the queue: ``$TRAINJOB_OVERSUBSCRIBE`` or its ``trainjob/oversubscribe`` annotation."""
    annotation = (trainjob.metadata.annotations or {}).get(OVERSUBSCRIBE_ANNOTATION, "")
    return os.environ.get(OVERSUBSCRIBE_ENV, "").lower() in _TRUE or str(annotation).lower() in _TRUE


def shortfalls(request: Request, machine: Machine) -> list[str]:
    """What of ``request`` this machine could never give, even with nothing else running, with the numbers."""
    problems = []
    if request.cores > len(machine.cores):
        problems.append(f"{request.nodes} node(s) x {request.cores_per_node} CPU(s) = {request.cores} CPUs, "
                        f"this machine has {len(machine.cores)}")
    if request.memory > machine.memory:
        problems.append(f"{request.nodes} node(s) x {format_bytes(request.memory_per_node)} = "
                        f"{format_bytes(request.memory)} of memory, this machine has {format_bytes(machine.memory)}")
    if request.gpus > len(machine.gpus):
        problems.append(f"{request.nodes} node(s) x {request.gpus_per_node} GPU(s) = {request.gpus} GPUs, "
                        f"this machine has {len(machine.gpus)}")
    return problems


def check_fits(request: Request, machine: Machine, why: str = "") -> None:
    """``ValidationError`` with the numbers when ``request`` could never fit ``machine``, even with nothing else
    running (``why``: a sentence added at the end, saying why such a job is refused rather than scaled)."""
    problems = shortfalls(request, machine)
    if problems:
        raise ValidationError(
            "spec.trainer.resourcesPerNode",
            "the job could never run on this machine: " + "; ".join(problems)
            + f" (request less, or set {OVERSUBSCRIBE_ENV}=1 to run it anyway with nodes sharing what there is)"
            + (f"; {why}" if why else ""),
        )


@dataclass
class _Held:
    """What the active jobs hold: cores and GPUs their nodes are pinned to, memory they requested, the names of
    those that hold something, every active job, and the one running alone (scaled to this machine), if any."""

    cores: set[int] = field(default_factory=set)
    gpus: set[str] = field(default_factory=set)
    memory: int = 0
    holders: list[str] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    alone: str | None = None


def admit(store: Store, machine: Machine | None = None, now: float | None = None) -> list[str]:
    """Admit the queued jobs that fit what is free, in queue order, stopping at the first that does not; returns
    their names (status now ``Created``: the caller starts their supervisors). Jobs left waiting get a message
    saying what they wait for. A scaled job is admitted only when no other job is active, and holds everything."""
    machine = machine or Machine.detect()
    now = time.time() if now is None else now
    db = store._db
    admitted: list[str] = []
    with store.transaction():
        queued = db.execute(
            "SELECT name, num_nodes, cpus, memory_bytes, gpus, reason, message, created, launch, priority, "
            "priority_source, queue_name, scaled FROM jobs WHERE status = ? ORDER BY priority DESC, created, rowid",
            (types.QUEUED,),
        ).fetchall()
        if not queued:
            return []
        held = _held(db)
        free_cores = [c for c in machine.cores if c not in held.cores]
        free_gpus = [g for g in machine.gpus if g not in held.gpus]
        free_memory = machine.memory - held.memory
        blocked_at: int | None = None
        for position, row in enumerate(queued):
            nodes = row["num_nodes"]
            request = Request(nodes, row["cpus"] // nodes, row["memory_bytes"] // nodes, row["gpus"] // nodes)
            if row["scaled"]:
                fits = not held.active and not admitted
            else:
                fits = (held.alone is None and request.cores <= len(free_cores) and request.gpus <= len(free_gpus)
                        and request.memory <= free_memory)
            if blocked_at is None and fits:
                if row["scaled"]:  # its nodes were laid out over the whole machine when it was created
                    spec = json.loads(row["launch"])
                    free_cores, free_gpus, free_memory, held.alone = [], [], 0, row["name"]
                    held.holders.append(row["name"])
                else:
                    spec = _assign(row["launch"], request, free_cores[: request.cores], free_gpus[: request.gpus])
                    free_cores, free_gpus = free_cores[request.cores :], free_gpus[request.gpus :]
                    free_memory -= request.memory
                db.execute("UPDATE jobs SET status = ?, reason = ?, message = ?, launch = ? WHERE name = ?",
                           (types.CREATED, "Admitted", _admitted_message(row), json.dumps(spec), row["name"]))
                if row["reason"] == WAITING_REASON:
                    store.add_event(row["name"], "Admitted", f"resources free after {now - row['created']:.0f}s in the queue")
                admitted.append(row["name"])
                continue
            if blocked_at is None:
                blocked_at = position
            if row["scaled"]:
                message = _alone_waiting_message(held.active + admitted)
            else:
                message = _waiting_message(request, machine, len(free_cores), len(free_gpus), free_memory)
            message += _queue_words(row, ahead=position - blocked_at)
            if held.holders and not row["scaled"]:
                shown = ", ".join(held.holders[:3]) + (f" and {len(held.holders) - 3} more" if len(held.holders) > 3 else "")
                message += f"; held by {shown}"
                if held.alone is not None:
                    message += f" ({held.alone} runs alone, scaled to this machine)"
            if (row["reason"], row["message"]) != (WAITING_REASON, message):
                db.execute("UPDATE jobs SET reason = ?, message = ? WHERE name = ?", (WAITING_REASON, message, row["name"]))
            if row["reason"] != WAITING_REASON:
                store.add_event(row["name"], "Queued", message)
    return admitted


def _held(db: Any) -> _Held:
    """What the active jobs hold (:class:`_Held`)."""
    held = _Held()
    marks = ", ".join("?" * len(ACTIVE_STATUSES))
    for row in db.execute(f"SELECT name, memory_bytes, launch, scaled FROM jobs WHERE status IN ({marks})",
                          ACTIVE_STATUSES):
        spec = ProcessSpec.from_dict(json.loads(row["launch"]))
        holds = False
        for node in spec.nodes:
            held.cores.update(node.cpus)
            visible = node.env.get("CUDA_VISIBLE_DEVICES", "")
            held.gpus.update(g for g in visible.split(",") if g)
            holds = holds or bool(node.cpus) or bool(visible)
        held.active.append(row["name"])
        if row["scaled"]:
            held.alone = row["name"]
        held.memory += row["memory_bytes"]
        if holds or row["memory_bytes"] or row["scaled"]:
            held.holders.append(row["name"])
    return held


def _assign(spec_json: str, request: Request, cores: list[int], gpus: list[str]) -> dict[str, Any]:
    """The process spec with each node pinned to its own share of ``cores`` and ``gpus``."""
    spec = ProcessSpec.from_dict(json.loads(spec_json))
    for node in spec.nodes:
        i = node.index
        if request.cores_per_node:
            node.cpus = cores[i * request.cores_per_node : (i + 1) * request.cores_per_node]
        if request.gpus_per_node:
            node.env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * request.gpus_per_node : (i + 1) * request.gpus_per_node])
    return spec.to_dict()


def _admitted_message(row: Any) -> str:
    words = [f"queue {row['queue_name']}"] if row["queue_name"] else []
    if row["priority_source"]:
        words.append(Priority(row["priority"], row["priority_source"]).describe())
    return "admitted by the local queue" + (f" ({', '.join(words)})" if words else "")


def _queue_words(row: Any, ahead: int) -> str:
    """The queue name, priority and place of a waiting job, as its message ends (``""`` when all are defaults)."""
    words = ""
    if row["queue_name"]:
        words += f"; queue {row['queue_name']}"
    if row["priority_source"]:
        words += "; " + Priority(row["priority"], row["priority_source"]).describe()
    if ahead:
        words += f"; {ahead} job(s) ahead in the queue"
    return words


def _waiting_message(request: Request, machine: Machine, free_cores: int, free_gpus: int, free_memory: int) -> str:
    wants = []
    if request.cores:
        wants.append(f"{request.cores} CPU(s) ({free_cores} of {len(machine.cores)} free)")
    if request.memory:
        wants.append(f"{format_bytes(request.memory)} of memory ({format_bytes(max(0, free_memory))} of "
                     f"{format_bytes(machine.memory)} free)")
    if request.gpus:
        wants.append(f"{request.gpus} GPU(s) ({free_gpus} of {len(machine.gpus)} free)")
    return "waiting for " + ", ".join(wants)


def _alone_waiting_message(running: list[str]) -> str:
    shown = ", ".join(running[:3]) + (f" and {len(running) - 3} more" if len(running) > 3 else "")
    message = "waiting for the machine to be free: the job is bigger than this machine, so it runs alone, scaled to it"
    return message + (f"; running: {shown}" if running else "")


def format_bytes(count: int) -> str:
    """``34359738368`` -> ``32Gi``: a byte count as the Kubernetes quantity people write, 3 significant digits."""
    for unit, size in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count}B"
