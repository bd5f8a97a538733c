"""PyTorchJob ``kubeflow.org/v1`` end to end on the test cluster: seed 004's kubectl workflow as written (the real
``kubectl``, built with the control plane), the Training Operator v1 SDK (``kubeflow-training``) against the
operator, and a failing job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster, wait_for

from trainjob.backends.kubernetes.resources import PYTORCHJOBS

HERE = Path(__file__).resolve().parent

#: Seed 004's ``pytorch-job.yaml`` made runnable here: the cluster's training image (``{image}``) instead of
#: ``my-training:latest``, a CPU request instead of GPUs, the DDP script (gloo) run by ``python`` as v1 runs it
#: (MASTER_ADDR, RANK, WORLD_SIZE from the operator), 1 master + 2 workers. The script comes from this folder,
#: mounted read-only (hostPath: the nodes are this host) where the seed's image would have it baked in.
SEED_MANIFEST = f"""
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: my-training
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: pytorch
            image: {{image}}
            command: [python, {HERE / "ddp_script.py"}, --steps=2]
            resources:
              requests:
                cpu: 100m
            volumeMounts: [{{{{name: tests, mountPath: {HERE}, readOnly: true}}}}]
          volumes: [{{{{name: tests, hostPath: {{{{path: {HERE}, type: Directory}}}}}}}}]
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: pytorch
            image: {{image}}
            command: [python, {HERE / "ddp_script.py"}, --steps=2]
            env:
            - name: NCCL_DEBUG
              value: INFO
            resources:
              requests:
                cpu: 100m
            volumeMounts: [{{{{name: tests, mountPath: {HERE}, readOnly: true}}}}]
          volumes: [{{{{name: tests, hostPath: {{{{path: {HERE}, type: Directory}}}}}}}}]
"""


@pytest.fixture(scope="module")
def seed_job(k8s: TrainJobCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """Seed 004's job applied in its own namespace and run to its end (shared by the checks below)."""
    namespace = "pytorchjob-seed"
    k8s.kubectl("create", "namespace", namespace)
    manifest = tmp_path_factory.mktemp("seed004") / "pytorch-job.yaml"
    manifest.write_text(SEED_MANIFEST.format(image=k8s.cp.training_image), encoding="utf-8")
    applied = k8s.kubectl("apply", "-n", namespace, "-f", str(manifest))  # kubectl apply -f pytorch-job.yaml
    assert applied.stdout.strip() == "pytorchjob.kubeflow.org/my-training created", applied.stdout

    def done() -> dict[str, Any] | None:
        job = k8s.api.get(PYTORCHJOBS, namespace, "my-training") or {}
        conditions = (job.get("status") or {}).get("conditions") or []
        return job if any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in conditions) \
            else None

    job = wait_for(done, timeout=180, what="PyTorchJob my-training to finish")
    return namespace, job


def test_seed_manifest_succeeds_and_reads_like_kubectl_get(k8s: TrainJobCluster,
                                                           seed_job: tuple[str, dict[str, Any]]) -> None:
    namespace, job = seed_job
    conditions = [(c["type"], c["status"]) for c in job["status"]["conditions"]]
    assert conditions[-1] == ("Succeeded", "True"), job["status"]
    assert ("Created", "True") in conditions
    assert job["status"]["replicaStatuses"]["Master"]["succeeded"] == 1
    assert job["status"]["startTime"] <= job["status"]["completionTime"]
    listed = k8s.kubectl("get", "-n", namespace, "pytorchjob", "my-training").stdout  # kubectl get pytorchjob my-training
    header, row = listed.strip().splitlines()
    assert header.split()[:2] == ["NAME", "STATE"] and row.split()[:2] == ["my-training", "Succeeded"], listed


def test_pods_are_found_by_job_name_and_worker_0_logs_its_rank(k8s: TrainJobCluster,
                                                                seed_job: tuple[str, dict[str, Any]]) -> None:
    namespace, _ = seed_job

    def listing() -> tuple[str, list[list[str]]]:
        listed = k8s.kubectl("get", "-n", namespace, "pods", "-l", "training.kubeflow.org/job-name=my-training").stdout
        return listed, [line.split() for line in listed.strip().splitlines()[1:]]

    listed, rows = listing()
    assert sorted(row[0] for row in rows) == ["my-training-master-0", "my-training-worker-0", "my-training-worker-1"]
    # v1 ends the job when the master succeeds; a worker may still be exiting then, so wait for every pod's end
    wait_for(lambda: {row[2] for row in listing()[1]} == {"Completed"}, timeout=60,
             every=0.5, what="every pod of my-training to show kubectl's Completed")
    log = k8s.kubectl("logs", "-n", namespace, "-f", "my-training-worker-0").stdout  # follows to the end
    assert "rank 1/3" in log, log
    services = {s.metadata.name for s in k8s.api.core.list_namespaced_service(namespace).items}
    assert "my-training-master-0" in services


def test_training_operator_sdk_runs_a_job_to_success(k8s: TrainJobCluster, namespace: str) -> None:
    from kubeflow.training import (
        KubeflowOrgV1PyTorchJob,
        KubeflowOrgV1PyTorchJobSpec,
        KubeflowOrgV1ReplicaSpec,
        KubeflowOrgV1RunPolicy,
        TrainingClient,
    )
    from kubernetes.client import V1Container, V1ObjectMeta, V1PodSpec, V1PodTemplateSpec

    def replica(count: int) -> KubeflowOrgV1ReplicaSpec:
        command = ["python", "-c", "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"]
        return KubeflowOrgV1ReplicaSpec(replicas=count, restart_policy="OnFailure", template=V1PodTemplateSpec(
            spec=V1PodSpec(containers=[V1Container(name="pytorch", image=k8s.cp.training_image, command=command)])))

    client = TrainingClient(config_file=str(k8s.kubeconfig), namespace=namespace, job_kind="PyTorchJob")
    client.create_job(KubeflowOrgV1PyTorchJob(
        api_version="kubeflow.org/v1", kind="PyTorchJob", metadata=V1ObjectMeta(name="sdk-job"),
        spec=KubeflowOrgV1PyTorchJobSpec(run_policy=KubeflowOrgV1RunPolicy(clean_pod_policy="None"),
                                         pytorch_replica_specs={"Master": replica(1), "Worker": replica(1)})))
    client.wait_for_job_conditions("sdk-job", expected_conditions={"Succeeded"}, timeout=120, polling_interval=1)
    assert client.is_job_succeeded("sdk-job")
    logs, _ = client.get_job_logs("sdk-job", is_master=True)
    assert list(logs) == ["sdk-job-master-0"] and "rank 0 of 2" in logs["sdk-job-master-0"]
    assert sorted(client.get_job_pod_names("sdk-job", is_master=False)) == ["sdk-job-master-0", "sdk-job-worker-0"]
    client.delete_job("sdk-job")
    wait_for(lambda: k8s.api.get(PYTORCHJOBS, namespace, "sdk-job") is None, what="the job to be deleted")


def test_a_failing_worker_is_recreated_then_fails_the_job_and_everything_is_cleaned(
        k8s: TrainJobCluster, namespace: str) -> None:
    """restartPolicy ExitCode, backoffLimit 1: exit 137 is retried once, then the job fails naming the pod;
    cleanPodPolicy All removes the pods and services; ttlSecondsAfterFinished removes the job."""
    image = k8s.cp.training_image
    # A container's PID 1 (sh here) ignores SIGTERM: a short grace period, or deleting the pods takes 30 s.
    template = {"spec": {"terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "pytorch", "image": image, "command": ["sh", "-c", "sleep 60"]}]}}
    failing = {"spec": {"terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "pytorch", "image": image, "command": ["sh", "-c", "exit 137"]}]}}
    k8s.api.create({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                    "metadata": {"name": "failing", "namespace": namespace},
                    "spec": {"runPolicy": {"backoffLimit": 1, "cleanPodPolicy": "All", "ttlSecondsAfterFinished": 3},
                             "pytorchReplicaSpecs": {
                                 "Master": {"restartPolicy": "ExitCode", "template": template},
                                 "Worker": {"replicas": 1, "restartPolicy": "ExitCode", "template": failing}}}},
                   PYTORCHJOBS)

    def failed() -> dict[str, Any] | None:
        job = k8s.api.get(PYTORCHJOBS, namespace, "failing") or {}
        last = ((job.get("status") or {}).get("conditions") or [{}])[-1]
        return last if last.get("type") == "Failed" else None

    condition = wait_for(failed, timeout=60, what="the job to fail")
    assert "pod failing-worker-0 exited with code 137" in condition["message"]
    events = k8s.api.list_events(namespace, "failing")
    assert "PyTorchJobRestarting" in [e["reason"] for e in events]
    wait_for(lambda: not k8s.api.list_pods(namespace, "training.kubeflow.org/job-name=failing"),
             what="cleanPodPolicy All to delete the pods")
    assert not k8s.api.core.list_namespaced_service(namespace).items
    wait_for(lambda: k8s.api.get(PYTORCHJOBS, namespace, "failing") is None, what="the TTL to delete the job")


def test_a_script_that_cannot_start_crash_loops_as_restarting_with_its_last_words(k8s: TrainJobCluster,
                                                                                  namespace: str) -> None:
    """Seed 004's flow with a wrong script path, as a new user tries it: ``restartPolicy: OnFailure`` makes the
    kubelet restart the container into CrashLoopBackOff; the job says ``Restarting`` with python's own words, not
    ``Running``, and ``kubectl get pytorchjob`` shows it."""
    manifest = SEED_MANIFEST.format(image=k8s.cp.training_image).replace(
        f"[python, {HERE / 'ddp_script.py'}, --steps=2]", "[python, /workspace/no-such-train.py]")
    k8s.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def restarting() -> dict[str, Any] | None:
        job = k8s.api.get(PYTORCHJOBS, namespace, "my-training") or {}
        conditions = (job.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Restarting" and c["status"] == "True"
                     and "CrashLoopBackOff" in c.get("message", "")), None)

    condition = wait_for(restarting, timeout=120, what="the crash loop named in a Restarting condition")
    assert "can't open file '/workspace/no-such-train.py'" in condition["message"], condition
    shown = k8s.kubectl("get", "pytorchjob", "my-training", "-n", namespace).stdout
    assert "Restarting" in shown, shown
    k8s.kubectl("delete", "pytorchjob", "my-training", "-n", namespace, "--wait=false")
