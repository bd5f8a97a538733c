"""``trainjob describe NAME``: one job in full, laid out as ``kubectl describe`` lays out an object.

Name, namespace, labels and annotations; the spec as submitted (runtime, nodes and processes, command, resources,
environment); status, progress and timings; the conditions; each node with the global ranks it runs; the events,
oldest first with their age::

    print(describe_job(backend, "mnist"))
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from typing import Any

from trainjob.backends.base import restarts_by_reason
from trainjob.cli.jobs_format import human_duration, job_duration, progress_text, table
from trainjob.constants import RUNTIME_SNAPSHOT_ANNOTATION
from trainjob.sdk import types

_INDENT = "  "


def describe_job(client: Any, name: str, now: datetime | None = None) -> str:
    """The describe text of job ``name`` on ``client``'s backend."""
    now = now or datetime.now(UTC)
    job = client.get_job(name)
    events = client.get_job_events(name)
    resource = job.resource or {}
    meta = resource.get("metadata") or {}
    spec = resource.get("spec") or {}
    trainer = spec.get("trainer") or {}
    lines = [
        _field("Name", job.name),
        _field("Namespace", meta.get("namespace", "default")),
        _field("Labels", _mapping(meta.get("labels"))),
        _field("Annotations", _mapping({k: v for k, v in (meta.get("annotations") or {}).items()
                                        if not k.startswith(RUNTIME_SNAPSHOT_ANNOTATION)})),
        _field("Runtime", job.runtime_name),
        _field("Status", job.status + (f" ({job.reason})" if job.reason and job.reason != job.status else "")),
    ]
    if job.message:
        lines.append(_field("Message", job.message))
    lines += [
        _field("Created", f"{_when(job.creation_timestamp)} ({human_duration((now - job.creation_timestamp).total_seconds())} ago)"),
        _field("Started", _when(job.start_time)),
        _field("Finished", _when(job.completion_time)),
        _field("Duration", human_duration(job_duration(job, now))),
        _field("Restarts", _restarts(job)),
        _field("Progress", progress_text(job.progress)),
    ]
    if job.progress and job.progress.metrics:
        lines.append(_field("Metrics", " ".join(f"{k}={v:.6g}" if v is not None else f"{k}=nan"
                                                 for k, v in job.progress.metrics.items())))
    lines.append("Spec:")
    requested = trainer.get("numProcPerNode")
    shape = f"{job.num_nodes} x {job.num_proc_per_node or '?'} process(es)"
    if requested is not None and requested != job.num_proc_per_node:
        shape += f" (numProcPerNode: {requested})"
    command = [*trainer.get("command", []), *trainer.get("args", [])]
    lines += [
        _field("Nodes", shape, 1),
        _field("Command", shlex.join(str(c) for c in command) if command else "<the runtime's>", 1),
        _field("Image", trainer.get("image") or "<the runtime's>", 1),
        _field("Resources", _resources(trainer.get("resourcesPerNode")), 1),
        _field("Env", _env(trainer.get("env")), 1),
        _field("Suspend", str(bool(spec.get("suspend"))).lower(), 1),
    ]
    conditions = (resource.get("status") or {}).get("conditions") or []
    lines.append("Conditions:" + ("" if conditions else " <none>"))
    if conditions:
        rows = [[c.get("type", ""), c.get("status", ""), c.get("reason", "") or "-", c.get("lastTransitionTime", "") or "-",
                 c.get("message", "") or ""] for c in conditions]
        lines += _indented(table(["TYPE", "STATUS", "REASON", "LAST TRANSITION", "MESSAGE"], rows))
    lines.append("Nodes:")
    lines += _indented(table(*_nodes(client, job)))
    lines.append("Events:" + ("" if events else " <none>"))
    if events:
        rows = [[e.type, e.reason, human_duration((now - e.event_time).total_seconds()),
                 f"{e.involved_object_kind}/{e.involved_object_name}", e.message] for e in events]
        lines += _indented(table(["TYPE", "REASON", "AGE", "FROM", "MESSAGE"], rows))
    return "\n".join(lines)


def _nodes(client: Any, job: types.TrainJob) -> tuple[list[str], list[list[str]]]:
    """One row per node: the global ranks it runs, its status and, locally, its process and exit code."""
    procs = job.num_proc_per_node
    steps = {step.name: step for step in job.steps}
    processes = client.node_processes(job.name)  # nodes that are processes here: pids and exit codes
    local = {f"node-{index}": process for index, process in (processes or {}).items()}
    header = ["NODE", "RANKS", "STATUS", "PID" if processes is not None else "POD", "EXIT CODE"]
    rows = []
    for index in range(job.num_nodes):
        node = f"node-{index}"
        ranks = "?" if not procs else (f"{index * procs}" if procs == 1 else f"{index * procs}-{index * procs + procs - 1}")
        step = steps.get(node)
        process = local.get(node)
        status = (step.status if step else None) or (process.status if process else None) or "-"
        where = str((process.pid if process else None) or "-") if processes is not None else (
            step.pod_name if step else "-")
        code = process.exit_code if process else None
        rows.append([node, ranks, status, where, "-" if code is None else str(code)])
    return header, rows


def _restarts(job: types.TrainJob) -> str:
    """``3 (1 after a failure, 2 after a disruption: not counted against maxRestarts)``; the count alone where the
    backend keeps no reasons (the local backend)."""
    counts = restarts_by_reason((job.resource.get("metadata") or {}).get("annotations"))
    parts = [f"{n} after a {why}" + (": not counted against maxRestarts" if why == "disruption" else "")
             for why, n in counts.items() if n]
    return f"{job.restarts} ({', '.join(parts)})" if job.restarts and parts else str(job.restarts)


def _field(label: str, value: str, level: int = 0) -> str:
    width = 14 - 2 * level
    return f"{_INDENT * level}{label + ':':<{width}}{value}"


def _indented(text: str) -> list[str]:
    return [_INDENT + line for line in text.splitlines()]


def _mapping(values: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((values or {}).items())) or "<none>"


def _resources(resources: dict[str, Any] | None) -> str:
    if not resources:
        return "<none>"
    parts = []
    for kind in ("requests", "limits"):
        if resources.get(kind):
            parts.append(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in resources[kind].items()))
    return "; ".join(parts) or "<none>"


def _env(env: list[dict[str, Any]] | None) -> str:
    if not env:
        return "<none>"
    shown = [f"{e.get('name')}={_short(str(e['value']))}" if "value" in e else f"{e.get('name')} (from a source)"
             for e in env]
    return ", ".join(shown)


def _short(value: str, limit: int = 60) -> str:
    value = value.replace("\n", "\\n")
    return value if len(value) <= limit else value[: limit - 3] + "..."


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")
