"""Side-by-side conformance with Kubeflow Trainer: the cases, the normalisation and the diff of what each controller
created, and the table of documented differences in ``docs/kubeflow-compatibility.md``.

A *case* is a set of manifests (runtimes and TrainJobs). :func:`prepare` places it for one controller: namespaced
objects into that controller's namespace, cluster runtimes renamed with the case's prefix (both controllers use the
same cluster runtime objects), every TrainJob suspended (the JobSet is built all the same, and no pod runs).
:func:`normalise` removes what differs between any two creations (uids, timestamps, versions, managed fields,
status, the namespace's name); :func:`diff` compares what is left, keyed by name in lists of named things, so a
path reads ``spec.replicatedJobs[node].template.spec.template.spec.containers[node].env[PET_NNODES].value``.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "kubeflow-compatibility.md"
CLUSTER_KINDS = {"ClusterTrainingRuntime"}
RUNTIME_KINDS = {"ClusterTrainingRuntime", "TrainingRuntime"}
#: Fields that are never the same twice: set by the API server for each object.
VOLATILE_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "namespace")
MISSING = "<absent>"


@dataclass
class Case:
    name: str
    objects: list[dict[str, Any]]
    source: str = ""

    @property
    def jobs(self) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == "TrainJob"]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def load_cases(kubeflow_runtimes: Path) -> list[Case]:
    """The table: the seeds' manifests, trainjob's own runtime cases, and every runtime Kubeflow v2.1.0 ships
    (``manifests/base/runtimes``) with the smallest TrainJob that uses it."""
    cases: list[Case] = []
    seeds = REPO / "tests" / "api" / "seed_manifests"
    # The seeds give each runtime and the job that uses it in separate listings.
    for runtime, job in (("000-1", "000-0"), ("000-2", "000-3")):
        objects = _documents(seeds / f"{runtime}.yaml") + _documents(seeds / f"{job}.yaml")
        cases.append(Case(f"seed-{job}", objects, f"tests/api/seed_manifests/{runtime}.yaml + {job}.yaml"))
    for path in sorted((REPO / "tests" / "runtime" / "cases").glob("*.yaml")):
        cases.append(Case(path.stem, _documents(path), f"tests/runtime/cases/{path.name}"))
    for path in sorted(kubeflow_runtimes.glob("*.yaml")):
        (runtime,) = _documents(path)
        job = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "example"},
            "spec": {"runtimeRef": {"name": runtime["metadata"]["name"]}},
        }
        cases.append(Case(f"kubeflow-{path.stem.replace('_', '-').replace('.', '-').lower()}", [runtime, job],
                          f"Kubeflow Trainer v2.1.0 manifests/base/runtimes/{path.name}"))
    return cases


def prepare(case: Case, namespace: str) -> list[dict[str, Any]]:
    """``case``'s objects as they are created for one controller (runtimes first)."""
    renamed = {
        o["metadata"]["name"]: f"{case.name}-{o['metadata']['name']}"[:63]
        for o in case.objects
        if o["kind"] in CLUSTER_KINDS
    }
    namespaced = {o["metadata"]["name"] for o in case.objects if o["kind"] == "TrainingRuntime"}
    out = []
    for original in sorted(case.objects, key=lambda o: o["kind"] == "TrainJob"):
        obj = copy.deepcopy(original)
        meta = obj["metadata"]
        if obj["kind"] in CLUSTER_KINDS:
            meta["name"] = renamed[meta["name"]]
            meta.pop("namespace", None)
        else:
            meta["namespace"] = namespace
        if obj["kind"] == "TrainJob":
            spec = obj["spec"]
            spec["suspend"] = True
            ref = spec["runtimeRef"]
            kind = ref.get("kind", "ClusterTrainingRuntime")
            if kind == "ClusterTrainingRuntime" and ref["name"] in renamed:
                ref["name"] = renamed[ref["name"]]
            elif kind == "TrainingRuntime":
                assert ref["name"] in namespaced, f"case {case.name}: runtime {ref['name']} is not in the case"
        out.append(obj)
    return out


def normalise(obj: dict[str, Any] | None, namespace: str) -> dict[str, Any] | None:
    """``obj`` without what differs between any two creations; ``namespace`` in strings becomes ``<ns>``."""
    if obj is None:
        return None
    obj = copy.deepcopy(obj)
    obj.pop("status", None)
    meta = obj.get("metadata", {})
    for key in VOLATILE_METADATA:
        meta.pop(key, None)
    for ref in meta.get("ownerReferences", []):
        ref.pop("uid", None)
    text = json.dumps(obj)
    text = re.sub(rf"(?<![a-z0-9-]){re.escape(namespace)}(?![a-z0-9-])", "<ns>", text)
    return json.loads(text)


@dataclass(frozen=True)
class Difference:
    case: str
    path: str
    kubeflow: Any
    trainjob: Any

    def row(self) -> str:
        return f"| {self.case} | `{self.path}` | `{_show(self.kubeflow)}` | `{_show(self.trainjob)}` | ? |"


def _show(value: Any) -> str:
    return value if value == MISSING else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _keyed(items: list[Any]) -> dict[str, Any] | None:
    """A list of named objects as a mapping by name (``None`` when it is not one)."""
    if items and all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        names = [i["name"] for i in items]
        if len(set(names)) == len(names):
            return {n: i for n, i in zip(names, items, strict=True)}
    return None


def diff(case: str, kubeflow: Any, ours: Any, path: str = "") -> list[Difference]:
    """Every leaf where ``kubeflow`` and ``ours`` differ."""
    if isinstance(kubeflow, dict) and isinstance(ours, dict):
        out = []
        for key in sorted(set(kubeflow) | set(ours)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in kubeflow:
                out.append(Difference(case, sub, MISSING, ours[key]))
            elif key not in ours:
                out.append(Difference(case, sub, kubeflow[key], MISSING))
            else:
                out += diff(case, kubeflow[key], ours[key], sub)
        return out
    if isinstance(kubeflow, list) and isinstance(ours, list):
        a, b = _keyed(kubeflow), _keyed(ours)
        if a is not None and b is not None:
            out = []
            for name in sorted(set(a) | set(b)):
                sub = f"{path}[{name}]"
                if name not in a:
                    out.append(Difference(case, sub, MISSING, b[name]))
                elif name not in b:
                    out.append(Difference(case, sub, a[name], MISSING))
                else:
                    out += diff(case, a[name], b[name], sub)
            return out
        if len(kubeflow) == len(ours):
            return [d for i, (x, y) in enumerate(zip(kubeflow, ours, strict=True)) for d in diff(case, x, y, f"{path}[{i}]")]
    if kubeflow != ours:
        return [Difference(case, path, kubeflow, ours)]
    return []


@dataclass
class Documented:
    """One row of the table: in ``case`` and ``path`` a ``*`` matches anything; a value cell of ``*`` matches any
    value."""

    case: str
    path: str
    kubeflow: str
    trainjob: str
    why: str
    seen: int = field(default=0)

    def matches(self, d: Difference) -> bool:
        return (
            _glob(self.case, d.case)
            and _glob(self.path, d.path)
            and self.kubeflow in ("*", _show(d.kubeflow))
            and self.trainjob in ("*", _show(d.trainjob))
        )


def _glob(pattern: str, text: str) -> bool:
    """``*`` matches any run of characters (dots and brackets too); everything else is literal."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), text) is not None


def documented(section: str, doc: Path = DOC) -> list[Documented]:
    """The rows of the table under the heading ``section`` of the compatibility document."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"## {section}")
    end = text.find("\n## ", start + 1)
    rows = []
    for line in text[start : end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 5 or set(cells[0]) <= {"-", ":"} or cells[0] == "case":
            continue
        rows.append(Documented(*(c.strip("`") if i < 4 else c for i, c in enumerate(cells))))
    return rows


def unexplained(differences: list[Difference], rows: list[Documented]) -> list[Difference]:
    """The differences that no row of ``rows`` explains; counts on each row how many it explains."""
    left = []
    for d in differences:
        row = next((r for r in rows if r.matches(d)), None)
        if row is None:
            left.append(d)
        else:
            row.seen += 1
    return left
