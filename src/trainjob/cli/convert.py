"""``trainjob convert``: print the TrainJob (and TrainingRuntime) a Kubeflow v1 PyTorchJob becomes.

    trainjob convert -f pytorchjob.yaml               # YAML: runtime (when needed), then the TrainJob
    trainjob convert -f pytorchjob.yaml -o json       # one object, or a v1 List of several
    kubectl get pytorchjob x -o yaml | trainjob convert -f -

Every document of the files must be a ``kubeflow.org/v1`` PyTorchJob. What the conversion cannot carry over is
printed to stderr as ``warning:`` lines (and kept in the TrainJob's ``trainjob/conversion-warnings``
annotation); ``apply``, ``render`` and ``check`` take PyTorchJobs directly, converting them the same way. Bad
input exits with status 2, naming the file, the document and the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from trainjob.cli.plumbing import EXIT_BAD_INPUT, STDIN, fail, note
from trainjob.errors import ValidationError

if TYPE_CHECKING:  # the API (pydantic) loads when the command runs
    from trainjob.api import TrainJob
    from trainjob.convert import Conversion


def register(group: click.Group) -> None:
    """Add ``convert`` to the ``trainjob`` group."""
    group.add_command(convert)


@click.command()
@click.option("-f", "--filename", "filenames", multiple=True, required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="YAML file with kubeflow.org/v1 PyTorchJobs ('-' reads stdin); repeatable.")
@click.option("-o", "--output", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="yaml: documents separated by ---; json: one object, or a List of several.")
def convert(filenames: tuple[Path, ...], output: str) -> None:
    """Convert Kubeflow Training Operator v1 PyTorchJobs into TrainJobs (+ TrainingRuntimes)."""
    from trainjob.api.io import dump_yaml, to_yaml_dict

    conversions = [c for path in filenames for c in convert_file(path)]
    documents = [to_yaml_dict(r) for c in conversions for r in c.resources]
    for conversion in conversions:
        report_conversion(conversion)
    if output == "json":
        single = documents[0] if len(documents) == 1 else {"apiVersion": "v1", "kind": "List", "items": documents}
        click.echo(json.dumps(single, indent=2))
    else:
        click.echo(dump_yaml(documents), nl=False)


def convert_file(path: Path) -> list[Conversion]:
    """The conversions of every document of ``path`` (``-``: stdin); exits 2 naming the problem."""
    from trainjob.api import read_documents
    from trainjob.api.errors import quote
    from trainjob.api.io import is_pytorchjob
    from trainjob.convert import convert_pytorchjob

    label = STDIN if str(path) == "-" else str(path)
    try:
        documents = read_documents(sys.stdin, name=STDIN) if str(path) == "-" else read_documents(path)
    except ValidationError as exc:
        _fail("\n".join(line if line.startswith(label) else f"{label}: {line}" for line in str(exc).splitlines()))
    if not documents:
        _fail(f"{label}: no documents (expected kubeflow.org/v1 PyTorchJobs)")
    conversions = []
    problems = []
    for index, document in enumerate(documents):
        where = f"{label}: " + (f"documents[{index}]: " if len(documents) > 1 else "")
        if not is_pytorchjob(document):
            kind = document.get("kind") if isinstance(document, dict) else None
            version = document.get("apiVersion") if isinstance(document, dict) else None
            problems.append(f"{where}kind: convert takes kubeflow.org/v1 PyTorchJobs, got {quote(kind)} "
                            f"{quote(version)} (TrainJobs need no conversion: trainjob apply -f)")
            continue
        try:
            conversions.append(convert_pytorchjob(document))
        except ValidationError as exc:
            problems += [f"{where}{line}" for line in str(exc).splitlines()]
    if problems:
        _fail("\n".join(problems))
    return conversions


def report_conversion(conversion: Conversion) -> None:
    """``note: converted from ...`` and one ``warning:`` line per field not carried over, on stderr."""
    note(f"note: {conversion.note}")
    for warning in conversion.warnings:
        note(f"warning: PyTorchJob {conversion.source_name}: {warning}")


def report_converted_jobs(jobs: list[TrainJob]) -> None:
    """The same lines for TrainJobs that ``load_resources`` converted (found by their annotations)."""
    from trainjob.convert import conversion_warnings, converted_from

    for job in jobs:
        origin = converted_from(job.metadata.annotations)
        if origin is None:
            continue
        note(f"note: converted from {origin} {job.name}")
        for warning in conversion_warnings(job.metadata.annotations):
            note(f"warning: PyTorchJob {job.name}: {warning}")


def _fail(message: str) -> NoReturn:
    fail(message, EXIT_BAD_INPUT)
