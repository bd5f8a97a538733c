"""The ``ray-distributed`` runtime on the test cluster: seed 003's Ray Train script as a 2-node TrainJob, from the
same plan as the local backend (node 0's pod runs the Ray head and the driver, node 1's pod joins it by the
``{job}-node-0-0.{job}`` name). ``train.report``'s loss reaches ``status.trainerStatus`` through the status
endpoint; no log is read for it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from jobtest.ray import ray_processes
from kubetest.cluster import TrainJobCluster, wait_for

ROOT = Path(__file__).resolve().parents[3]
SEED_SCRIPT = ROOT / "examples" / "ray" / "ray_train.py"
EPOCHS = 5

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None and not os.environ.get("TRAINJOB_REQUIRE_RAY"),
    reason="Ray is not installed (pip install 'trainjob[ray]'); TRAINJOB_REQUIRE_RAY=1 makes this a failure",
)


def test_the_seed_ray_train_script_runs_as_a_trainjob_on_the_cluster(
    k8s: TrainJobCluster, namespace: str, tmp_path: Path
) -> None:
    storage = tmp_path / "ray_results"
    k8s.create_job("ray-seed", namespace, runtime="ray-distributed", trainer={
        "numNodes": 2,
        "image": k8s.cp.training_image,  # built with Ray (TRAINING_EXTRAS); rayproject/ray cannot be pulled here
        "command": ["python", str(SEED_SCRIPT), str(storage)],
        "env": [{"name": "EPOCHS", "value": str(EPOCHS)}, {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}],
        "resourcesPerNode": {"requests": {"cpu": "1"}},
    })
    # Ray runs in the pods' network namespaces, where the check below looks (what runs beside them is not counted)
    wait_for(lambda: ray_processes(in_pods=True), timeout=300, what="Ray's processes in the job's pods", every=0.5)
    job = k8s.wait_for_condition("ray-seed", "Complete", namespace=namespace, timeout=600)
    trainer_status = job["status"].get("trainerStatus") or {}
    metrics = {m["name"]: m["value"] for m in trainer_status.get("metrics") or []}
    assert "loss" in metrics, trainer_status
    checkpoints = [p for p in (storage / "my-training").glob("checkpoint_*") if p.is_dir()]
    assert len(checkpoints) == 3, sorted(p.name for p in (storage / "my-training").iterdir())
    wait_for(lambda: not ray_processes(in_pods=True), timeout=60, what="no Ray process left in the pods")
    print(f"Ray TrainJob on the cluster: Complete, loss {metrics['loss']}, {len(checkpoints)} checkpoints kept",
          file=sys.stderr)
