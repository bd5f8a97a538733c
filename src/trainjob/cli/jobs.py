"""Job commands: ``list``, ``get``, ``events``, ``delete``, ``suspend``, ``resume``, ``runtimes`` (here) and
``run``, ``apply``, ``logs``, ``wait`` (:mod:`trainjob.cli.jobs_run`).

Every command takes ``--backend local|kubernetes`` (default ``$TRAINJOB_BACKEND``, else ``local``). Errors print
one line to stderr; exit codes: 0 ok, 1 the job or operation failed, 2 bad input, 3 timeout, 130 interrupted.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from trainjob.errors import AlreadyExistsError, JobFailedError, NotFoundError, TrainJobError, ValidationError

#: Exit codes of every ``trainjob`` command (one table for the CLI).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 3
EXIT_INTERRUPTED = 130
BACKENDS = ("local", "kubernetes")

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(command: F) -> F:
    """Turn trainjob errors into one line on stderr and the documented exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (ValidationError, NotFoundError, AlreadyExistsError) as exc:
            fail(str(exc).replace("\n", "; "), EXIT_BAD_INPUT)
        except JobFailedError as exc:
            fail(str(exc), EXIT_FAILED)
        except TimeoutError as exc:
            fail(str(exc), EXIT_TIMEOUT)
        except TrainJobError as exc:
            fail(str(exc), EXIT_FAILED)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)

    return wrapper  # type: ignore[return-value]


def backend_option(command: F) -> F:
    return click.option(
        "--backend",
        type=click.Choice(BACKENDS),
        default="local",
        envvar="TRAINJOB_BACKEND",
        show_default=True,
        help="Where jobs run: processes on this machine, or a Kubernetes cluster.",
    )(command)


def make_backend(kind: str) -> Any:
    """A backend of ``kind``; the Kubernetes one is imported only when asked for."""
    from trainjob.client import backend_for

    if kind == "kubernetes":
        from trainjob.backends.kubernetes.config import KubernetesBackendConfig

        return backend_for(KubernetesBackendConfig())
    return backend_for(None)


@click.command("list")
@backend_option
@handle_errors
def list_command(backend: str) -> None:
    """List jobs: name, status, nodes x processes, runtime, progress, age, duration."""
    import time

    from trainjob.cli.jobs_format import LIST_HEADER, list_rows, summary_rows, table

    client = make_backend(backend)
    fast = getattr(client, "list_summaries", None)  # the local backend lists without building job objects
    rows = summary_rows(fast(), time.time()) if fast else list_rows(client.list_jobs())
    sys.stdout.write(table(LIST_HEADER, rows) + "\n")


@click.command("get")
@click.argument("name")
@click.option("-o", "--output", type=click.Choice(["text", "yaml", "json"]), default="text", show_default=True,
              help="text: a summary; yaml/json: the TrainJob resource with its status.")
@backend_option
@handle_errors
def get_command(name: str, output: str, backend: str) -> None:
    """Show one job."""
    job = make_backend(backend).get_job(name)
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
def events_command(name: str, backend: str) -> None:
    """Show what happened to a job, oldest first."""
    from trainjob.cli.jobs_format import table

    events = make_backend(backend).get_job_events(name)
    rows = [
        [e.event_time.strftime("%H:%M:%S"), e.type, e.reason, f"{e.involved_object_kind}/{e.involved_object_name}", e.message]
        for e in events
    ]
    click.echo(table(["TIME", "TYPE", "REASON", "OBJECT", "MESSAGE"], rows))


@click.command("delete")
@click.argument("names", nargs=-1, required=True)
@backend_option
@handle_errors
def delete_command(names: tuple[str, ...], backend: str) -> None:
    """Delete jobs: stop every process they started and remove their state and logs."""
    client = make_backend(backend)
    for name in names:
        client.get_job(name)
    for name in names:
        client.delete_job(name)
        click.echo(f"trainjob/{name} deleted")


@click.command("suspend")
@click.argument("name")
@backend_option
@handle_errors
def suspend_command(name: str, backend: str) -> None:
    """Stop a job's processes but keep the job; resume starts them again."""
    make_backend(backend).suspend_job(name)
    click.echo(f"trainjob/{name} suspended")


@click.command("resume")
@click.argument("name")
@backend_option
@handle_errors
def resume_command(name: str, backend: str) -> None:
    """Start a suspended job again."""
    make_backend(backend).resume_job(name)
    click.echo(f"trainjob/{name} resumed")


@click.command("runtimes")
@backend_option
@handle_errors
def runtimes_command(backend: str) -> None:
    """List the runtimes jobs can use."""
    from trainjob.cli.jobs_format import table

    runtimes = make_backend(backend).list_runtimes()
    rows = [[r.name, r.trainer.framework, str(r.trainer.num_nodes), r.trainer.device_count, r.trainer.image] for r in runtimes]
    click.echo(table(["NAME", "FRAMEWORK", "NODES", "PROCS/NODE", "IMAGE"], rows))


def register(group: click.Group) -> None:
    """Add the job commands to the ``trainjob`` group."""
    from trainjob.cli import jobs_run

    for command in (list_command, get_command, events_command, delete_command, suspend_command, resume_command,
                    runtimes_command):
        group.add_command(command)
    jobs_run.register(group)
