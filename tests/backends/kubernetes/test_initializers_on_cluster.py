"""Dataset and model initializers on the test cluster's real nodes: Kubeflow's images in a runtime run trainjob's
initializer (the training image), the job's ``/workspace`` claim carries the files to the trainer's pods, the real
Kubeflow SDK's ``train(initializer=...)`` works against the operator, and a refused download fails the job fast.

The sources are real servers on this host (VersityGW for S3, the Hub-compatible server), reached by the pods at the
host's address. The cluster has no storage provisioner, so each test binds its job's claim to a ``hostPath``
PersistentVolume made for it, as an administrator provisions storage by hand (both nodes run on this host, so they
share the folder, as pods share a ReadWriteMany volume).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetest.cluster import TrainJobCluster, wait_for
from kubetest.nodes import host_ip
from objectstore.hub import HubServer
from objectstore.s3 import S3Server, require_s3_server

from trainjob.backends.kubernetes.initializer_pods import DEFAULTS_CONFIGMAP
from trainjob.backends.kubernetes.resources import OPERATOR_NAMESPACE

ROWS = 120


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubServer, S3Server]]:
    require_s3_server()
    root = tmp_path_factory.mktemp("sources")
    (root / "alpaca" / "data").mkdir(parents=True)
    (root / "alpaca" / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"instruction": f"say {i}", "output": str(i)}) + "\n" for i in range(ROWS)))
    (root / "alpaca" / "README.md").write_text("# tiny\n")
    (root / "tiny-llama").mkdir()
    (root / "tiny-llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "tiny-llama" / "model.safetensors").write_bytes(os.urandom(100_000))
    address = host_ip()
    with HubServer(host=address) as hub, S3Server(host=address) as s3:
        hub.add_repo("tatsu-lab/alpaca", root / "alpaca", repo_type="dataset")
        hub.add_repo("org/tiny-llama", root / "tiny-llama", repo_type="model")
        s3.make_bucket("datasets")
        for part in range(3):
            s3.put("datasets", f"alpaca/part-{part}.jsonl", b'{"x": 1}\n' * 500)
        yield hub, s3


@pytest.fixture
def hub_mirror(k8s: TrainJobCluster, sources: tuple[HubServer, S3Server]) -> Iterator[str]:
    """The cluster's initializers get HF_ENDPOINT from ConfigMap trainjob-initializer-env, as a cluster without a
    way to the Hub points them at a mirror (``trainjob install --initializer-env``)."""
    hub, _ = sources
    body = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DEFAULTS_CONFIGMAP, "namespace": OPERATOR_NAMESPACE},
            "data": {"HF_ENDPOINT": hub.endpoint}}
    k8s.kubectl("apply", "-f", "-", input=json.dumps(body))
    yield hub.endpoint
    k8s.kubectl("delete", "configmap", "-n", OPERATOR_NAMESPACE, DEFAULTS_CONFIGMAP, "--ignore-not-found")


@contextlib.contextmanager
def workspace_volume(k8s: TrainJobCluster, namespace: str, job: str, folder: Path) -> Iterator[Path]:
    """A hostPath PersistentVolume bound ahead to the job's claim (``<job>-workspace``)."""
    name = f"{namespace}-{job}"[:60]
    body = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": namespace, "name": f"{job}-workspace"}}}
    k8s.kubectl("apply", "-f", "-", input=json.dumps(body))
    try:
        yield folder
    finally:
        k8s.kubectl("delete", "pv", name, "--ignore-not-found", "--wait=false")


def _kubeflow_example(k8s: TrainJobCluster) -> list[dict[str, Any]]:
    """Kubeflow Trainer v2.3.0's examples/yaml/05-multi-step.yaml as released, but for the trainer's image (nothing
    can be pulled here: the cluster's training image instead of pytorch/pytorch)."""
    from kubetest.reference import kubeflow_source

    text = (kubeflow_source() / "examples" / "yaml" / "05-multi-step.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    runtime, job = docs
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][1]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = k8s.cp.training_image
    return [runtime, job]


def test_kubeflows_multi_step_example_runs_trainjobs_initializer_and_the_trainer_lists_the_dataset(
        k8s: TrainJobCluster, namespace: str, hub_mirror: str, tmp_path: Path) -> None:
    runtime, job = _kubeflow_example(k8s)
    assert job["spec"]["initializer"]["dataset"]["storageUri"] == "hf://tatsu-lab/alpaca"
    with workspace_volume(k8s, namespace, job["metadata"]["name"], tmp_path / "workspace"):
        k8s.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([runtime, job]))
        name = job["metadata"]["name"]
        k8s.wait_for_condition(name, "Complete", namespace=namespace, timeout=300)
        # (the example's comments select pods by the ancestor-step label, which JobSet leaves on the Jobs: the pods
        # carry the replicated job's name)
        logs = k8s.kubectl("logs", "-n", namespace, "-l", "jobset.sigs.k8s.io/replicatedjob-name=node",
                           "--tail=-1").stdout
        assert logs.count("Dataset ready at /workspace/dataset (2 entries)") == 2, logs
        init_logs = k8s.kubectl("logs", "-n", namespace, "-l",
                                "jobset.sigs.k8s.io/replicatedjob-name=dataset-initializer", "--tail=-1").stdout
        assert "dataset hf://tatsu-lab/alpaca at " in init_logs and "downloaded in" in init_logs, init_logs
        jobset = k8s.jobset(name, namespace)
        pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == k8s.cp.training_image
        assert (tmp_path / "workspace" / "dataset" / "data" / "train.jsonl").read_text().count("\n") == ROWS


def lists_the_workspace() -> None:
    """A CustomTrainer's function: every rank says what the initializers left in /workspace."""
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"rank {dist.get_rank()}: dataset {sorted(os.listdir('/workspace/dataset'))} "
          f"model {sorted(os.listdir('/workspace/model'))}", flush=True)
    dist.destroy_process_group()


def test_the_kubeflow_sdks_train_with_initializers_runs_against_the_operator(
        k8s: TrainJobCluster, namespace: str, hub_mirror: str, sources: tuple[HubServer, S3Server],
        tmp_path: Path) -> None:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import (
        CustomTrainer,
        HuggingFaceModelInitializer,
        Initializer,
        S3DatasetInitializer,
        TrainerClient,
    )

    _, s3 = sources
    client = TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace,
                                                                  config_file=str(k8s.kubeconfig)))
    name = client.train(
        initializer=Initializer(
            model=HuggingFaceModelInitializer(storage_uri="hf://org/tiny-llama"),
            dataset=S3DatasetInitializer(storage_uri="s3://datasets/alpaca", endpoint=s3.endpoint,
                                         access_key_id=s3.access_key, secret_access_key=s3.secret_key)),
        trainer=CustomTrainer(func=lists_the_workspace, num_nodes=2, resources_per_node={"cpu": 1}))
    with workspace_volume(k8s, namespace, name, tmp_path / "workspace"):
        done = client.wait_for_job_status(name, timeout=300, polling_interval=1)
        assert done.status == "Complete"
        for node in (0, 1):
            text = "\n".join(client.get_job_logs(name, step=f"node-{node}"))
            assert ("dataset ['part-0.jsonl', 'part-1.jsonl', 'part-2.jsonl'] model ['config.json', "
                    "'model.safetensors']") in text, text[-2000:]
        reasons = [event.reason for event in client.get_job_events(name)]
        print(f"events of {name}: {reasons}")
        steps = {step.name for step in client.get_job(name).steps}
        assert steps == {"dataset-initializer", "model-initializer", "node-0", "node-1"}, steps


def test_a_403_from_s3_fails_the_job_within_a_minute_naming_the_uri_and_the_answer(
        k8s: TrainJobCluster, namespace: str, sources: tuple[HubServer, S3Server], tmp_path: Path) -> None:
    _, s3 = sources
    name = "refused"
    with workspace_volume(k8s, namespace, name, tmp_path / "workspace"):
        started = time.monotonic()
        k8s.create_job(name, namespace, initializer={"dataset": {
            "storageUri": "s3://datasets/alpaca",
            "env": [{"name": "ENDPOINT", "value": s3.endpoint}, {"name": "ACCESS_KEY_ID", "value": s3.access_key},
                    {"name": "SECRET_ACCESS_KEY", "value": "not-the-secret"}]}},
            trainer={"command": ["python", "-c", "print('never runs')"]})
        job = k8s.wait_for_condition(name, "Failed", namespace=namespace, timeout=180)
        took = time.monotonic() - started
        failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
        print(f"403 -> Failed in {took:.1f} s: {failed['message']}")
        assert failed["message"].startswith("dataset-initializer: DownloadError: s3://datasets/alpaca (at http://")
        assert "403 SignatureDoesNotMatch" in failed["message"]
        assert took < 60, f"a refused download took {took:.1f} s to fail the job"
        wait_for(lambda: not any(p["metadata"]["labels"].get("jobset.sigs.k8s.io/replicatedjob-name") == "node"
                                 for p in k8s.pods(name, namespace)) or None, 5, "no trainer pod")
