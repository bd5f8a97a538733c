"""Job commands: ``list``, ``get``, ``describe``, ``events``, ``delete``, ``suspend``, ``resume``, ``runtimes``
(here); ``run``, ``apply``, ``logs``, ``wait`` (:mod:`trainjob.cli.jobs_run`); ``submit`` (:mod:`trainjob.cli.arena`)
and ``top`` (:mod:`trainjob.cli.top`).

Every command takes ``--backend local|kubernetes`` and, for Kubernetes, ``-n/--namespace``, ``--kubeconfig`` and
``--context`` (defaults from ``$TRAINJOB_BACKEND`` and the config file); errors and exit codes as
:mod:`trainjob.cli.plumbing` says.
"""

from __future__ import annotations

import json
from typing import Any

import click

from trainjob.cli.plumbing import (
    EXIT_BAD_INPUT,
    Target,
    backend_option,
    fail,
    handle_errors,
    make_backend,
    note,
)
from trainjob.errors import NotFoundError, ValidationError


@click.command("list")
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json", "yaml", "name"]), default="table",
              show_default=True, help="table; wide: also restarts, reason and labels; json/yaml: the TrainJobs as a "
              "List; name: trainjob/NAME lines.")
@click.option("-l", "--selector", metavar="SELECTOR",
              help="Only jobs whose metadata.labels match: key=value, key!=value, key, !key, key in (a,b); "
                   "comma-separated, all must hold.")
@click.option("-w", "--watch", is_flag=True, help="After listing, print jobs again as they change (Ctrl-C stops).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="With --watch: stop watching after this long (exit 0).")
@backend_option
@handle_errors
def list_command(output: str, selector: str | None, watch: bool, timeout: float | None, backend: Target) -> None:
    """List jobs: name, status, nodes x processes, runtime, progress, age, duration (kubectl get style)."""
    from trainjob.cli import listing

    matches = None
    if selector is not None:
        from trainjob.cli.selectors import parse_selector

        matches = parse_selector(selector)
    client = make_backend(backend)
    if watch:
        listing.watch(client, output, matches, timeout)
    else:
        listing.print_once(client, output, matches)


#: Kinds ``get KIND NAME`` and ``describe KIND NAME`` take, as kubectl spells them.
TRAINJOB_KINDS = ("trainjob", "trainjobs", "tj", "trainjob.trainer.kubeflow.org")
PYTORCHJOB_KINDS = ("pytorchjob", "pytorchjobs", "pytorchjob.kubeflow.org")


def job_name_for(kind: str, name: str, client: Any) -> str:
    """The TrainJob ``get KIND NAME`` means: ``NAME`` itself, which for a PyTorchJob must be one converted from a
    PyTorchJob (it keeps the PyTorchJob's name); :class:`NotFoundError` or :class:`ValidationError` otherwise."""
    kind = kind.lower()
    if kind in TRAINJOB_KINDS:
        return name
    if kind not in PYTORCHJOB_KINDS:
        raise ValidationError("KIND", f"unknown kind {kind!r}; use trainjob or pytorchjob (or no kind)")
    from trainjob.convert import converted_from

    job = client.get_job(name)  # NotFoundError names the job
    annotations = ((job.resource or {}).get("metadata") or {}).get("annotations")
    if not converted_from(annotations):
        raise NotFoundError(f"pytorchjob {name!r} not found: trainjob/{name} exists but was not converted from a "
                            f"PyTorchJob (`trainjob get {name}` shows it)")
    return name


@click.command("get")
@click.argument("kind_and_name", nargs=-1, required=True, metavar="[KIND] NAME")
@click.option("-o", "--output", type=click.Choice(["text", "yaml", "json"]), default="text", show_default=True,
              help="text: a summary; yaml/json: the TrainJob resource with its status.")
@backend_option
@handle_errors
def get_command(kind_and_name: tuple[str, ...], output: str, backend: Target) -> None:
    """Show one job; `get pytorchjob NAME` shows the TrainJob a PyTorchJob was converted into."""
    if len(kind_and_name) > 2:
        raise ValidationError("NAME", f"give one job (NAME or KIND NAME), got {' '.join(kind_and_name)!r}")
    client = make_backend(backend)
    name = kind_and_name[-1] if len(kind_and_name) == 1 else job_name_for(*kind_and_name, client)
    job = client.get_job(name)
    if output == "json":
        click.echo(json.dumps(job.resource, indent=2))
    elif output == "yaml":
        import yaml

        click.echo(yaml.safe_dump(job.resource, sort_keys=False).rstrip())
    else:
        from trainjob.cli.jobs_format import describe

        click.echo(describe(job))


@click.command("events")
@click.argument("name")
@backend_option
@handle_errors
def events_command(name: str, backend: Target) -> None:
    """Show what happened to a job, oldest first."""
    from trainjob.cli.jobs_format import table

    events = make_backend(backend).get_job_events(name)
    rows = [
        [e.event_time.strftime("%H:%M:%S"), e.type, e.reason, f"{e.involved_object_kind}/{e.involved_object_name}", e.message]
        for e in events
    ]
    click.echo(table(["TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"], rows))


@click.command("describe")
@click.argument("names", nargs=-1, required=True, metavar="[trainjob|pytorchjob] NAME...")
@backend_option
@handle_errors
def describe_command(names: tuple[str, ...], backend: Target) -> None:
    """Show jobs in detail, as kubectl describe does: spec, status, conditions, nodes and ranks, events."""
    from trainjob.cli.describe import describe_job

    client = make_backend(backend)
    if len(names) > 1 and names[0].lower() in (*TRAINJOB_KINDS, *PYTORCHJOB_KINDS):
        names = tuple(job_name_for(names[0], name, client) for name in names[1:])  # `describe KIND NAME`, as kubectl
    click.echo("\n\n".join(describe_job(client, name) for name in names))


@click.command("delete")
@click.argument("names", nargs=-1)
@click.option("--all", "all_jobs", is_flag=True, help="Delete every job (of the namespace, on Kubernetes).")
@click.option("-l", "--selector", metavar="SELECTOR", help="Delete the jobs whose labels match (see `list -l`).")
@backend_option
@handle_errors
def delete_command(names: tuple[str, ...], all_jobs: bool, selector: str | None, backend: Target) -> None:
    """Delete jobs: stop every process they started and remove their state and logs.

    Jobs that exist are deleted even when others named do not; those are reported and the exit code is 2.
    """
    if bool(names) + all_jobs + (selector is not None) != 1:
        raise ValidationError("NAME", "give job names, --all, or -l SELECTOR (one of them)")
    client = make_backend(backend)
    if not names:
        from trainjob.cli.listing import selected
        from trainjob.cli.selectors import parse_selector

        matches = parse_selector(selector) if selector is not None else None
        names = tuple(job.name for job, _ in selected(client, matches))
        if not names:
            note("No jobs found" + (f" matching {selector!r}" if selector else ""))
            return
    missing = []
    for name in dict.fromkeys(names):
        try:
            client.delete_job(name)
        except NotFoundError:
            missing.append(name)
            continue
        click.echo(f"trainjob/{name} deleted")
    if missing:
        fail("\n".join(f"trainjob/{name} not found" for name in missing), EXIT_BAD_INPUT)


@click.command("suspend")
@click.argument("name")
@backend_option
@handle_errors
def suspend_command(name: str, backend: Target) -> None:
    """Stop a job's processes but keep the job; resume starts them again."""
    make_backend(backend).suspend_job(name)
    click.echo(f"trainjob/{name} suspended")


@click.command("resume")
@click.argument("name")
@backend_option
@handle_errors
def resume_command(name: str, backend: Target) -> None:
    """Start a suspended job again."""
    make_backend(backend).resume_job(name)
    click.echo(f"trainjob/{name} resumed")


@click.command("runtimes")
@backend_option
@handle_errors
def runtimes_command(backend: Target) -> None:
    """List the runtimes jobs can use."""
    from trainjob.cli.jobs_format import table

    runtimes = make_backend(backend).list_runtimes()
    rows = [[r.name, r.trainer.framework, str(r.trainer.num_nodes), r.trainer.device_count, r.trainer.image] for r in runtimes]
    click.echo(table(["NAME", "FRAMEWORK", "NODES", "PROCS/NODE", "IMAGE"], rows))


def register(group: click.Group) -> None:
    """Add the job commands to the ``trainjob`` group (the ``trainjob`` command itself finds them through
    :data:`trainjob.cli.main.COMMANDS`, importing each module only when its command runs)."""
    from trainjob.cli import arena, jobs_run, top

    for command in (list_command, get_command, describe_command, events_command, delete_command, suspend_command,
                    resume_command, runtimes_command):
        group.add_command(command)
    jobs_run.register(group)
    arena.register(group)
    top.register(group)
