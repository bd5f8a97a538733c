"""The node agent (the test cluster's only stand-in) does what a kubelet does for the pods trainjob creates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubetest.cluster import TrainJobCluster, wait_for


def run_pod(k8s: TrainJobCluster, namespace: str, pod: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    k8s.api.core.create_namespaced_pod(namespace, pod)

    def finished() -> dict[str, Any] | None:
        answer = k8s.api.core.read_namespaced_pod(pod["metadata"]["name"], namespace, _preload_content=False)
        current = json.loads(answer.data)
        return current if current["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_for(finished, timeout, f"pod {pod['metadata']['name']} to finish")


def test_volumes_environment_and_termination_message(k8s: TrainJobCluster, namespace: str, workdir: Path) -> None:
    shared = workdir / "nas"
    k8s.cp.apply(
        [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": namespace},
             "data": {"lr": "0.1"}},
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-pv"},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                      "hostPath": {"path": str(shared), "type": "DirectoryOrCreate"}, "storageClassName": "manual",
                      "claimRef": {"namespace": namespace, "name": "data"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": namespace},
             "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                      "resources": {"requests": {"storage": "1Gi"}}, "volumeName": f"{namespace}-pv"}},
        ]
    )
    script = (
        'echo "rank=$RANK lr=$LR host=$(hostname) ns=$NS" && cat /etc/cfg/lr && echo shared > /data/out.txt '
        '&& echo scratch > /scratch/x && ls /var/run/secrets/kubernetes.io/serviceaccount && echo mine > /run/pod-only '
        '&& echo "tmp=$TMPDIR" && touch "$TMPDIR/$NS-scratch" '
        '&& echo "bad things happened" > /dev/termination-log && exit 3'
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "volumes", "annotations": {"batch.kubernetes.io/job-completion-index": "5"}},
        "spec": {
            "restartPolicy": "Never",
            "hostname": "worker-5",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "RANK", "valueFrom": {"fieldRef": {
                            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                        {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "lr"}}},
                        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    ],
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/etc/cfg"},
                        {"name": "data", "mountPath": "/data"},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ],
                }
            ],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "scratch", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }
    # mount points the host lacks are made for the pod and go with it; ones the host already has are left alone
    mount_points = {path: path.exists() for path in (Path("/scratch"), Path("/data"))}
    done = run_pod(k8s, namespace, pod)
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (done["status"]["phase"], terminated["exitCode"]) == ("Failed", 3)
    assert terminated["message"].strip() == "bad things happened"
    # the container's /run (where the token is mounted) is its own: a host process never sees a pod's mount points
    assert not Path("/run/pod-only").exists()
    log = k8s.api.core.read_namespaced_pod_log("volumes", namespace)
    assert f"rank=5 lr=0.1 host=worker-5 ns={namespace}" in log
    assert "0.1" in log.splitlines()[1] and "token" in log
    assert (shared / "out.txt").read_text() == "shared\n"  # the claim's volume is the PV's host path
    # temporary files stay with the container (torchrun's torchelastic_* folders would pile up in the host's /tmp)
    assert "tmp=/var/tmp" in log.splitlines()
    assert not Path(f"/var/tmp/{namespace}-scratch").exists()
    assert {path: path.exists() for path in mount_points} == mount_points, "mount points are cleaned up"


def test_fallback_to_logs_on_error_keeps_the_end_of_the_log(k8s: TrainJobCluster, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "noisy"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", "seq 1 500; echo 'ValueError: the last word'; exit 1"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        },
    }
    message = run_pod(k8s, namespace, pod)["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
    lines = message.splitlines()
    assert lines[-1] == "ValueError: the last word" and len(lines) <= 80 and len(message) <= 2048
