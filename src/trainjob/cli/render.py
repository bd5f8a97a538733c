"""``trainjob render``: print the Kubernetes objects (or the plan) a TrainJob resolves into, without running it.

    trainjob render -f job.yaml                     # JobSet (+ PodGroup) as YAML
    trainjob render -f job.yaml -f runtime.yaml     # with a runtime that is not built in
    trainjob render -f job.yaml --plan              # the backend-neutral plan
    trainjob render -f pytorchjob.yaml              # a kubeflow.org/v1 PyTorchJob, converted first
    cat job.yaml | trainjob render -f -             # from stdin

Bad input (unreadable, malformed or oversized file, unknown runtime, invalid field) exits with status 2 and one
line per problem on stderr, each naming the file and the field path; quoted values are cut short.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from trainjob.cli.plumbing import EXIT_BAD_INPUT, STDIN, fail
from trainjob.errors import NotFoundError, ValidationError

if TYPE_CHECKING:  # the API (pydantic) loads when the command runs, keeping every other command's start fast
    from trainjob.api import TrainJob
    from trainjob.api.io import Resource


def register(group: click.Group) -> None:
    """Add this module's commands to the ``trainjob`` group."""
    group.add_command(render)


@click.command()
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML file with TrainJobs and/or (Cluster)TrainingRuntimes ('-' reads stdin); repeat for several files. "
    "kubeflow.org/v1 PyTorchJobs are converted first (trainjob convert).",
)
@click.option(
    "--plan", "show_plan", is_flag=True, help="Print the resolved plan instead of Kubernetes objects."
)
def render(filenames: tuple[Path, ...], show_plan: bool) -> None:
    """Print the JobSet and PodGroup that each TrainJob in the files resolves into."""
    from trainjob.api import TrainJob, dump_yaml
    from trainjob.runtime import find_runtime, resolve
    from trainjob.runtime.render import render_objects

    jobs: list[tuple[Path, TrainJob]] = []
    runtimes: list[Resource] = []
    for path in filenames:
        for resource in _load(path):
            if isinstance(resource, TrainJob):
                jobs.append((path, resource))
            else:
                runtimes.append(resource)
    if not jobs:
        _fail(f"{', '.join(map(str, filenames))}: no TrainJob found (kind: TrainJob)")
    from trainjob.cli.convert import report_converted_jobs

    report_converted_jobs([job for _, job in jobs])
    documents: list[dict] = []
    for path, job in jobs:
        try:
            runtime = find_runtime(job.spec.runtime_ref, runtimes, namespace=job.namespace)
            plan = resolve(job, runtime)
            documents.extend([plan.to_dict()] if show_plan else render_objects(plan))
        except (ValidationError, NotFoundError) as exc:
            _fail(_located(path, job, exc))
    click.echo(dump_yaml(documents), nl=False)


def _load(path: Path) -> list[Resource]:
    from trainjob.convert import load_resources

    try:
        if str(path) == "-":
            return load_resources(sys.stdin, name=STDIN)  # read up to the size limit, never more
        return load_resources(path)
    except ValidationError as exc:
        label = STDIN if str(path) == "-" else str(path)
        lines = str(exc).splitlines()
        _fail("\n".join(line if line.startswith(label) else f"{label}: {line}" for line in lines))


def _located(path: Path, job: TrainJob, exc: Exception) -> str:
    lines = str(exc).splitlines() or [type(exc).__name__]
    return "\n".join(f"{path}: TrainJob {job.name}: {line}" for line in lines)


def _fail(message: str) -> NoReturn:
    fail(message, EXIT_BAD_INPUT)
