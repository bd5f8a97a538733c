"""The ``trainjob`` command line with ``--backend kubernetes`` on the real control plane, as a user types it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from kubetest.cluster import TrainJobCluster, wait_for

pytestmark = pytest.mark.netns

SCRIPT = str(Path(__file__).resolve().parent / "ddp_script.py")


def test_apply_wait_list_logs_delete(k8s: TrainJobCluster, namespace: str, workdir: Path) -> None:
    kubeconfig = yaml.safe_load(k8s.kubeconfig.read_text())
    kubeconfig["contexts"][0]["context"]["namespace"] = namespace
    (workdir / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    env = {"KUBECONFIG": str(workdir / "kubeconfig"), "TRAINJOB_BACKEND": "kubernetes"}
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "cli-ddp"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 2,
                "command": [str(Path(sys.executable).parent / "torchrun"), SCRIPT, "--steps", "4"],
                "resourcesPerNode": {"requests": {"cpu": "1"}},
            },
        },
    }
    (workdir / "job.yaml").write_text(yaml.safe_dump(job))

    k8s.trainjob("apply", "-f", str(workdir / "job.yaml"), env=env)
    k8s.trainjob("wait", "cli-ddp", "--for", "Complete", "--timeout", "240", env=env)
    listing = k8s.trainjob("list", env=env).stdout
    assert "cli-ddp" in listing and "Complete" in listing, listing
    logs = k8s.trainjob("logs", "cli-ddp", "--node", "1", env=env).stdout
    assert "rank 1/2" in logs and "rank 0/2" not in logs, logs
    k8s.trainjob("delete", "cli-ddp", env=env)
    wait_for(lambda: not k8s.pods("cli-ddp", namespace), 60, "the pods to go")
    missing = k8s.trainjob("get", "cli-ddp", env=env, check=False)
    assert missing.returncode != 0 and "not found" in missing.stderr, missing
