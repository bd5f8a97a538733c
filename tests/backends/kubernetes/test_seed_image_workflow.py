"""Seed 004's workflow from image to logs, as written, on the test cluster's real nodes:

1. a training image from the seed's Dockerfile (``WORKDIR /workspace``, ``COPY . .``, ``CMD ["python",
   "train.py"]``), built with buildah;
2. ``login`` to a private registry (the registry with htpasswd authentication, as ACR asks for a login) and
   ``push``; the nodes pull it with the pull secret ``kubectl create secret docker-registry`` makes, given to the
   namespace's default ServiceAccount;
3. the seed's ``training-data`` claim (ReadWriteMany, ``storageClassName: alicloud-nas``), bound to a statically
   provisioned volume that the test cluster offers under that class (a hostPath: both nodes are this host, so it is
   shared storage), filled through the seed's temporary pod (``kubectl run data-upload --rm -i --overrides=...``);
4. seed 004's multi-node ``pytorch-job.yaml`` with that image and the claim at ``/data``, then ``kubectl get
   pytorchjob``, ``kubectl get pods -l training.kubeflow.org/job-name=...`` and ``kubectl logs -f ...-worker-0``:
   each worker reads the uploaded data;
5. the same data through arena's form, ``trainjob submit pytorchjob --image=... --data=training-data:/data``, with
   the cluster's PyTorch image (torchrun runs the script there).

The image is the seed's on the Debian base with Python (no torch: the workflow, not training, is under test here;
DDP in images runs in ``test_real_nodes.py``).
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubetest.cluster import TrainJobCluster, wait_for
from kubetest.images import Builder, Registry, cache_dir, htpasswd_line
from kubetest.nodes import registry_host

USER = "trainer"
#: The seed's training script, as its image holds it: each worker reads the dataset the upload pod wrote.
TRAIN_PY = """
import os, pathlib
rows = [int(x) for x in pathlib.Path("/data/train.csv").read_text().split()]
print(f"worker rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: {len(rows)} rows from /data, "
      f"sum {sum(rows)}", flush=True)
"""
#: Seed 004's Dockerfile, less its ``pip install`` of a requirements file (the image has no network to install
#: from) and on the test base instead of ``pytorch/pytorch``.
DOCKERFILE = """FROM {base}
WORKDIR /workspace
COPY . .
CMD ["python", "train.py"]
"""
#: Seed 004's claim, as written.
CLAIM = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: training-data
spec:
  accessModes:
  - ReadWriteMany
  storageClassName: alicloud-nas
  resources:
    requests:
      storage: 500Gi
"""
#: Seed 004's upload pod: ``--overrides``, with the seed's ``busybox`` replaced by the pushed image.
UPLOAD_OVERRIDES = {"spec": {"containers": [{"name": "upload", "image": "{image}", "command": ["sh"], "stdin": True,
                                             "stdinOnce": True,
                                             "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                             "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "training-data"}}]}}
#: Seed 004's multi-node ``pytorch-job.yaml``: the pushed image, 2 workers instead of 4, CPU instead of GPUs and
#: RDMA (none here), and a smaller ``/dev/shm``; the command, env, claim and tolerations as written.
PYTORCH_JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: pytorch-ddp-multi-node
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      restartPolicy: OnFailure
      template:
        spec:
          tolerations:
          - key: "nvidia.com/gpu"
            operator: "Exists"
            effect: "NoSchedule"
          containers:
          - name: pytorch
            image: {image}
            command:
            - python
            - train.py
            - --epochs=100
            - --batch-size=1024
            env:
            - name: NCCL_DEBUG
              value: INFO
            resources:
              requests:
                cpu: 100m
            volumeMounts:
            - name: data
              mountPath: /data
            - name: shm
              mountPath: /dev/shm
          volumes:
          - name: data
            persistentVolumeClaim:
              claimName: training-data
          - name: shm
            emptyDir:
              medium: Memory
              sizeLimit: 64Mi
"""


@pytest.fixture
def private_registry(k8s: TrainJobCluster, tmp_path: Path) -> Iterator[tuple[Registry, str]]:
    """A registry that asks for a login, known to the nodes' containerd by its address; its password."""
    password = secrets.token_urlsafe(12)
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(htpasswd_line(USER, password))
    registry = Registry.start(tmp_path / "registry", tmp_path / "registry.log", htpasswd=htpasswd)
    nodes = list(k8s.cp.nodes.nodes.values())
    try:
        for node in nodes:
            registry_host(node, registry.address, registry.address)
        yield registry, password
    finally:
        registry.stop()
        for node in nodes:
            shutil.rmtree(node.dir / "certs.d" / registry.address, ignore_errors=True)


def _shared_volume(k8s: TrainJobCluster, namespace: str, path: Path) -> None:
    """A statically provisioned ReadWriteMany volume of class ``alicloud-nas`` for this namespace's claim."""
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    k8s.cp.apply([{
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-nas"},
        "spec": {"capacity": {"storage": "500Gi"}, "accessModes": ["ReadWriteMany"],
                 "storageClassName": "alicloud-nas", "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": namespace, "name": "training-data"},
                 "hostPath": {"path": str(path), "type": "Directory"}},
    }])


def test_seed_004_build_push_upload_apply_and_logs_with_a_private_image(
    k8s: TrainJobCluster, namespace: str, tmp_path: Path, private_registry: tuple[Registry, str]
) -> None:
    registry, password = private_registry
    builder = Builder(cache_dir(), tmp_path / "build.log")
    image = f"{registry.address}/my-ns/training:v1"

    # 1. the image
    context = tmp_path / "context"
    context.mkdir()
    (context / "train.py").write_text(TRAIN_PY)
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=builder.base()))
    local = f"localhost/my-ns/training:{tmp_path.name}"
    builder.buildah("bud", "--quiet", "--pull-never", "-f", str(context / "Dockerfile"), "-t", local, str(context))
    try:
        # 2. login and push: refused without the login, accepted with it
        auth, anonymous = tmp_path / "auth.json", tmp_path / "anonymous.json"
        anonymous.write_text("{}")
        with pytest.raises(RuntimeError, match="(?i)unauthorized|authentication required"):
            builder.buildah("push", "--tls-verify=false", f"--authfile={anonymous}", local,
                            f"docker://{image}")
        builder.buildah("login", "--tls-verify=false", f"--authfile={auth}", "-u", USER, "--password-stdin",
                        registry.address, input=password)
        builder.buildah("push", "--tls-verify=false", f"--authfile={auth}", "--quiet", local, f"docker://{image}")
    finally:
        builder.buildah("rmi", local)
    k8s.kubectl("create", "secret", "docker-registry", "acr-secret", "-n", namespace,
                f"--docker-server={registry.address}", f"--docker-username={USER}", f"--docker-password={password}")
    wait_for(lambda: k8s.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
             30, "the namespace's default ServiceAccount")
    k8s.kubectl("patch", "serviceaccount", "default", "-n", namespace,
                "-p", json.dumps({"imagePullSecrets": [{"name": "acr-secret"}]}))

    # 3. the claim, and the data through the seed's temporary pod
    _shared_volume(k8s, namespace, tmp_path / "nas")
    k8s.kubectl("apply", "-n", namespace, "-f", "-", input=CLAIM)
    wait_for(lambda: k8s.kubectl("get", "pvc", "training-data", "-n", namespace, "-o",
                                 "jsonpath={.status.phase}").stdout == "Bound", 60, "the claim to bind")
    overrides = json.dumps(UPLOAD_OVERRIDES).replace("{image}", image)
    upload = k8s.kubectl("run", "data-upload", "--rm", "-i", "--restart=Never", "-n", namespace, f"--image={image}",
                         f"--overrides={overrides}", "--pod-running-timeout=2m", "--", "sh",
                         input="seq 1 100 > /data/train.csv && echo uploaded $(wc -l < /data/train.csv) rows\nexit\n",
                         timeout=180)
    assert "uploaded 100 rows" in upload.stdout, upload
    assert (tmp_path / "nas" / "train.csv").read_text().split() == [str(i) for i in range(1, 101)]

    # 4. the seed's PyTorchJob, and what the seed looks at
    k8s.kubectl("apply", "-n", namespace, "-f", "-", input=PYTORCH_JOB.format(image=image))
    name = "pytorch-ddp-multi-node"
    wait_for(lambda: k8s.kubectl("get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={name}",
                                 "-o", "jsonpath={.items[*].status.phase}").stdout.split().count("Succeeded") == 2,
             180, "both workers to succeed: " + k8s.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout)
    got = k8s.kubectl("get", "pytorchjob", name, "-n", namespace).stdout
    pods = k8s.kubectl("get", "pods", "-n", namespace, "-l", f"training.kubeflow.org/job-name={name}").stdout
    logs = k8s.kubectl("logs", "-f", f"{name}-worker-0", "-n", namespace, timeout=60).stdout
    assert "worker rank 0 of 2: 100 rows from /data, sum 5050" in logs, (got, pods, logs)
    assert f"{name}-worker-1" in pods, pods

    # 5. arena's form, a TrainJob with the claim at /data: torchrun runs the script, so the image is the cluster's
    # PyTorch image (the slim one above has no torch), and the script the one above, where every pod mounts the
    # session's folder
    k8s.trainjob("submit", "pytorchjob", "--backend", "kubernetes", f"--kubeconfig={k8s.kubeconfig}",
                 "-n", namespace, "--name=arena-training", "--workers=2", f"--image={k8s.cp.training_image}",
                 "--cpu=100m", "--data=training-data:/data", f"python {context / 'train.py'}")
    k8s.wait_for_condition("arena-training", "Complete", namespace=namespace, timeout=180)
    arena_logs = k8s.kubectl("logs", "-n", namespace, "-l", "jobset.sigs.k8s.io/jobset-name=arena-training",
                             "--tail=-1").stdout
    assert arena_logs.count("100 rows from /data, sum 5050") == 2, arena_logs
    print(f"{got}\n{pods}\n{logs}")


def test_htpasswd_lines_hash_with_bcrypt() -> None:
    user, _, hashed = htpasswd_line("u", "p").strip().partition(":")
    assert user == "u" and hashed.startswith("$2b$") and len(hashed) == 60
