"""Fixtures for the API tests: the seeds' manifests and the Kubeflow CRD schemas."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainjob.api.schema import crd_validator

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / ".." / "shared"
SEEDS = SHARED / "seeds"
#: Copies of the seeds' manifests, so the tests that load them still run where ../shared is missing.
SEED_COPIES = HERE / "seed_manifests"
OUR_API = "apiVersion: trainer.kubeflow.org/v1alpha1"
CRD_FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
}


def _yaml_blocks(text: str) -> list[str]:
    return [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if OUR_API in b]


@pytest.fixture(scope="session")
def yaml_blocks() -> Callable[[str], list[str]]:
    """``yaml_blocks(markdown)``: its fenced ```yaml blocks that hold trainer.kubeflow.org resources."""
    return _yaml_blocks


@pytest.fixture(scope="session")
def seed_text() -> Callable[[str], str]:
    """``seed_text("000")``: the text of ../shared/seeds/000_*.txt (the test is skipped where it is missing)."""

    def read(prefix: str) -> str:
        found = sorted(SEEDS.glob(f"{prefix}_*.txt"))
        if not found:
            pytest.skip(f"seed {prefix} not found under {SEEDS}")
        return found[0].read_text(encoding="utf-8")

    return read


@pytest.fixture(scope="session")
def seed_manifests() -> dict[str, str]:
    """``{"000-0": yaml, ...}`` from ../shared/seeds/000_*.txt, else from the copies under tests/api."""
    found = sorted(SEEDS.glob("000_*.txt"))
    if found:
        return {
            f"000-{i}": block for i, block in enumerate(_yaml_blocks(found[0].read_text(encoding="utf-8")))
        }
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(SEED_COPIES.glob("*.yaml"))}


@pytest.fixture(scope="session")
def crd_errors() -> Callable[[dict[str, Any]], list[str]]:
    """``crd_errors(obj)``: what the Kubeflow v2.1.0 CRD of ``obj["kind"]`` (made strict) says is wrong."""
    from kubetest.reference import reference_file

    try:  # from github.com/kubeflow/trainer/v2's Go module, v2.1.0
        validators = {kind: crd_validator(reference_file("kubeflow", name)) for kind, name in CRD_FILES.items()}
    except LookupError as exc:
        pytest.skip(str(exc))
    return lambda obj: validators[obj["kind"]](obj)
