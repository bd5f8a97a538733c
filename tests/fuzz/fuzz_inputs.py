"""Inputs for the fuzz suite: valid bundles of documents, mutations of them, and hostile raw YAML text.

A *bundle* is the documents of one input file: TrainJobs plus the runtimes they use. The valid bundles are the
project's own test cases, the seeds' manifests and the built-in runtimes; :func:`mutated_bundles` changes one to
three places in one of them (a value of another type, a number out of range, unicode, a long string, deep
nesting, a removed field, a field of the API's schemas put where it does not belong). :data:`hostile_texts`
gives text no dumper writes: alias and merge-key bombs, recursive aliases, deep flow nesting, integers past
Python's digit limit, tags, each on its own or in place of a value of a valid bundle, and random edits of valid
text. :data:`REGRESSIONS` are the inputs that once crashed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from pydantic import BaseModel

from trainjob.api import ClusterTrainingRuntime, TrainJob
from trainjob.api.podtemplate import JobTemplate

TESTS = Path(__file__).resolve().parents[1]
BUILTIN = TESTS.parent / "src" / "trainjob" / "runtime" / "builtin"
SEEDS = TESTS / "api" / "seed_manifests"
CASES = TESTS / "runtime" / "cases"

Path_ = tuple[Any, ...]


def _documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def _job_on(runtime: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "fuzz"},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"command": ["torchrun", "train.py"], "numNodes": 2, "env": [{"name": "A", "value": "1"}]},
        },
    }


def seed_bundles() -> list[list[Any]]:
    """Every valid bundle: each test case file, the seeds' jobs with their runtimes, each built-in runtime with
    a job on it."""
    bundles = [_documents(path) for path in sorted(CASES.glob("*.yaml"))]
    seeds = {path.stem: _documents(path)[0] for path in sorted(SEEDS.glob("*.yaml"))}
    bundles += [[seeds["000-0"]], [seeds["000-1"], seeds["000-0"]], [seeds["000-2"], seeds["000-3"]]]
    for path in sorted(BUILTIN.glob("*.yaml")):
        runtime = _documents(path)[0]
        bundles.append([runtime, _job_on(runtime["metadata"]["name"])])
    second = _job_on("torch-distributed")
    second["metadata"]["name"] = "fuzz-two"
    bundles.append([_job_on("torch-distributed"), second])  # apply creates both or neither
    return bundles


SEED_BUNDLES = seed_bundles()


def field_names(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Every YAML field name of ``model`` and of the models inside it."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(info.alias or name)
        for inner in _models_in(info.annotation):
            names |= field_names(inner, seen)
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


#: Field names of the API's schemas, to put where they do not belong.
SCHEMA_FIELDS = sorted(field_names(TrainJob) | field_names(ClusterTrainingRuntime) | field_names(JobTemplate))

#: Values that sit on or past a boundary somewhere in the API.
EDGE_VALUES: list[Any] = [
    0, -1, 1, 2**31 - 1, 2**31, 2**63, -(2**63) - 1, 10**40, 10_001, 100_000,
    0.5, -0.0, 1e308, float("inf"), float("-inf"), float("nan"),
    True, False, None, "", " ", "\n", "a\n", "-", "0", "08", "1e9999", "1e-9999", "1E+999999999", "9" * 500,
    "NaN", "Infinity", "-5", "2500m", "16Gi", "0x1F", "auto", "gpu", "cpu", "node", "PET_NNODES", "x" * 5000,
    "é", "🚀", "\u202e", "\x00", "a" * 64, "Z", "has space", "{", "*a", "&a", "!!python/object", "%",
    [], {}, [None], [[]], [{}], {"": None}, {"name": None}, {"containerPort": "x"}, {"name": {"a": 1}},
]

scalars = st.one_of(
    st.sampled_from(EDGE_VALUES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.booleans(),
    st.none(),
)

values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


#: Same-type values near the API's boundaries, so a changed document often still loads and reaches the runtime.
SIMILAR: dict[type, st.SearchStrategy[Any]] = {
    bool: st.booleans(),
    int: st.sampled_from([0, 1, 2, 8, 1024, 1025, 10_000, 10_001, 65535, 65536, 2**31 - 1, -1]) | st.integers(-5, 20),
    float: st.floats(allow_nan=True, allow_infinity=True),
    str: st.sampled_from(
        ["", "node", "auto", "cpu", "gpu", "8", "1e9999", "16Gi", "2500m", "-1", "0", "a\n", "trainer", "x" * 300,
         "PET_NNODES", "dataset-initializer", "model-initializer", "TrainingRuntime", "é", "🚀"]
    )
    | st.text(max_size=20),
}


@st.composite
def similar(draw: st.DrawFn, value: Any) -> Any:
    """A value of the type of ``value``: another scalar, a list with an item dropped or doubled, a mapping
    without one of its keys."""
    if type(value) in SIMILAR:
        return draw(SIMILAR[type(value)])
    if isinstance(value, list) and value:
        index = draw(st.integers(0, len(value) - 1))
        return value[:index] + value[index + 1 :] if draw(st.booleans()) else [*value, value[index]]
    if isinstance(value, dict) and value:
        dropped = draw(st.sampled_from(sorted(value, key=str)))
        return {k: v for k, v in value.items() if k != dropped}
    return copy.deepcopy(draw(values))


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` levels of alternating lists and mappings around ``leaf``."""
    out = leaf
    for level in range(depth):
        out = [out] if level % 2 else {"k": out}
    return out


#: Most characters a bundle may grow to, so a generated input stays near the loader's limits, not far past.
MAX_GROWTH = 6 * 2**20
#: Most places of a bundle a mutation picks from (a grown bundle has millions; the first ones will do).
MAX_PATHS = 20_000


def paths(data: Any) -> list[Path_]:
    """The paths into ``data`` (mapping keys and list indexes), the root first, at most :data:`MAX_PATHS`."""
    out: list[Path_] = []
    stack: list[tuple[Path_, Any]] = [((), data)]
    while stack and len(out) < MAX_PATHS:
        path, value = stack.pop()
        out.append(path)
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        stack.extend(reversed([((*path, key), child) for key, child in children]))
    return out


def weight(data: Any, cap: int = MAX_GROWTH) -> int:
    """About how many characters ``data`` takes as text (a node each, plus its strings), counted up to ``cap``:
    shared objects count each time they appear, so a list of lists of copies stays cheap to measure."""
    total = 0
    stack = [data]
    while stack and total <= cap:
        value = stack.pop()
        total += 1 + (len(value) if isinstance(value, str) else 0)
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return total


def _parent(data: Any, path: Path_) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


KINDS = ("similar", "similar", "similar", "similar", "replace", "replace", "remove", "unknown", "deep", "long")


@st.composite
def mutation(draw: st.DrawFn, data: Any, kinds: tuple[str, ...] = KINDS) -> Any:
    """``data`` with one place changed: replaced by a value of its type or of any type, removed, nested deeply,
    given a long string or a field of the schemas where it does not belong, or ``grow`` n: made a list of n
    copies of itself (shared, not copied: so
    ``grow`` comes last, or a later change inside one copy would change them all)."""
    kind = draw(st.sampled_from(kinds))
    # Whole documents are replaced by the raw-text strategies; here a document is only grown.
    places = [p for p in paths(data) if len(p) >= (1 if kind == "grow" else 2)] or [()]
    path = draw(st.randoms(use_true_random=False)).choice(places)  # uniform: sampled_from favours the first
    if kind == "deep":
        new = nested(draw(st.integers(min_value=20, max_value=130)))
    elif kind == "long":
        new = draw(st.sampled_from(["x", "é", "a-", "9"])) * draw(st.sampled_from([64, 254, 10_000, 200_000]))
    elif kind == "grow":  # a list of copies, sometimes just past the loader's node or size limit
        current = data if not path else _parent(data, path)[path[-1]]
        room = MAX_GROWTH - weight(data)
        copies = draw(st.sampled_from([2, 2, 50, 500, 60_000])) // len(paths(current)) + 1
        new = [current] * max(1, min(copies, room // weight(current)))
    elif kind == "similar":
        new = draw(similar(_parent(data, path)[path[-1]] if path else data))
    else:
        new = copy.deepcopy(draw(values))  # EDGE_VALUES' lists and mappings must not change under later mutations
    if not path:
        return new if kind != "remove" else None
    parent = _parent(data, path)
    if kind == "remove":
        del parent[path[-1]]
    elif kind == "unknown" and isinstance(parent, dict):
        parent[draw(st.sampled_from(SCHEMA_FIELDS) | st.text(min_size=1, max_size=12))] = new
    else:
        parent[path[-1]] = new
    return data


@st.composite
def mutated_bundles(draw: st.DrawFn) -> list[Any]:
    """A seed bundle with one to three mutations, the last one sometimes a ``grow``."""
    bundle = copy.deepcopy(draw(st.sampled_from(SEED_BUNDLES)))
    count = draw(st.integers(min_value=1, max_value=3))
    for step in range(count):
        last = step == count - 1
        bundle = draw(mutation(bundle, KINDS + ("grow", "grow") if last else KINDS))
        if not isinstance(bundle, list):
            bundle = [bundle]
    return bundle


def dump(bundle: list[Any]) -> str:
    """YAML text of a bundle, one document each (shared objects are written out, never as aliases); large
    bundles as JSON documents (JSON is YAML too), which writes megabytes in milliseconds."""
    if weight(bundle, cap=100_000) < 100_000:
        return yaml.dump_all(bundle, Dumper=_Dumper, allow_unicode=True, sort_keys=False)
    return "\n---\n".join(json.dumps(document, ensure_ascii=False) for document in bundle) + "\n"


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True


def alias_bomb(width: int, levels: int, leaf: str = "lol") -> str:
    """The billion laughs, as one flow list: each level lists ``width`` aliases of the level below."""
    items = [f"&l0 [{', '.join([leaf] * width)}]"]
    items += [f"&l{n} [{', '.join([f'*l{n - 1}'] * width)}]" for n in range(1, levels + 1)]
    return f"[{', '.join(items)}]"


def merge_bomb(levels: int) -> str:
    """Merge keys (``<<``) that double a mapping at every level, as one flow list."""
    items = ["&m0 {a: 1, b: 2}"]
    items += [f"&m{n} {{<<: *m{n - 1}, x{n}: [*m{n - 1}, *m{n - 1}]}}" for n in range(1, levels + 1)]
    return f"[{', '.join(items)}]"


def _job_text_with(fragment: str) -> str:
    return (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: fuzz}\n"
        f"spec:\n  runtimeRef: {{name: torch-distributed}}\n  trainer:\n    numNodes: {fragment}\n"
    )


@st.composite
def edited_text(draw: st.DrawFn) -> str:
    """A valid bundle's text with a few characters inserted, deleted or replaced."""
    text = dump(draw(st.sampled_from(SEED_BUNDLES)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        piece = draw(st.sampled_from(["&a ", "*a", "[", "{", "]", "}", ":", "- ", "\n", "\t", "'", '"', "!!", "<<: "])
                     | st.text(max_size=3))
        cut = draw(st.integers(min_value=0, max_value=3))
        text = text[:at] + piece + text[at + cut :]
    return text


#: A value a dumper never writes, as flow YAML that fits wherever a value goes.
fragments = st.one_of(
    st.builds(alias_bomb, st.integers(min_value=2, max_value=10), st.integers(min_value=1, max_value=10)),
    st.builds(merge_bomb, st.integers(min_value=1, max_value=25)),
    st.builds(lambda n: "[" * n + "]" * n, st.sampled_from([99, 100, 101, 1_000])),
    st.builds(lambda n: "{a: " * n + "1" + "}" * n, st.sampled_from([99, 101, 1_000])),
    st.sampled_from(
        [
            "&a [*a]", "&a {b: *a}", "*nope", "9" * 5_000, "0x" + "f" * 20_000, "18446744073709551616",
            "-9223372036854775809", '"\\ud800"', "!!binary aGVsbG8=", "!!set {a}", "!!timestamp 2001-12-14",
            "2001-12-14t21:59:43.10-05:00", "1e9999", "'1e9999'", ".nan", "-.inf", "{? [a] : 1}", "[{a: 1}: 2]",
            "!!python/object:os.system x", "!custom x", "[&s " + "x" * 100_000 + ", " + "*s, " * 100 + "]",
            "<<: *nope", "{<<: [1, 2]}", "!!int x", "!!float abc", "!!bool maybe", "!!int ''", "~", "", "'\t'",
        ]
    ),
)


@st.composite
def embedded_fragments(draw: st.DrawFn) -> str:
    """A valid bundle with one value (anywhere: a name, a template field, a list item) replaced by a
    :data:`fragments` value."""
    bundle = copy.deepcopy(draw(st.sampled_from(SEED_BUNDLES)))
    marker = "FUZZ_FRAGMENT_GOES_HERE"
    path = draw(st.sampled_from([p for p in paths(bundle) if len(p) > 1]))
    _parent(bundle, path)[path[-1]] = marker
    return dump(bundle).replace(marker, draw(fragments), 1)


hostile_texts = st.one_of(
    embedded_fragments(),
    st.builds(alias_bomb, st.integers(min_value=2, max_value=12), st.integers(min_value=1, max_value=12)),
    st.builds(merge_bomb, st.integers(min_value=1, max_value=40)),
    st.sampled_from(
        [
            "a: &a [*a]\n",
            "a: &a {b: *a}\n",
            "a: *nope\n",
            "a: &a " + "x" * 100_000 + "\nb: [" + ", ".join(["*a"] * 200) + "]\n",
            "[" * 1_000 + "]" * 1_000,
            "{a: " * 1_000 + "1" + "}" * 1_000,
            "[" * 100_000,
            "".join(f"{'  ' * i}a:\n" for i in range(300)),
            _job_text_with("9" * 5_000),
            _job_text_with("0x" + "f" * 20_000),
            _job_text_with("!!float 1e999"),
            _job_text_with("2147483647"),
            _job_text_with("!!binary aGVsbG8="),
            _job_text_with("2024-01-01"),
            _job_text_with("{? [a] : 1}"),
            _job_text_with("!!set {a, b}"),
            "\ufeff" + _job_text_with("1"),
            "%YAML 1.1\n%TAG ! tag:x,2000:\n--- !foo\na: 1\n",
            "--- !!python/object/apply:os.system [echo]\n",
            "\x00\x01",
        ]
    ),
    edited_text(),
    st.text(max_size=200),
)


def _runtime_and_job(container: str = "{name: node, image: torch}", pod: str = "", job: str = "") -> str:
    """A runtime ``rt`` whose trainer container is ``container`` (flow YAML), plus a TrainJob on it."""
    return (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\nmetadata: {name: rt}\n"
        "spec:\n  mlPolicy: {torch: {}}\n  podGroupPolicy: {coscheduling: {}}\n  template:\n    spec:\n"
        "      replicatedJobs:\n      - name: node\n        template:\n          spec:\n            template:\n"
        f"              spec: {{containers: [{container}]{pod}}}\n---\n"
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: fuzz}\n"
        f"spec: {{runtimeRef: {{name: rt}}, trainer: {{command: [torchrun, t.py]}}{job}}}\n"
    )


#: Inputs that crashed, hung or exhausted memory before issue 17 was fixed, with a part of the one error line
#: each now gets. The fuzz tests run them first, every time.
REGRESSIONS: dict[str, tuple[str, str]] = {
    "alias-bomb": (_job_text_with(alias_bomb(9, 9)), "aliases expand it to more than 50,000 nodes"),
    "recursive-alias": (_job_text_with("&a [*a]"), "alias *a refers to a node that contains it"),
    "depth-1000": (_runtime_and_job(pod=", extra: " + "[" * 1000 + "]" * 1000), "nests deeper than 100 levels"),
    "port-without-containerPort": (
        _runtime_and_job("{name: node, ports: [{name: rdzv}]}"),
        "containers[0].ports[0].containerPort: required field is missing",
    ),
    "container-name-mapping": (_runtime_and_job("{name: {a: 1}}"), "containers[0].name: must be a string"),
    "container-as-string": (_runtime_and_job("node"), "containers[0]: must be a mapping, got 'node'"),
    "env-as-string": (_runtime_and_job("{name: node, env: [A=1]}"), "containers[0].env[0]: must be a mapping"),
    "null-template-spec": (_runtime_and_job(pod=", nodeSelector: null, tolerations: null"), ""),
    "quantity-1e9999": (
        _runtime_and_job("{name: node, resources: {requests: {cpu: 1e9999}}}"),
        "requests.cpu: must be at most 9.22E+18 in size, got '1e9999'",
    ),
    "quantity-huge-exponent": (
        _runtime_and_job("{name: node, resources: {limits: {nvidia.com/gpu: 1E+999999999}}}"),
        "must be at most 9.22E+18 in size",
    ),
    "auto-procs-from-huge-cpu": (
        _runtime_and_job("{name: node, resources: {requests: {cpu: '1e15'}}}"),
        "which gives one process per requested CPU: 1000000000000000 per node; at most 1024",
    ),
    "integer-past-4300-digits": (_job_text_with("9" * 5_000), "is out of range: Kubernetes integers are 64-bit"),
    "hex-integer-past-4300-digits": (_job_text_with("0x" + "f" * 20_000), "is out of range"),
    "num-nodes-int32-max": (_job_text_with("2147483647"), "spec.trainer.numNodes: must be <= 10000, got 2147483647"),
    "name-with-trailing-newline": (
        _job_text_with("1").replace("{name: fuzz}", '{name: "fuzz\\n"}'),
        "metadata.name: must be a DNS label",
    ),
    "tagged-int-that-is-not": (_job_text_with("!!int x"), "line 7, column 15: 'x' is not a valid !!int"),
    "kind-is-a-list": ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: [TrainJob]\n", "kind: must be one of"),
    "kind-is-a-mapping": ("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: {a: 1}\n", "kind: must be one of"),
    "many-bad-documents": ("- 0.2\n---\n" * 2_000, "... and 1980 more problem(s)"),
    "long-value-in-message": (_job_text_with("x" * 1_000_000), "spec.trainer.numNodes: must be an integer, got 'xxx"),
}
