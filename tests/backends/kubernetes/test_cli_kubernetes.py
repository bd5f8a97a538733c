"""The ``trainjob`` command line with ``--backend kubernetes`` on the real control plane, as a user types it:
environment variables or kubectl's flags, ``describe``, ``logs --rank`` of an ``auto`` job, ``delete`` of several."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from kubetest.cluster import TrainJobCluster, wait_for

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
                "command": ["torchrun", SCRIPT, "--steps", "4"],
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


def test_kubectl_flags_describe_rank_logs_and_delete_on_the_cluster(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    flags = ["--backend", "kubernetes", "--kubeconfig", str(k8s.kubeconfig), "-n", namespace]
    env = {"TRAINJOB_BACKEND": "", "KUBECONFIG": ""}
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "cli-auto", "labels": {"team": "k8s"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 2,
                "numProcPerNode": "auto",  # 2 CPUs requested: 2 processes per node, ranks 2-3 on node-1
                "command": ["torchrun", SCRIPT, "--steps", "2"],
                "resourcesPerNode": {"requests": {"cpu": "2"}},
            },
        },
    }
    (workdir / "job.yaml").write_text(yaml.safe_dump(job))
    dry = k8s.trainjob("apply", "-f", str(workdir / "job.yaml"), "--dry-run", *flags, env=env).stdout
    assert "created (dry run): 2 node(s) x 2 process(es)" in dry, dry
    assert k8s.trainjob("list", "-o", "name", *flags, env=env).stdout == ""

    k8s.trainjob("apply", "-f", str(workdir / "job.yaml"), *flags, env=env)
    k8s.trainjob("wait", "cli-auto", "--for", "Complete", "--timeout", "240", *flags, env=env)
    listed = json.loads(k8s.trainjob("list", "-o", "json", "-l", "team=k8s", *flags, env=env).stdout)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["cli-auto"]
    described = k8s.trainjob("describe", "cli-auto", *flags, env=env).stdout
    assert "2 x 2 process(es) (numProcPerNode: auto)" in described and "node-1   2-3" in described, described

    logs = k8s.trainjob("logs", "cli-auto", "--rank", "3", *flags, env=env).stdout
    assert "rank 3/4" in logs and "rank 0/4" not in logs, logs
    wrong = k8s.trainjob("logs", "cli-auto", "--node", "0", "--rank", "3", *flags, env=env, check=False)
    assert wrong.returncode == 2 and "rank 3 runs on node-1, not node-0" in wrong.stderr, wrong
    assert len(k8s.trainjob("logs", "cli-auto", "--tail", "1", *flags, env=env).stdout.splitlines()) == 1

    deleted = k8s.trainjob("delete", "cli-auto", "ghost", *flags, env=env, check=False)
    assert deleted.returncode == 2 and "trainjob/cli-auto deleted" in deleted.stdout, deleted
    assert "trainjob/ghost not found" in deleted.stderr
    missing = k8s.trainjob("list", "--backend", "kubernetes", "--kubeconfig", str(workdir / "nope"), env=env, check=False)
    assert missing.returncode == 2 and "--kubeconfig: no such file" in missing.stderr, missing
