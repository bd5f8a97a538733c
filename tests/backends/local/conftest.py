"""Fixtures for local backend tests: a backend on the test's TRAINJOB_HOME that leaves no process behind."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobtest.local import elastic_runtime

from trainjob.backends.local.client.backend import LocalBackend


@pytest.fixture
def backend(local_jobs: LocalBackend) -> LocalBackend:
    """The local backend of tests/conftest.py's ``local_jobs``: no job or process outlives the test."""
    return local_jobs


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str, str], str]:
    """Write a script into the test's temp dir; returns its absolute path."""

    def write(name: str, source: str) -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source), encoding="utf-8")
        return str(path)

    return write


@pytest.fixture
def elastic_runtimes(tmp_path: Path) -> list[Any]:
    """``torch-elastic``: 1 to 2 nodes of one process each, the node group restarted at most once."""
    return [elastic_runtime("torch-elastic", min_nodes=1, max_nodes=2, max_restarts=1)]



@pytest.fixture
def probe(script: Callable[[str, str], str]) -> str:
    """A worker that never imports torch: it records what torchrun and the backend gave it, then exits."""
    return script("probe.py", PROBE)


PROBE = """
    import json, os, sys, time
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
            "TRAINJOB_JOB_NAME", "TRAINJOB_JOB_DIR", "TRAINJOB_METRICS_FILE", "CUDA_VISIBLE_DEVICES", "GROUP_RANK",
            "PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR", "GREETING"]
    seen = {key: os.environ.get(key) for key in keys}
    seen["cpus"] = sorted(os.sched_getaffinity(0))
    job_dir = os.environ["TRAINJOB_JOB_DIR"]
    with open(os.path.join(job_dir, f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)
    if os.environ["RANK"] == "0":
        for i in range(40):
            print(f"line {i}", flush=True)
            time.sleep(0.01)
        with open(os.environ["TRAINJOB_METRICS_FILE"], "a") as f:
            for step in (10, 20):
                f.write(json.dumps({"time": time.time(), "step": step, "total_steps": 40,
                                    "metrics": {"loss": 1.0 / step}}) + "\\n")
                time.sleep(0.2)
"""


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, trainjob_home: Path) -> Callable[[str, str | None, str | None], None]:
    """``settings(VARIABLE, value, config)``: set an environment variable and the config file's text for the test
    (``None``: leave it unset)."""

    def apply(variable: str, value: str | None, config: str | None) -> None:
        if value is not None:
            monkeypatch.setenv(variable, value)
        if config is not None:
            trainjob_home.mkdir(parents=True, exist_ok=True)
            (trainjob_home / "config.yaml").write_text(config, encoding="utf-8")

    return apply
