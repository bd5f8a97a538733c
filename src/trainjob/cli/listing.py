"""``trainjob list`` output, once or watched (``-w``): table, wide, json, yaml or name, filtered by labels.

The plain table of the local backend comes from one narrow query (thousands of jobs list in milliseconds); the
other formats and label selectors read each job's resource. A watch prints the table, then one row for each job
whose status, shape, restarts or reason changed (``Deleted`` for a job that went away), as ``kubectl get -w``
does; progress and ages change all the time and are left to ``trainjob top`` and ``trainjob wait``::

    print_once(backend, "wide", parse_selector("team=vision"))
    watch(backend, "table", None, timeout=60)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click

from trainjob.cli.jobs_format import LIST_HEADER, list_rows, summary_rows, table
from trainjob.cli.plumbing import note
from trainjob.errors import NotFoundError
from trainjob.json_text import indented_json, indented_json_list
from trainjob.sdk import types

WATCH_POLL_SECONDS = 1.0
WIDE_HEADER = [*LIST_HEADER, "RESTARTS", "REASON", "LABELS"]
Matcher = Callable[[dict[str, str]], bool]


def job_resource(client: Any, job: types.TrainJob) -> dict[str, Any] | None:
    """The job's TrainJob resource (the local backend lists without them: read the job); ``None`` when gone."""
    if job.resource:
        return job.resource
    try:
        return client.get_job(job.name).resource
    except NotFoundError:
        return None


def job_labels(resource: dict[str, Any] | None) -> dict[str, str]:
    return dict(((resource or {}).get("metadata") or {}).get("labels") or {})


def selected(client: Any, matches: Matcher | None) -> list[tuple[types.TrainJob, dict[str, Any]]]:
    """Jobs (with their resources) whose labels ``matches`` accepts, oldest first.

    A backend that can list jobs with their resources in one read (the local one) does; others' ``list_jobs``
    carry the resources already, or each job is read for it."""
    with_resources = getattr(client, "list_jobs_with_resources", None)
    found = []
    for job in with_resources() if with_resources is not None else client.list_jobs():
        resource = job_resource(client, job)
        if resource is not None and (matches is None or matches(job_labels(resource))):
            found.append((job, resource))
    return found


def selected_resources(client: Any, matches: Matcher | None) -> list[dict[str, Any]]:
    """The resources of the jobs :func:`selected` gives; read in one pass where the backend can (the local one)."""
    list_resources = getattr(client, "list_resources", None)
    if list_resources is None:
        return [resource for _, resource in selected(client, matches)]
    return [resource for resource in list_resources() if matches is None or matches(job_labels(resource))]


def _rows(pairs: list[tuple[types.TrainJob, dict[str, Any]]], wide: bool) -> list[list[str]]:
    rows = list_rows([job for job, _ in pairs])
    if wide:
        for row, (job, resource) in zip(rows, pairs, strict=True):
            labels = ",".join(f"{k}={v}" for k, v in sorted(job_labels(resource).items())) or "<none>"
            row += [str(job.restarts), job.reason or "-", labels]
    return rows


def _document(resources: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": resources}


def _dump(data: Any, output: str) -> str:
    if output == "json":
        return indented_json(data)
    import yaml

    return yaml.safe_dump(data, sort_keys=False).rstrip()


def print_once(client: Any, output: str, matches: Matcher | None) -> None:
    if output == "table" and matches is None:
        click.echo(table(LIST_HEADER, summary_rows(client.list_summaries(), time.time())))
        return
    if output == "json" and matches is None and hasattr(client, "list_resource_texts"):
        # The local backend keeps each job's text; written as is (click.echo would scan megabytes for colours).
        sys.stdout.write(indented_json_list(client.list_resource_texts(), _document([]), "items") + "\n")
        return
    if output in ("json", "yaml"):
        click.echo(_dump(_document(selected_resources(client, matches)), output))
        return
    if output == "name":
        for resource in selected_resources(client, matches):
            click.echo(f"trainjob/{resource['metadata']['name']}")
        return
    pairs = selected(client, matches)
    if not pairs and matches is not None:
        note("No jobs found matching the selector")
    else:
        click.echo(table(WIDE_HEADER if output == "wide" else LIST_HEADER, _rows(pairs, output == "wide")))


def watch(client: Any, output: str, matches: Matcher | None, timeout: float | None,
          poll: float = WATCH_POLL_SECONDS) -> None:
    """Print the jobs, then every change, until ``timeout`` seconds have passed (or Ctrl-C)."""
    wide = output == "wide"
    header = WIDE_HEADER if wide else LIST_HEADER
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: dict[str, tuple[Any, ...]] = {}
    widths: list[int] | None = None
    first = True
    while True:
        pairs = selected(client, matches)
        rows = _rows(pairs, wide)
        changed = []
        for (job, resource), row in zip(pairs, rows, strict=True):
            key = (job.status, job.num_nodes, job.num_proc_per_node, job.restarts, job.reason, row[-1] if wide else "")
            if seen.get(job.name) != key:
                seen[job.name] = key
                changed.append((job, resource, row))
        for name in [n for n in seen if n not in {job.name for job, _ in pairs}]:
            del seen[name]
            gone = [name, "Deleted"] + ["-"] * (len(header) - 2)
            changed.append((None, None, gone))
        if output in ("json", "yaml"):
            for _, resource, _row in changed:
                if resource is None:
                    continue
                click.echo(("---\n" if output == "yaml" else "") + _dump(resource, output))
        elif output == "name":
            for _, _, row in changed:
                click.echo(f"trainjob/{row[0]}")
        elif changed or first:
            if widths is None:  # columns sized on the first listing, wider later only when a value needs it
                widths = [len(h) for h in header]
            for _, _, row in changed:
                widths = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
            lines = ([header] if first else []) + [row for _, _, row in changed]
            for line in lines:
                click.echo("   ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
        first = False
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))
