"""Check objects against a CRD's ``openAPIV3Schema`` the way an API server with structural schemas treats them.

An API server silently drops (prunes) fields its schema does not list; :func:`crd_validator` makes such fields
errors instead, so a check proves that nothing in the object would be lost. Needs ``jsonschema`` (the ``dev``
extra).

>>> check = crd_validator("jobset.x-k8s.io_jobsets.yaml", version="v1alpha2")   # doctest: +SKIP
>>> check({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spek": {}})  # doctest: +SKIP
["<root>: Additional properties are not allowed ('spek' was unexpected)"]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def forbid_unknown_fields(schema: Any) -> Any:
    """A copy of ``schema`` with ``additionalProperties: false`` wherever it lists ``properties``."""
    if isinstance(schema, dict):
        out = {k: forbid_unknown_fields(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [forbid_unknown_fields(v) for v in schema]
    return schema


def crd_schema(crd: Path | str | dict[str, Any], version: str | None = None) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``version`` (default: the first) in a CRD file or dict."""
    if not isinstance(crd, dict):
        crd = yaml.safe_load(Path(crd).read_text(encoding="utf-8"))
    versions = crd["spec"]["versions"]
    chosen = next((v for v in versions if v["name"] == version), None) if version else versions[0]
    if chosen is None:
        raise KeyError(f"CRD {crd['metadata']['name']} has no version {version!r}")
    return chosen["schema"]["openAPIV3Schema"]


def crd_validator(
    crd: Path | str | dict[str, Any], version: str | None = None
) -> Callable[[dict[str, Any]], list[str]]:
    """A function giving every problem of an object under the CRD's schema (unknown fields included), as
    ``"spec.replicatedJobs.0.name: ..."`` lines; an empty list means the object fits."""
    import jsonschema

    validator = jsonschema.Draft7Validator(forbid_unknown_fields(crd_schema(crd, version)))

    def errors(obj: dict[str, Any]) -> list[str]:
        found = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found]

    return errors
