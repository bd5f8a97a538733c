"""Every TrainJob and ClusterTrainingRuntime manifest in the seeds loads, dumps back, and fits the Kubeflow CRDs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trainjob.api import dump_yaml, load_resources

SEED_COPIES = Path(__file__).resolve().parent / "seed_manifests"
SEED_IDS = [p.stem for p in sorted(SEED_COPIES.glob("*.yaml"))]


def _flat(text: str) -> list[str]:
    """Lines without comments, indentation and blank lines: how seed 001 prints the same manifests."""
    lines = (re.sub(r"\s+", " ", line.split("#", 1)[0]).strip() for line in text.splitlines())
    return [line for line in lines if line]


def test_the_copies_under_tests_are_the_manifests_of_seed_000(seed_text, yaml_blocks):
    blocks = yaml_blocks(seed_text("000"))
    assert [(SEED_COPIES / f"{i}.yaml").read_text(encoding="utf-8") for i in SEED_IDS] == blocks


def test_seed_001_holds_the_same_manifests_with_indentation_flattened(seed_text, yaml_blocks):
    lines_001 = _flat(seed_text("001"))
    blocks_000 = yaml_blocks(seed_text("000"))
    assert (
        sum(line == "apiVersion: trainer.kubeflow.org/v1alpha1" for line in lines_001) == len(blocks_000) == 4
    )
    for block in blocks_000:
        assert "\n".join(_flat(block)) in "\n".join(lines_001)


@pytest.mark.parametrize("seed_id", SEED_IDS)
def test_seed_manifest_loads_and_dumps_back_to_the_same_resource(seed_id, seed_manifests):
    (resource,) = load_resources(seed_manifests[seed_id])
    (again,) = load_resources(dump_yaml([resource]))
    assert again == resource
    assert resource.kind in ("TrainJob", "ClusterTrainingRuntime")


@pytest.mark.parametrize("seed_id", SEED_IDS)
def test_seed_manifest_fits_the_kubeflow_crd_as_written_and_as_dumped(seed_id, seed_manifests, crd_errors):
    (resource,) = load_resources(seed_manifests[seed_id])
    assert crd_errors(yaml.safe_load(seed_manifests[seed_id])) == []
    assert crd_errors(resource.to_dict()) == []
