"""Admission for the API stand-in: the checks a real API server (with JobSet and our CRDs installed) makes.

- JobSets against the JobSet CRD's ``openAPIV3Schema`` (``reference/jobset/jobset.x-k8s.io_jobsets.yaml``), and each
  replicated job's template as the ``batch/v1`` Job the JobSet controller will create (``kubernetes-validate``);
- TrainJobs and runtimes against the CRDs we ship, with unknown fields rejected (``kubectl``'s strict field
  validation);
- Events against Kubernetes' own schema.

    server = StandInServer(validators=reference_validators(Path("../shared/reference")))
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from trainjob.backends.kubernetes.crds import crd_schema, custom_resource_definitions
from trainjob.backends.kubernetes.testing.standin import Validator

#: The Kubernetes version whose schemas ``kubernetes-validate`` checks built-in objects against.
KUBERNETES_VERSION = "1.32"


def schema_problems(validator: jsonschema.protocols.Validator, obj: Any) -> list[str]:
    """Every schema violation as ``path.to.field: message``."""
    problems = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) for p in error.absolute_path) or "<root>"
        problems.append(f"{path}: {error.message[:300]}")
    return problems


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy where objects with declared properties reject unknown fields (unless they preserve them)."""
    out = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(out)
    return out


def kubernetes_problems(obj: dict[str, Any]) -> list[str]:
    """Problems ``kubernetes-validate`` finds in a built-in object (strict: unknown fields are errors)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        caught = getattr(exc, "caught_exc", None)
        path = ".".join(str(p) for p in getattr(caught, "absolute_path", [])) or "<root>"
        message = getattr(caught, "message", str(exc).splitlines()[0])
        return [f"{obj['kind']} {path}: {message[:300]}"]
    return []


def replicated_jobs_as_jobs(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``batch/v1`` Jobs a JobSet controller creates (one per replicated job, first replica)."""
    name = jobset["metadata"]["name"]
    return [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{name}-{rj['name']}-0", **(rj["template"].get("metadata") or {})},
            "spec": rj["template"]["spec"],
        }
        for rj in jobset.get("spec", {}).get("replicatedJobs", [])
    ]


@functools.cache
def _jobset_validator(path: Path) -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    schema = version["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(strict(schema))


def jobset_validator(reference: Path) -> Validator:
    validator = _jobset_validator(reference / "jobset" / "jobset.x-k8s.io_jobsets.yaml")

    def validate(jobset: dict[str, Any]) -> list[str]:
        problems = schema_problems(validator, jobset)
        for job in replicated_jobs_as_jobs(jobset):
            problems += kubernetes_problems(job)
        return problems

    return validate


def crd_validators() -> dict[str, Validator]:
    """``group/version/plural -> validator`` for the CRDs we ship (strict)."""
    out: dict[str, Validator] = {}
    for crd in custom_resource_definitions():
        spec = crd["spec"]
        key = f"{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
        out[key] = functools.partial(schema_problems, jsonschema.Draft7Validator(strict(crd_schema(crd))))
    return out


def reference_validators(reference: Path) -> dict[str, Validator]:
    """Everything the stand-in should check, keyed by resource (``jobset.x-k8s.io/v1alpha2/jobsets`` ...)."""
    return {
        **crd_validators(),
        "jobset.x-k8s.io/v1alpha2/jobsets": jobset_validator(reference),
        "v1/events": kubernetes_problems,
        "v1/pods": kubernetes_problems,
    }
