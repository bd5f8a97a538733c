"""Fixtures for the runtime tests: jobs and runtimes built from a few fields, schema checks, golden files."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from trainjob.api import ClusterTrainingRuntime, TrainJob
from trainjob.api.schema import crd_validator

HERE = Path(__file__).resolve().parent
#: The Kubernetes version whose schemas the rendered Jobs are checked against.
KUBERNETES_VERSION = "1.33.0"
#: Set to 1 to rewrite tests/runtime/golden/*.yaml from the current rendering instead of comparing.
UPDATE_GOLDEN = "TRAINJOB_UPDATE_GOLDEN"


@pytest.fixture
def make_job() -> Callable[..., TrainJob]:
    """``make_job(numNodes=2, env=[...], runtime="torch-distributed", spec={...})``: a TrainJob named ``mnist``
    whose ``spec.trainer`` holds the keyword fields."""

    def make(
        *, runtime: str = "torch-distributed", name: str = "mnist", spec: dict | None = None, **trainer: Any
    ):
        body: dict[str, Any] = {"runtimeRef": {"name": runtime}, **(spec or {})}
        if trainer:
            body["trainer"] = trainer
        return TrainJob.from_dict({"metadata": {"name": name}, "spec": body})

    return make


@pytest.fixture
def make_runtime() -> Callable[..., ClusterTrainingRuntime]:
    """``make_runtime(mlPolicy={...}, container={...}, podGroupPolicy={...}, jobs=[...])``: a
    ClusterTrainingRuntime ``rt`` whose ``node`` job runs one ``node`` container (``container`` fields added)."""

    def make(*, name: str = "rt", container: dict | None = None, jobs: list | None = None, **spec: Any):
        node = {
            "name": "node",
            "template": {
                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": "node", "image": "torch:1", **(container or {})}]}
                    }
                },
            },
        }
        template = {"spec": {"replicatedJobs": [*(jobs or []), node]}}
        return ClusterTrainingRuntime.from_dict(
            {"metadata": {"name": name}, "spec": {**spec, "template": template}}
        )

    return make


@pytest.fixture
def dataset_initializer_job() -> dict[str, Any]:
    """A ``dataset-initializer`` replicated job (one pod, 1 CPU, ``STORAGE_URI=old``) for ``make_runtime(jobs=...)``."""
    container = {
        "name": "dataset-initializer",
        "image": "init:1",
        "env": [{"name": "STORAGE_URI", "value": "old"}],
        "resources": {"requests": {"cpu": "1"}},
    }
    return {
        "name": "dataset-initializer",
        "template": {"spec": {"template": {"spec": {"containers": [container]}}}},
    }


@pytest.fixture(scope="session")
def jobset_errors() -> Callable[[dict[str, Any]], list[str]]:
    """``jobset_errors(obj)``: what the JobSet CRD (with unknown fields forbidden) says is wrong with ``obj``."""
    from kubetest.reference import reference_file

    try:  # from sigs.k8s.io/jobset's Go module
        crd = reference_file("jobset", "jobset.x-k8s.io_jobsets.yaml")
    except LookupError as exc:
        pytest.skip(str(exc))
    return crd_validator(crd, version="v1alpha2")


@pytest.fixture(scope="session")
def kubernetes_job_errors() -> Callable[[dict[str, Any], str], list[str]]:
    """``kubernetes_job_errors(replicated_job, name)``: what Kubernetes' own (strict) schema says is wrong with
    the batch/v1 Job a replicated job's template describes."""

    def errors(replicated_job: dict[str, Any], name: str) -> list[str]:
        template = replicated_job["template"]
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, **template.get("metadata", {})},
            "spec": template["spec"],
        }
        try:
            kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
        return []

    return errors


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """``golden("name", text)``: ``text`` must equal tests/runtime/golden/name.yaml (rewritten when
    ``TRAINJOB_UPDATE_GOLDEN=1``)."""

    def check(name: str, text: str) -> None:
        path = HERE / "golden" / f"{name}.yaml"
        if os.environ.get(UPDATE_GOLDEN) == "1":
            path.write_text(text, encoding="utf-8")
        assert path.is_file(), f"no golden file {path}; run with {UPDATE_GOLDEN}=1 to create it"
        assert text == path.read_text(encoding="utf-8")

    return check
