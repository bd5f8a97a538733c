"""What only real nodes show: kubelets with containerd run the pods from images, cgroups enforce their limits, and
cluster DNS resolves the names torchrun rendezvous at."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient
from kubetest.cluster import TrainJobCluster, no_retries, wait_for
from kubetest.controlplane import NODE_NAME, SECOND_NODE

DDP_SCRIPT = str(Path(__file__).resolve().parent / "ddp_script.py")
#: A rank that allocates 32 MiB at a time until its cgroup stops it.
GREEDY_RANK = """
import time
held = []
print("allocating", flush=True)
while True:
    held.append(bytearray(32 << 20))
    time.sleep(0.02)
"""
#: What a rank sees of its container's CPU: the cgroup's quota and period, and torchrun's process count.
CPU_PROBE = """
import json, os
cpu = "/sys/fs/cgroup/cpu"
read = lambda name: int(open(os.path.join(cpu, name)).read())
print("probe " + json.dumps({"quota": read("cpu.cfs_quota_us"), "period": read("cpu.cfs_period_us"),
                             "nproc": int(os.environ["PET_NPROC_PER_NODE"]), "rank": int(os.environ["RANK"])}),
      flush=True)
"""


def _logs(k8s: TrainJobCluster, namespace: str, job: str) -> str:
    return k8s.kubectl("logs", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={job}", "--tail=-1",
                       "--prefix").stdout


def test_the_nodes_are_kubelets_with_containerd_that_pulled_the_training_image(k8s: TrainJobCluster) -> None:
    wide = k8s.kubectl("get", "nodes", "-o", "wide").stdout
    print(wide)
    rows = {line.split()[0]: line for line in wide.splitlines()[1:]}
    assert sorted(rows) == sorted([NODE_NAME, SECOND_NODE]), wide
    version = k8s.cp.components["versions"]["kubernetes"]
    for row in rows.values():
        assert " Ready " in row and f" {version} " in row and "containerd://1.6" in row, row
    image = k8s.cp.training_image
    repository, tag = image.rsplit(":", 1)
    for node in k8s.cp.nodes.nodes.values():
        listed = node.crictl("images", crictl=k8s.cp.components["binaries"]["crictl"])
        print(f"{node.name}:\n{listed}")
        assert re.search(rf"^{re.escape(repository)}\s+{tag}\s+\S+\s+\S+", listed, re.M), listed


def test_a_rank_over_its_memory_limit_is_oom_killed_and_the_job_says_so(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    script = workdir / "greedy.py"
    script.write_text(GREEDY_RANK)
    # The built-in runtime fails the job at the first failed pod (its podFailurePolicy; torchrun exits 1).
    k8s.create_job("greedy", namespace, trainer={
        "numNodes": 1, "command": ["torchrun", str(script)],
        # (a CPU limit too: the Kubeflow SDK reads the device from the limits and knows no memory-only one)
        "resourcesPerNode": {"requests": {"cpu": "100m", "memory": "600Mi"}, "limits": {"cpu": "1", "memory": "600Mi"}},
    })
    job = k8s.wait_for_condition("greedy", "Failed", namespace=namespace, timeout=180)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    pod = k8s.pods("greedy", namespace)[0]
    node = pod["spec"]["nodeName"]
    expected = f"node-0: OOMKilled: container node on node {node} went over its memory limit of 600Mi (exit code 137)"
    print(failed["message"])
    assert expected in failed["message"], failed
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled", terminated  # the kubelet's word, from containerd's OOM event

    described = k8s.kubectl("describe", "trainjob", "greedy", "-n", namespace).stdout
    assert "OOMKilled" in described and "600Mi" in described, described
    cli = k8s.trainjob("describe", "greedy", "--backend", "kubernetes", f"--kubeconfig={k8s.kubeconfig}",
                       "-n", namespace).stdout
    assert expected in cli, cli
    sdk = TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig)))
    assert sdk.get_job("greedy").status == "Failed"


def test_a_pods_cpu_limit_is_its_cgroups_quota_and_auto_processes_follow_it(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    script = workdir / "cpu_probe.py"
    script.write_text(CPU_PROBE)
    k8s.create_job("cpu", namespace, trainer={
        "numNodes": 1, "numProcPerNode": "auto", "command": ["torchrun", str(script)],
        "resourcesPerNode": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}},
    })
    k8s.wait_for_condition("cpu", "Complete", namespace=namespace, timeout=180)
    # two ranks print at once into one pod's log: a line may hold both probes
    probes = [json.loads(found) for found in re.findall(r"probe (\{[^}]*\})", _logs(k8s, namespace, "cpu"))]
    assert sorted(p["rank"] for p in probes) == [0, 1], probes  # auto: 1.5 CPUs round up to 2 processes
    for probe in probes:
        assert probe["nproc"] == 2 and probe["quota"] == probe["period"] * 3 // 2, probe


def test_ranks_on_two_nodes_rendezvous_through_cluster_dns_and_train_to_the_local_loss(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    def one_pod_per_node(spec: dict[str, Any]) -> None:
        no_retries(spec)
        for rj in spec["template"]["spec"]["replicatedJobs"]:
            pod = rj["template"]["spec"]["template"]["spec"]
            pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]},
                "topologyKey": "kubernetes.io/hostname"}]}}

    runtime = k8s.namespaced_runtime(namespace, "spread", one_pod_per_node)
    k8s.create_job("ddp", namespace, runtime=runtime, runtime_kind="TrainingRuntime", trainer={
        "numNodes": 2, "command": ["torchrun", DDP_SCRIPT, "--steps", "6"],
        "resourcesPerNode": {"requests": {"cpu": "200m"}},
    })
    k8s.wait_for_condition("ddp", "Complete", namespace=namespace, timeout=240)
    pods = k8s.pods("ddp", namespace)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted([NODE_NAME, SECOND_NODE]), pods
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0].get("env") or []}
    assert env["PET_MASTER_ADDR"] == "ddp-node-0-0.ddp", env  # a headless Service's name, which CoreDNS resolves
    logs = _logs(k8s, namespace, "ddp")
    cluster_loss = re.search(r"final loss (\S+)", logs)
    assert cluster_loss, logs

    local = subprocess.run(
        [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node=2",
         f"--log-dir={workdir / 'torchrun-logs'}", DDP_SCRIPT, "--steps", "6"],
        capture_output=True, text=True, timeout=180, cwd=workdir,
    )
    local_loss = re.search(r"final loss (\S+)", local.stdout)
    assert local.returncode == 0 and local_loss, local.stdout + local.stderr
    print(f"final loss: {cluster_loss.group(1)} on two nodes, {local_loss.group(1)} in one local torchrun")
    assert cluster_loss.group(1) == local_loss.group(1)


#: A plain torchrun script (no trainjob): rank 1 stops in its "data loader" while rank 0 waits in a collective.
PLAIN_STALL = """
import time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
def load_next_batch():
    time.sleep(600)
print("ready", flush=True)
if dist.get_rank() == 1:
    load_next_batch()
dist.all_reduce(torch.ones(1))
"""


def test_stacks_of_a_script_without_trainjob_are_read_by_an_ephemeral_py_spy_container(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    script = workdir / "plain_stall.py"
    script.write_text(PLAIN_STALL)
    k8s.create_job("plain", namespace, trainer={
        "numNodes": 2, "command": ["torchrun", str(script)], "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    def ready() -> bool:
        pods = k8s.pods("plain", namespace)
        running = len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
        return running and _logs(k8s, namespace, "plain").count("ready") == 2

    wait_for(ready, timeout=180, what="both ranks ready")
    done = k8s.trainjob("stacks", "plain", "--backend", "kubernetes", f"--kubeconfig={k8s.kubeconfig}",
                        "-n", namespace, "--main-thread", "--debug-image", k8s.cp.stacks_image, timeout=180)
    print(done.stdout)
    assert "--- rank 0" in done.stdout and "--- rank 1" in done.stdout, done.stdout + done.stderr
    assert "in load_next_batch" in done.stdout and "all_reduce" in done.stdout, done.stdout
    assert "rank 1 is not in the all_reduce that rank 0 waits in" in done.stdout, done.stdout
    pod = k8s.pods("plain", namespace)[0]
    debug = pod["spec"]["ephemeralContainers"][0]
    assert debug["targetContainerName"] == "node" and debug["image"] == k8s.cp.stacks_image
