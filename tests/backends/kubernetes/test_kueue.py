"""Kueue for real (``kubetest.kueue``: its controller manager with the TrainJob integration and its webhooks) in
front of trainjob's operator, used as Kueue's "Run A TrainJob" page says: a ``kueue.x-k8s.io/queue-name`` label.

The queues come from ``trainjob install --kueue`` (a ResourceFlavor, a ClusterQueue with quota for one 2-node job,
a LocalQueue), applied with kubectl. The flavor carries a node label and a toleration, which Kueue puts into the
pods it admits. Pods are sampled every 0.3 s; a job "holds" the node while it has a pod bound and not finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubetest.cluster import TrainJobCluster
from kubetest.controlplane import NODE_NAME
from kubetest.kueue import kueue_controller

QUEUE = "team"
NODES = 2
SAMPLE_EVERY = 0.3
TOLERATION = {"key": "trainjob.dev/training", "operator": "Exists", "effect": "NoSchedule"}
PRIORITIES = {"low": 100, "mid": 500, "high": 1000}

#: A node pod: counts steps, node 0 keeps the step reached in a checkpoint file on a hostPath volume, replaced whole
#: as a checkpoint is (a reader never sees it half written). It stops on SIGTERM, as a training script under
#: torchrun does (as a container's PID 1, Python would otherwise ignore it and run on through the pod's grace period).
STEPS_SCRIPT = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
steps, every = int(sys.argv[1]), float(sys.argv[2])
checkpoint = pathlib.Path("/ckpt/step")
start = int(checkpoint.read_text()) if checkpoint.exists() else 0
print(f"node {os.environ['PET_NODE_RANK']} starts at step {start}", flush=True)
for step in range(start, steps):
    time.sleep(every)
    if os.environ["PET_NODE_RANK"] == "0":
        checkpoint.with_suffix(".tmp").write_text(str(step + 1))
        os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def kueue(k8s: TrainJobCluster) -> Iterator[TrainJobCluster]:
    with kueue_controller(k8s.cp):
        k8s.cp.apply([
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadPriorityClass",
             "metadata": {"name": f"test-{name}"}, "value": value, "description": f"{name} priority (tests)"}
            for name, value in PRIORITIES.items()
        ])
        yield k8s


def _queues(k8s: TrainJobCluster, namespace: str, preemption: bool) -> None:
    """The objects ``trainjob install --kueue`` prints, applied with kubectl: quota for one 2 x 1-CPU job."""
    args = ["install", "--kueue", "--dry-run", "--namespace", namespace, "--queue", QUEUE,
            "--cluster-queue", f"cq-{namespace}", "--flavor", f"flavor-{namespace}", "--cpu", str(NODES),
            "--memory", "8Gi", "--node-label", f"kubernetes.io/hostname={NODE_NAME}",
            "--toleration", "trainjob.dev/training:NoSchedule"]
    if preemption:
        args.append("--preempt-lower-priority")
    printed = k8s.trainjob(*args).stdout
    k8s.kubectl("apply", "-f", "-", input=printed)
    for doc in yaml.safe_load_all(printed):
        if doc["kind"] == "ClusterQueue":
            assert doc["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0] == \
                {"name": "cpu", "nominalQuota": str(NODES)}, doc


def _job_yaml(name: str, namespace: str, priority: str, steps: int, every: float, checkpoints: Path) -> str:
    """A TrainJob as a user writes it for Kueue: the queue and priority labels, suspend left to Kueue."""
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kueue.x-k8s.io/queue-name": QUEUE, "kueue.x-k8s.io/priority-class": f"test-{priority}"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            # torchrun, as training runs: it exits 1 on the SIGTERM of a preemption, which the built-in runtime's
            # podFailurePolicy would take for the script's failure were the pods not marked first
            "trainer": {"numNodes": NODES, "command": ["torchrun", "--nproc-per-node", "1", "--no-python", "python",
                                                       "-c", STEPS_SCRIPT, str(steps), str(every)],
                        "resourcesPerNode": {"requests": {"cpu": "1"}}},
            "podTemplateOverrides": [{
                "targetJobs": [{"name": "node"}],
                "spec": {"volumes": [{"name": "ckpt", "hostPath": {"path": str(checkpoints / name),
                                                                   "type": "DirectoryOrCreate"}}],
                         "containers": [{"name": "node", "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}]},
            }],
        },
    }
    return yaml.safe_dump(job)


def _holding(k8s: TrainJobCluster, namespace: str) -> dict[str, int]:
    """Per job, its pods bound to the node, not finished and not being deleted (a preempted job's pods are told to
    stop, and the scheduler counts their CPUs until they are gone)."""
    held: dict[str, int] = {}
    for pod in k8s.api.list_pods(namespace, "jobset.sigs.k8s.io/jobset-name"):
        job = pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]
        if pod["metadata"].get("deletionTimestamp"):
            continue
        if pod["spec"].get("nodeName") and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            held[job] = held.get(job, 0) + 1
    return held


def _finished(k8s: TrainJobCluster, namespace: str, name: str) -> str | None:
    for cond in (k8s.job(name, namespace).get("status") or {}).get("conditions") or []:
        if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
            return cond["type"]
    return None


def _watch(k8s: TrainJobCluster, namespace: str, names: list[str], timeout: float,
           while_waiting: Any = None) -> list[tuple[float, dict[str, int]]]:
    """Samples of :func:`_holding` until every job in ``names`` finished; asserts they all Complete."""
    start = time.monotonic()
    samples: list[tuple[float, dict[str, int]]] = []
    while not all(_finished(k8s, namespace, n) for n in names):
        assert time.monotonic() - start < timeout, f"not finished after {timeout:g} s: {samples[-5:]}\n" + \
            "\n".join(k8s.diagnostics(n, namespace) for n in names)
        samples.append((time.monotonic() - start, _holding(k8s, namespace)))
        if while_waiting is not None:
            while_waiting(samples)
        time.sleep(SAMPLE_EVERY)
    assert {n: _finished(k8s, namespace, n) for n in names} == dict.fromkeys(names, "Complete")
    return samples


def _start_order(samples: list[tuple[float, dict[str, int]]]) -> list[str]:
    order: list[str] = []
    for _, held in samples:
        order += [job for job in sorted(held) if job not in order]
    return order


def _workload(k8s: TrainJobCluster, namespace: str, job: str) -> dict[str, Any]:
    out = k8s.kubectl("get", "workloads.kueue.x-k8s.io", "-n", namespace, "-o", "json").stdout
    for item in json.loads(out)["items"]:
        if any(ref["kind"] == "TrainJob" and ref["name"] == job for ref in item["metadata"].get("ownerReferences") or []):
            return item
    raise AssertionError(f"no Workload for TrainJob {job}: {out[:2000]}")


def test_three_jobs_run_one_at_a_time_in_priority_order(kueue: TrainJobCluster, namespace: str,
                                                         tmp_path: Path) -> None:
    k8s = kueue
    _queues(k8s, namespace, preemption=False)
    k8s.kubectl("patch", "clusterqueue", f"cq-{namespace}", "--type=merge", "-p", '{"spec":{"stopPolicy":"Hold"}}')
    jobs = {"a-low": "low", "b-high": "high", "c-mid": "mid"}
    for name, priority in jobs.items():
        k8s.kubectl("apply", "-f", "-", input=_job_yaml(name, namespace, priority, 6, 0.5, tmp_path))
    for name in jobs:  # Kueue's webhook suspended each one at create; the operator made no pod
        assert k8s.job(name, namespace)["spec"]["suspend"] is True
    time.sleep(2)
    assert _holding(k8s, namespace) == {}
    assert all(p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") not in jobs
               for p in k8s.api.list_pods(namespace, "jobset.sigs.k8s.io/jobset-name"))

    k8s.kubectl("patch", "clusterqueue", f"cq-{namespace}", "--type=merge", "-p", '{"spec":{"stopPolicy":"None"}}')
    seen: dict[str, str] = {}

    def queued_as_trainjob_says(samples: list[tuple[float, dict[str, int]]]) -> None:
        # While one runs and two wait, `trainjob get` names the place of the last one.
        if "a-low" in seen or set(samples[-1][1]) != {"b-high"}:
            return
        out = k8s.trainjob("get", "a-low", "--backend", "kubernetes", "--kubeconfig", str(k8s.kubeconfig),
                           "-n", namespace, check=False).stdout
        if "position 2" in out:
            seen["a-low"] = out

    samples = _watch(k8s, namespace, list(jobs), timeout=240, while_waiting=queued_as_trainjob_says)
    overlapping = [(t, held) for t, held in samples if len(held) > 1]
    assert not overlapping, f"two jobs held the node at once: {overlapping[:5]}"
    assert _start_order(samples) == ["b-high", "c-mid", "a-low"], samples
    assert "a-low" in seen, "trainjob get never showed a-low queued second"
    assert f"position 2 in LocalQueue {QUEUE}, waiting for cpu" in seen["a-low"], seen["a-low"]

    pod = next(p for p in k8s.pods("a-low", namespace))
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": NODE_NAME}, pod["spec"]
    assert TOLERATION in pod["spec"]["tolerations"], pod["spec"]["tolerations"]
    workload = _workload(k8s, namespace, "a-low")
    assert workload["spec"]["priority"] == PRIORITIES["low"]
    assert any(c["type"] == "Finished" and c["status"] == "True" for c in workload["status"]["conditions"])


def test_a_higher_priority_job_preempts_and_the_lower_one_resumes_from_its_checkpoint(
    kueue: TrainJobCluster, namespace: str, tmp_path: Path
) -> None:
    """torchrun on the built-in runtime, preempted ``TRAINJOB_PREEMPT_ROUNDS`` times (default 1) by a job of higher
    priority: back in the queue each time (never Failed, though torchrun exits 1 on the preemption's SIGTERM),
    resumed from its checkpoint once the other finished, Complete in the end; the two never hold the node at once."""
    k8s = kueue
    rounds = int(os.environ.get("TRAINJOB_PREEMPT_ROUNDS", "1"))
    _queues(k8s, namespace, preemption=True)
    k8s.kubectl("apply", "-f", "-", input=_job_yaml("long", namespace, "low", 24 * rounds, 0.5, tmp_path))
    checkpoint = tmp_path / "long" / "step"
    samples: list[tuple[float, dict[str, int]]] = []
    started = time.monotonic()

    def step() -> int:
        return int(checkpoint.read_text() or 0) if checkpoint.exists() else 0

    def sampling(predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"{what} after {timeout:g} s\n" + k8s.diagnostics("long", namespace)
            failed = _finished(k8s, namespace, "long") == "Failed"
            assert not failed, "the preempted job failed\n" + k8s.diagnostics("long", namespace)
            samples.append((time.monotonic() - started, _holding(k8s, namespace)))
            time.sleep(SAMPLE_EVERY)

    seen: list[dict[str, Any]] = []
    for round_ in range(1, rounds + 1):
        reached = seen[-1]["suspended_at"] if seen else 0
        sampling(lambda since=reached: step() >= since + 3 and "long" in _holding(k8s, namespace), 180,  # type: ignore[misc]
                 f"round {round_}: long training 3 steps past {reached}")
        urgent = f"urgent-{round_}"
        k8s.kubectl("apply", "-f", "-", input=_job_yaml(urgent, namespace, "high", 4, 0.5, tmp_path))
        sampling(lambda: k8s.job("long", namespace)["spec"].get("suspend"), 120, f"round {round_}: long suspended")
        seen.append({"round": round_, "suspended_at": step()})
        sampling(lambda name=urgent: _finished(k8s, namespace, name) == "Complete", 180,  # type: ignore[misc]
                 f"round {round_}: {urgent} complete")
    _watch(k8s, namespace, ["long"], timeout=240)
    print("preemption rounds:", json.dumps(seen))
    assert not [(t, held) for t, held in samples if len(held) > 1], "both jobs held the node at once"

    workload = _workload(k8s, namespace, "long")
    assert any(c["type"] == "Preempted" for c in workload["status"].get("conditions") or []), workload["status"]
    log = k8s.kubectl("logs", "-n", namespace, "-l", "jobset.sigs.k8s.io/jobset-name=long,"
                      "batch.kubernetes.io/job-completion-index=0", "--tail=-1").stdout
    resumed_at = [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if line.startswith("node 0 starts at step")]
    assert resumed_at and resumed_at[-1] >= seen[-1]["suspended_at"] > 0, (log, seen)
    events = k8s.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=long",
                         "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert {"Preempted", "Started"} <= reasons or "Stopped" in reasons, reasons
    assert "Failed" not in reasons, reasons


def test_the_kubeflow_sdk_queues_three_jobs_by_label(kueue: TrainJobCluster, namespace: str) -> None:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainer, TrainerClient
    from kubeflow.trainer.options import Labels

    k8s = kueue
    _queues(k8s, namespace, preemption=False)
    client = TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace, config_file=str(k8s.kubeconfig)))
    names = [
        client.train(trainer=CustomTrainer(func=_sdk_step, num_nodes=NODES, resources_per_node={"cpu": 1}),
                     options=[Labels({"kueue.x-k8s.io/queue-name": QUEUE})])
        for _ in range(3)
    ]
    for name in names:
        # Created suspended by Kueue's webhook; Kueue may have admitted (unsuspended) the first one already, which
        # is a change of spec after creation: a later generation.
        job = k8s.job(name, namespace)
        assert job["spec"]["suspend"] is True or job["metadata"]["generation"] > 1, job
    samples = _watch(k8s, namespace, names, timeout=300)
    assert not [(t, held) for t, held in samples if len(held) > 1], "two jobs held the node at once"
    for name in names:
        assert client.get_job(name).status == "Complete"


def _sdk_step() -> None:
    import time

    time.sleep(3)
    print("step done", flush=True)
