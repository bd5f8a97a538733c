"""A TrainJob through the real ``kubectl`` (built with the control plane), as a cluster user drives it: apply a
YAML file, list with the State column, explain the schema, wait for Complete, read a node's log, delete with
everything the job made."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubetest.cluster import TrainJobCluster, wait_for

SCRIPT = str(Path(__file__).parent / "ddp_script.py")


def test_apply_get_explain_wait_logs_and_delete_a_trainjob(k8s: TrainJobCluster, namespace: str,
                                                           tmp_path: Path) -> None:
    manifest = tmp_path / "trainjob.yaml"
    manifest.write_text(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "by-kubectl"},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 2, "command": ["torchrun", SCRIPT, "--steps", "3"],
                             "resourcesPerNode": {"requests": {"cpu": "1"}}}},
    }), encoding="utf-8")
    ns = ["-n", namespace]

    assert k8s.kubectl("apply", *ns, "-f", str(manifest)).stdout.strip() == \
        "trainjob.trainer.kubeflow.org/by-kubectl created"
    explained = k8s.kubectl("explain", "trainjob.spec.trainer").stdout
    assert "Overrides for the runtime's trainer" in explained and "numProcPerNode" in explained, explained
    waited = k8s.kubectl("wait", *ns, "--for=condition=Complete", "trainjob/by-kubectl", "--timeout=180s",
                         timeout=200, check=False)
    if waited.returncode != 0:  # say where the job stands, and its pods and events
        where = [k8s.kubectl(*args, check=False).stdout for args in (
            ("get", *ns, "trainjob", "by-kubectl", "-o", "jsonpath={.status}"), ("get", *ns, "pods", "-o", "wide"),
            ("get", *ns, "events", "--sort-by=.lastTimestamp"))]
        raise AssertionError(f"kubectl wait: {waited.stderr.strip()}\n" + "\n".join(where))

    header, row = k8s.kubectl("get", *ns, "trainjobs").stdout.strip().splitlines()
    cells = dict(zip(header.split(), row.split(), strict=False))
    assert (cells["NAME"], cells["STATE"]) == ("by-kubectl", "Complete"), (header, row)

    pods = k8s.kubectl("get", *ns, "pods", "-l", "jobset.sigs.k8s.io/jobset-name=by-kubectl",
                       "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert len(pods) == 2, pods
    logs = "".join(k8s.kubectl("logs", *ns, pod, "-c", "node").stdout for pod in pods)
    assert "rank 0/2" in logs and "rank 1/2" in logs, logs

    deleted = k8s.kubectl("delete", *ns, "trainjob", "by-kubectl").stdout
    assert deleted.startswith('trainjob.trainer.kubeflow.org "by-kubectl" deleted'), deleted
    wait_for(lambda: not k8s.kubectl("get", *ns, "jobsets,pods", "-o", "name").stdout.strip(), 60,
             "the JobSet and pods to go with the TrainJob")
