"""YAML in and out: multi-document files or text become typed resources, resources become YAML again.

>>> [r.kind for r in load_resources('''
... apiVersion: trainer.kubeflow.org/v1alpha1
... kind: TrainJob
... metadata: {name: a}
... spec: {runtimeRef: {name: torch-distributed}}
... ''')]
['TrainJob']
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trainjob.api.common import API_VERSION
from trainjob.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from trainjob.api.trainjob import TrainJob
from trainjob.errors import ValidationError

#: Any resource this API knows.
Resource = TrainJob | TrainingRuntime | ClusterTrainingRuntime

KINDS: dict[str, type[Resource]] = {
    "TrainJob": TrainJob,
    "TrainingRuntime": TrainingRuntime,
    "ClusterTrainingRuntime": ClusterTrainingRuntime,
}


def resource_from_dict(data: Any) -> Resource:
    """The typed resource for a Kubernetes-shaped dict, chosen by ``kind``; checks ``apiVersion`` too."""
    if not isinstance(data, dict):
        raise ValidationError("", f"a resource must be a mapping, got {type(data).__name__}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise ValidationError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    api_version = data.get("apiVersion")
    if api_version != API_VERSION:
        raise ValidationError("apiVersion", f"must be {API_VERSION}, got {api_version!r}")
    return KINDS[kind].from_dict(data)


def read_documents(source: str | Path, *, name: str | None = None) -> list[Any]:
    """The YAML documents of a file (a :class:`~pathlib.Path`, or a one-line string naming an existing file or
    ending in ``.yaml``/``.yml``/``.json``) or of YAML text; empty documents are skipped. Errors name the file,
    or ``name`` (default ``<text>``) for text."""
    text, label = _read_source(source)
    label = name or label
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ValidationError("", f"{label}: not valid YAML: {_yaml_problem(exc)}") from None
    return [doc for doc in documents if doc is not None]


def load_resources(source: str | Path, *, name: str | None = None) -> list[Resource]:
    """Every resource in a multi-document YAML file or text, in order (``name`` labels text in errors).

    Errors in a file with several documents name the document: ``documents[1].spec.trainer.numNodes: ...``.
    """
    documents = read_documents(source, name=name)
    resources: list[Resource] = []
    problems: list[ValidationError] = []
    for index, document in enumerate(documents):
        try:
            resources.append(resource_from_dict(document))
        except ValidationError as exc:
            if len(documents) == 1:
                raise
            problems.extend(_prefixed(exc, f"documents[{index}]"))
    if problems:
        raise ValidationError.combine(problems)
    return resources


def to_yaml_dict(resource: Resource | dict[str, Any]) -> dict[str, Any]:
    """The plain dict of a resource (dicts pass through), ``apiVersion``/``kind``/``metadata``/``spec`` first."""
    data = resource if isinstance(resource, dict) else resource.to_dict()
    order = ["apiVersion", "kind", "metadata", "spec", "status"]
    return {k: data[k] for k in order if k in data} | {k: v for k, v in data.items() if k not in order}


def dump_yaml(resources: Resource | dict[str, Any] | Iterable[Resource | dict[str, Any]]) -> str:
    """Multi-document YAML for resources or plain Kubernetes dicts (rendered JobSets ...), ``---`` between them."""
    if isinstance(resources, dict | TrainJob | TrainingRuntime | ClusterTrainingRuntime):
        resources = [resources]
    return yaml.safe_dump_all(
        [to_yaml_dict(r) for r in resources], sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def _read_source(source: str | Path) -> tuple[str, str]:
    if isinstance(source, Path) or _looks_like_path(source):
        path = Path(source)
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise ValidationError("", f"{path}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValidationError("", f"{path}: cannot read: not UTF-8 text") from None
    return source, "<text>"


def _looks_like_path(source: str) -> bool:
    if "\n" in source:
        return False
    return source.endswith((".yaml", ".yml", ".json")) or Path(source).is_file()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _prefixed(exc: ValidationError, prefix: str) -> list[ValidationError]:
    return [ValidationError(f"{prefix}.{e.path}" if e.path else prefix, e.message) for e in exc.errors]
