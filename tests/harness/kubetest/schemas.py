"""Offline schema checks: objects against a CRD's ``openAPIV3Schema`` (unknown fields rejected, as ``kubectl``'s
strict field validation does) and built-in objects against Kubernetes' own schemas (``kubernetes-validate``).

The real API server checks more (CEL rules, admission, defaults); these are the fast checks that run without one::

    validator = jsonschema.Draft7Validator(strict(crd_schema(crd)))
    assert not schema_problems(validator, obj)
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

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

