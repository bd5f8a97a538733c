"""CustomResourceDefinitions generated from the pydantic models, so the API server and ``trainjob.api`` agree.

:func:`openapi_schema` turns a model's JSON schema into the *structural* OpenAPI v3 schema apiextensions v1
requires: references inlined, ``Optional`` unwrapped, ``dict[str, Any]`` (pod templates, JobSet fields we do not
model) kept as ``x-kubernetes-preserve-unknown-fields``, ``int | str`` as ``x-kubernetes-int-or-string``. Checks
JSON schema cannot express (``numProcPerNode`` keywords, name formats) become CEL ``x-kubernetes-validations``::

    crds = custom_resource_definitions()        # TrainJob, TrainingRuntime, ClusterTrainingRuntime
    print(yaml.safe_dump_all(crds))
"""

from __future__ import annotations

from typing import Any

from trainjob.backends.kubernetes.resources import (
    API_GROUP,
    API_VERSION_NAME,
    CLUSTER_TRAINING_RUNTIMES,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    ResourceRef,
)

_KEEP = (
    "type",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "format",
)

#: CEL rules for what the JSON schema part cannot say; messages follow ``field: must ..., got ...``.
_NUM_PROC_RULE = {
    "rule": "type(self) == int ? self >= 1 : (self in ['auto', 'cpu', 'gpu'] || self.matches('^[1-9][0-9]*$'))",
    "message": "numProcPerNode: must be auto, cpu, gpu or an integer >= 1",
}
_NAME_RULES = [
    {
        "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 63",
        "message": "metadata.name: must be a DNS label of at most 63 characters (it becomes the pods' host names)",
    }
]


#: Defaults the API server fills in, as Kubeflow Trainer's CRDs declare them (``+kubebuilder:default``), so that a
#: stored object reads the same whichever CRDs are installed. Paths name properties; ``[]`` steps into list items.
_RUNTIME_DEFAULTS: dict[str, Any] = {
    "spec.mlPolicy.torch.numProcPerNode": "auto",
    "spec.mlPolicy.mpi.numProcPerNode": 1,
    "spec.mlPolicy.mpi.mpiImplementation": "OpenMPI",
    "spec.mlPolicy.mpi.sshAuthMountPath": "/root/.ssh",
    "spec.mlPolicy.mpi.runLauncherAsNode": False,
    "spec.podGroupPolicy.coscheduling.scheduleTimeoutSeconds": 60,
    "spec.template.spec.replicatedJobs[].replicas": 1,
    "spec.template.spec.replicatedJobs[].groupName": "default",
}
_TRAINJOB_DEFAULTS: dict[str, Any] = {
    "spec.runtimeRef.apiGroup": API_GROUP,
    "spec.runtimeRef.kind": "ClusterTrainingRuntime",
    "spec.suspend": False,
    "spec.managedBy": "trainer.kubeflow.org/trainjob-controller",
}


def _set_defaults(schema: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Put each default of ``defaults`` on its property; a path the schema lacks is an error, not a no-op."""
    for path, value in defaults.items():
        node = schema
        for step in path.replace("[]", ".[]").split("."):
            node = node["items"] if step == "[]" else node.get("properties", {}).get(step)  # type: ignore[assignment]
            if node is None:
                raise KeyError(f"the schema has no {path} for its default")
        node["default"] = value


#: Integer ranges that are Go's int32/int64: said with ``format``, as Kubernetes' own schemas do. A bound of
#: 2**63 - 1 would not survive the API server (it reads schema numbers as float64 and overflows).
_INT_FORMATS = {(-(2**31), 2**31 - 1): "int32", (-(2**63), 2**63 - 1): "int64"}


def _integer_format(schema: dict[str, Any]) -> None:
    """Replace int32/int64 range bounds with ``format``; keep other bounds (``minimum: 1`` stays)."""
    for (low, high), name in _INT_FORMATS.items():
        if schema.get("maximum") == high:
            schema.pop("maximum")
            schema.setdefault("format", name)
            if schema.get("minimum") == low:
                schema.pop("minimum")


#: Deeper than any model of ours (``runtimePatches`` down to a container's env source is about 60 steps: every
#: level is a reference, an optional and its properties), shallow enough to stop a recursive model at once.
_MAX_DEPTH = 120


def openapi_schema(json_schema: dict[str, Any]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema for a pydantic ``model_json_schema(by_alias=True)``."""
    defs = json_schema.get("$defs", {})
    return _convert(json_schema, defs, depth=0)


def _convert(node: dict[str, Any], defs: dict[str, Any], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise ValueError("schema nests too deep (a recursive model cannot become a structural schema)")
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs, depth + 1)
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            options = [o for o in node[combinator] if o.get("type") != "null"]
            rest = {k: v for k, v in node.items() if k != combinator}
            if len(options) == 1:
                return _convert({**options[0], **rest}, defs, depth + 1)
            return _int_or_string(options, rest)
    if "allOf" in node and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _convert({**node["allOf"][0], **rest}, defs, depth + 1)

    out: dict[str, Any] = {k: node[k] for k in _KEEP if k in node}
    _integer_format(out)
    if "const" in node:
        out["enum"] = [node["const"]]
        out.setdefault("type", _json_type(node["const"]))
    if node.get("description"):
        out["description"] = _summary(node["description"])
    if "default" in node and node["default"] is not None and not isinstance(node["default"], dict | list):
        out["default"] = node["default"]
    if out.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {k: _convert(v, defs, depth + 1) for k, v in node["properties"].items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            out["additionalProperties"] = _convert(extra, defs, depth + 1)
        elif (extra is True or extra == {}) or ("properties" not in node and extra is None):
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "array":
        out["items"] = _convert(node.get("items", {}), defs, depth + 1)
    if not out.get("type") and "x-kubernetes-int-or-string" not in out and "enum" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _int_or_string(options: list[dict[str, Any]], rest: dict[str, Any]) -> dict[str, Any]:
    kinds = {o.get("type") or _json_type(o["enum"][0]) for o in options}
    if kinds != {"integer", "string"}:
        raise ValueError(f"cannot express a union of {sorted(map(str, kinds))} in a structural schema")
    out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
    if rest.get("description"):
        out["description"] = _summary(rest["description"])
    if any("enum" in o for o in options):
        out["x-kubernetes-validations"] = [_NUM_PROC_RULE]
    return out


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string"}[type(value)]


def _resource_schema(model: type) -> dict[str, Any]:
    schema = openapi_schema(model.model_json_schema(by_alias=True, mode="validation"))  # type: ignore[attr-defined]
    props = schema["properties"]
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}  # the API server owns ObjectMeta's schema
    schema["required"] = [
        r for r in schema.get("required", []) if r not in ("apiVersion", "kind", "metadata")
    ]
    return schema


def _crd(ref: ResourceRef, model: type, columns: list[dict[str, Any]], status: bool) -> dict[str, Any]:
    schema = _resource_schema(model)
    _set_defaults(schema, _TRAINJOB_DEFAULTS if ref is TRAINJOBS else _RUNTIME_DEFAULTS)
    if ref is TRAINJOBS:
        schema["x-kubernetes-validations"] = _NAME_RULES
    version: dict[str, Any] = {
        "name": API_VERSION_NAME,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "additionalPrinterColumns": columns,
    }
    if status:
        version["subresources"] = {"status": {}}
    singular = ref.kind.lower()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{ref.plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": ref.kind,
                "listKind": f"{ref.kind}List",
                "plural": ref.plural,
                "singular": singular,
            },
            "scope": "Namespaced" if ref.namespaced else "Cluster",
            "versions": [version],
        },
    }


def custom_resource_definitions() -> list[dict[str, Any]]:
    """The CRDs of TrainJob, TrainingRuntime and ClusterTrainingRuntime (apiextensions.k8s.io/v1)."""
    from trainjob.api import ClusterTrainingRuntime, TrainingRuntime, TrainJob

    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    job_columns = [
        {"name": "Runtime", "type": "string", "jsonPath": ".spec.runtimeRef.name"},
        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.trainer.numNodes"},
        # Empty while the job runs: like Kubeflow Trainer, the operator writes no condition then (the Kubeflow SDK
        # reports Running only for a job without conditions); Ready and Active say how far the trainer got.
        {"name": "State", "type": "string", "jsonPath": '.status.conditions[?(@.status=="True")].type'},
        {"name": "Ready", "type": "integer", "jsonPath": '.status.jobsStatus[?(@.name=="node")].ready',
         "description": "trainer Jobs whose pods are all ready"},
        {"name": "Active", "type": "integer", "jsonPath": '.status.jobsStatus[?(@.name=="node")].active',
         "description": "trainer Jobs with pods that have not finished"},
        age,
    ]
    runtime_columns = [
        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.mlPolicy.numNodes"},
        age,
    ]
    return [
        _crd(TRAINJOBS, TrainJob, job_columns, status=True),
        _crd(TRAINING_RUNTIMES, TrainingRuntime, runtime_columns, status=False),
        _crd(CLUSTER_TRAINING_RUNTIMES, ClusterTrainingRuntime, runtime_columns, status=False),
    ]


def crd_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of a CRD's (only) version."""
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _summary(docstring: str) -> str:
    """The first paragraph, without reST literal markup (``kubectl explain`` shows it verbatim)."""
    return docstring.split("\n\n")[0].strip().replace("``", "")


def pytorchjob_crd() -> dict[str, Any]:
    """The Training Operator v1 ``pytorchjobs.kubeflow.org`` CRD (schema from :mod:`trainjob.convert.pytorchjob_api`,
    pod templates kept as they are), labelled as trainjob's so that the operator knows the PyTorchJobs are its own."""
    from trainjob.backends.kubernetes.resources import PART_OF, PART_OF_LABEL, PYTORCHJOBS
    from trainjob.convert.pytorchjob_api import PyTorchJob

    schema = _resource_schema(PyTorchJob)
    schema["properties"]["status"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    columns = [  # as the Training Operator's: the last condition's type
        {"name": "State", "type": "string", "jsonPath": ".status.conditions[-1:].type"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    ref = PYTORCHJOBS
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{ref.plural}.{ref.group}", "labels": {PART_OF_LABEL: PART_OF}},
        "spec": {
            "group": ref.group,
            "names": {"kind": ref.kind, "listKind": f"{ref.kind}List", "plural": ref.plural,
                      "singular": ref.kind.lower()},
            "scope": "Namespaced",
            "versions": [{"name": ref.version, "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}, "subresources": {"status": {}},
                          "additionalPrinterColumns": columns}],
        },
    }
