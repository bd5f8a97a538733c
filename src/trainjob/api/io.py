"""YAML in and out: multi-document files or text become typed resources, resources become YAML again.

>>> [r.kind for r in load_resources('''
... apiVersion: trainer.kubeflow.org/v1alpha1
... kind: TrainJob
... metadata: {name: a}
... spec: {runtimeRef: {name: torch-distributed}}
... ''')]
['TrainJob']

Reading is held to :mod:`trainjob.api.limits` (size, depth, and nodes and text after aliases are expanded)
before any object is built. YAML is read as Kubernetes reads it: text is valid UTF-8, integers are 64-bit,
timestamps stay strings, a mapping key written twice is refused, and tags for values JSON cannot hold (``!!binary``, ``!!set``, ``!!omap``,
``!!pairs``) are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import yaml

from trainjob.api.common import API_VERSION
from trainjob.api.errors import combine, quote, shorten
from trainjob.api.limits import INT64_RANGE, MAX_INPUT_BYTES, InputRefusedError, check_yaml, mib
from trainjob.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from trainjob.api.trainjob import TrainJob
from trainjob.constants import PYTORCHJOB_API_VERSION
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
    if not isinstance(kind, str) or kind not in KINDS:
        also = " (a kubeflow.org/v1 PyTorchJob is converted by trainjob.convert.load_resources, trainjob convert -f or apply -f)"
        raise ValidationError(
            "kind", f"must be one of {', '.join(KINDS)}, got {quote(kind)}" + (also if kind == "PyTorchJob" else "")
        )
    api_version = data.get("apiVersion")
    if api_version != API_VERSION:
        raise ValidationError("apiVersion", f"must be {API_VERSION}, got {quote(api_version)}")
    return KINDS[kind].from_dict(data)


def read_documents(source: str | Path | TextIO, *, name: str | None = None) -> list[Any]:
    """The YAML documents of a file (a :class:`~pathlib.Path`, or a one-line string naming an existing file or
    ending in ``.yaml``/``.yml``/``.json``), of a stream (stdin) or of YAML text; empty documents are skipped.
    Errors name the file, or ``name`` (default ``<text>``) for text and streams. Inputs past the limits in the
    module docstring are refused with :class:`ValidationError`."""
    text, label = _read_source(source, name)
    try:
        check_yaml(text)
        documents = list(yaml.load_all(text, Loader=_Loader))
    except InputRefusedError as exc:
        where = f"line {exc.mark.line + 1}, column {exc.mark.column + 1}: " if exc.mark else ""
        raise ValidationError("", f"{label}: {where}{exc}") from None
    except yaml.YAMLError as exc:
        raise ValidationError("", f"{label}: not valid YAML: {_yaml_problem(exc)}") from None
    return [doc for doc in documents if doc is not None]


def load_resources(source: str | Path | TextIO, *, name: str | None = None) -> list[Resource]:
    """Every resource in a multi-document YAML file, stream or text, in order (``name`` labels text in errors).

    Only ``trainer.kubeflow.org/v1alpha1`` resources are read here; :func:`trainjob.convert.load_resources` also
    converts Kubeflow Training Operator v1 ``PyTorchJob`` documents (what ``trainjob apply -f`` reads).

    Errors in a file with several documents name the document: ``documents[1].spec.trainer.numNodes: ...``.
    """
    return resources_from_documents(read_documents(source, name=name), lambda document: [resource_from_dict(document)])


def resources_from_documents(
    documents: list[Any], build: Callable[[Any], list[Resource]]
) -> list[Resource]:
    """``build`` applied to each document in turn; every document's problems are reported together, named by
    the document's index when there are several."""
    resources: list[Resource] = []
    problems: list[ValidationError] = []
    for index, document in enumerate(documents):
        try:
            resources.extend(build(document))
        except ValidationError as exc:
            if len(documents) == 1:
                raise
            problems.extend(_prefixed(exc, f"documents[{index}]"))
    if problems:
        raise combine(problems)
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
    return yaml.dump_all(
        [to_yaml_dict(r) for r in resources],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
    )


def is_pytorchjob(document: Any) -> bool:
    """Whether a loaded document is a Kubeflow Training Operator v1 PyTorchJob (``kubeflow.org/v1``)."""
    return isinstance(document, dict) and (document.get("apiVersion"), document.get("kind")) == (
        PYTORCHJOB_API_VERSION,
        "PyTorchJob",
    )


def _read_source(source: str | Path | TextIO, name: str | None) -> tuple[str, str]:
    """The text of ``source`` and its label in errors (``name``, else the file name, ``<text>``, ``<stream>``),
    reading no more than :data:`MAX_INPUT_BYTES` (and one byte to tell)."""
    if isinstance(source, Path) or (isinstance(source, str) and _looks_like_path(source)):
        path = Path(source)
        label = name or str(path)
        try:
            with path.open("rb") as stream:
                data = stream.read(MAX_INPUT_BYTES + 1)
                size = path.stat().st_size if len(data) > MAX_INPUT_BYTES else len(data)
        except OSError as exc:
            raise ValidationError("", f"{label}: cannot read: {exc.strerror or exc}") from None
        _check_size(label, max(size, len(data)), known=size >= len(data))
        return _decoded(data, label), label
    if isinstance(source, str):
        label = name or "<text>"
        _check_size(label, len(_encoded(source, label)))
        return source, label
    label = name or "<stream>"
    try:
        text = source.read(MAX_INPUT_BYTES + 1)
    except UnicodeDecodeError:
        raise ValidationError("", f"{label}: cannot read: not UTF-8 text") from None
    _check_size(label, len(_encoded(text, label)), known=len(text) <= MAX_INPUT_BYTES)
    return text, label


def _decoded(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError("", f"{label}: cannot read: not UTF-8 text") from None


def _encoded(text: str, label: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: a str no file or stream could have held
        raise ValidationError("", f"{label}: cannot read: not valid Unicode text (a lone surrogate)") from None


def _looks_like_path(source: str) -> bool:
    if "\n" in source or len(source) > 4096:
        return False
    if source.endswith((".yaml", ".yml", ".json")):
        return True
    try:
        return Path(source).is_file()
    except OSError:  # a name too long for the file system is text, not a file
        return False


def _check_size(label: str, size: int, *, known: bool = True) -> None:
    if size <= MAX_INPUT_BYTES:
        return
    found = f"is {mib(size)}" if known else f"is larger than {mib(MAX_INPUT_BYTES)}"
    raise ValidationError(
        "", f"{label}: input {found}; the limit is {mib(MAX_INPUT_BYTES)} (split it into several files)"
    )


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    # Over 80 characters is past 64 bits in any base; checking first spares int() Python's 4,300-digit limit.
    value = None if len(node.value) > 80 else _construct_scalar(loader, node)
    if value is None or not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        raise InputRefusedError(
            f"integer {quote(node.value, 40)} is out of range: Kubernetes integers are 64-bit "
            f"({INT64_RANGE[0]}..{INT64_RANGE[1]})",
            node.start_mark,
        )
    return value


def _construct_scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    """A ``!!int``, ``!!float`` or ``!!bool`` scalar; one written with its tag but not of its kind
    (``!!int x``, ``!!int ''``) is refused instead of raising PyYAML's ValueError, KeyError or IndexError."""
    tag = node.tag.removeprefix("tag:yaml.org,2002:")
    try:
        return getattr(yaml.SafeLoader, f"construct_yaml_{tag}")(loader, node)
    except (ValueError, KeyError, IndexError):
        raise InputRefusedError(f"{quote(node.value, 40)} is not a valid !!{tag}", node.start_mark) from None


def _refuse_tag(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    raise InputRefusedError(
        f"tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not supported: Kubernetes objects hold only "
        "strings, numbers, booleans, null, lists and mappings",
        node.start_mark,
    )


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """PyYAML's safe loader (libyaml's parser where installed) with Kubernetes' reading of values."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping; a key written twice is refused, as kubectl does (PyYAML would keep the last silently, so
        two ``Master:`` replica specs would quietly become one)."""
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise InputRefusedError(
                        f"mapping key {quote(key_node.value, 40)} appears twice; keep one", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


#: PyYAML's safe dumper, libyaml's emitter where installed (several times faster on large objects).
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_scalar)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_scalar)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)
for _tag in ("binary", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = shorten(getattr(exc, "problem", None) or str(exc), 200)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _prefixed(exc: ValidationError, prefix: str) -> list[ValidationError]:
    return [ValidationError(f"{prefix}.{e.path}" if e.path else prefix, e.message) for e in exc.errors]
