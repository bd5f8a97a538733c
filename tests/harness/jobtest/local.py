"""Helpers for tests of the local backend: job resources, offline wheels, waiting, leak checks.

::

    job = trainjob_resource("probe", ["torchrun", "probe.py"], num_nodes=2, num_proc_per_node=2)
    backend.apply(job)
    wait_until(lambda: backend.get_job("probe").status == "Running", timeout=30)
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path
from typing import Any

import psutil

from jobtest.waiting import wait_until
from trainjob.backends.local.client.backend import LocalBackend
from trainjob.backends.local.processes import JOB_DIR_ENV

__all__ = ["delete_all_jobs", "make_wheel", "processes_under", "trainjob_resource", "wait_until"]


def trainjob_resource(name: str, command: list[str], runtime: str = "torch-distributed", **trainer: Any) -> Any:
    """A validated ``TrainJob``; ``trainer`` takes camelCase or snake_case trainer fields, plus ``spec`` extras."""
    from trainjob.api import TrainJob

    spec_extra = trainer.pop("spec", {})
    camel = {_camel(key): value for key, value in trainer.items()}
    return TrainJob.from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"command": command, **camel}, **spec_extra},
    })


def elastic_runtime(name: str, min_nodes: int, max_nodes: int, max_restarts: int) -> Any:
    """A ClusterTrainingRuntime ``name``: ``min_nodes..max_nodes`` nodes of one process each (torch elastic)."""
    from trainjob.api import resource_from_dict

    container = {"name": "node", "image": "local"}
    return resource_from_dict({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"torch": {"numProcPerNode": 1, "elasticPolicy": {
                "minNodes": min_nodes, "maxNodes": max_nodes, "maxRestarts": max_restarts}}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                             "spec": {"template": {"spec": {"containers": [container]}}}},
            }]}},
        },
    })


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


def processes_under(home: Path) -> list[psutil.Process]:
    """Live processes whose job directory lies under ``home``: what a test must not leave behind."""
    found = []
    prefix = str(home)
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(JOB_DIR_ENV, "").startswith(prefix):
                found.append(process)
        except psutil.Error:
            continue
    return found


def delete_all_jobs(backend: LocalBackend) -> None:
    for job in backend.list_jobs():
        backend.delete_job(job.name)


def make_wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (``import name`` gives ``__version__``) for offline pip installs."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: trainjob-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel
