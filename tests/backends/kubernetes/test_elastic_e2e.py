"""Elastic shrink and grow through the operator, on the real control plane.

A 3-node elastic job (``minNodes: 2``, ``maxNodes: 3``) loses a node's pod: torchrun's agents on the two nodes left
meet again without it and the job goes on at 2 nodes from its last checkpoint; the Job controller recreates the lost
pod (here it takes 40 s to come back, as a rebooting node would), it rejoins the rendezvous, and the job grows back
to 3. The operator turns each resize that rank 0 logged into a ``Resized`` event and records the last one.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster, wait_for

from trainjob.backends.kubernetes.progress import RESIZE_ANNOTATION

WORKER = Path(__file__).resolve().parents[1] / "local" / "elastic_worker.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
STEPS, EVERY, BATCH = 160, 10, 40


def resize_events(k8s: TrainJobCluster, namespace: str, name: str) -> list[str]:
    return [e["message"] for e in k8s.api.list_events(namespace, name) if e["reason"] == "Resized"]


def rounds(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def waiting(k8s: TrainJobCluster, namespace: str, workdir: Path, predicate: Any, timeout: float, what: str) -> Any:
    try:
        return wait_for(predicate, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrounds: {rounds(workdir)}\n{k8s.diagnostics('grow', namespace)}") from None


def test_an_elastic_job_shrinks_when_a_node_is_lost_and_grows_back(
    k8s: TrainJobCluster, namespace: str, workdir: Path
) -> None:
    def elastic(spec: dict[str, Any]) -> None:
        spec["mlPolicy"].pop("numNodes", None)
        spec["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 2, "maxNodes": 3, "maxRestarts": 5}
        for rj in spec["template"]["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["backoffLimit"] = 2  # the lost pod is recreated; its Job does not fail

    k8s.namespaced_runtime(namespace, "elastic", elastic)
    comeback = workdir / "node-2-lost"
    # A recreated node-2 pod (the marker exists by then) waits 40 s before it rejoins, as a node that takes a while to
    # come back: torchrun's agents notice a dead peer only after its rendezvous keep-alives lapse (15 s by default).
    script = (f"if [ -e {comeback} ] && [ \"$JOB_COMPLETION_INDEX\" = 2 ]; then sleep 40; fi; "
              f"exec {shlex.quote(TORCHRUN)} {shlex.quote(str(WORKER))} {STEPS} {EVERY} {BATCH} linear")
    k8s.create_job(
        "grow", namespace, runtime="elastic", runtime_kind="TrainingRuntime",
        trainer={
            "command": ["sh", "-c", script],
            "env": [{"name": "ELASTIC_OUT", "value": str(workdir)},
                    {"name": "ELASTIC_STEP_SECONDS", "value": "0.25"}],
            "resourcesPerNode": {"requests": {"cpu": "1"}},
        },
    )
    def wait(predicate: Any, timeout: float, what: str) -> Any:
        return waiting(k8s, namespace, workdir, predicate, timeout, what)

    first = wait(lambda: [r for r in rounds(workdir) if r["world_size"] == 3 and r["step"] == 0], 180,
                     "the 3 nodes to start training")
    assert len(first) == 3, first
    wait(lambda: (workdir / "ckpt").exists() and any((workdir / "ckpt").iterdir()), 120, "a first checkpoint")

    victim = next(p for p in k8s.pods("grow", namespace)
                  if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "2")
    comeback.touch()
    lost_at = time.time()
    k8s.api.core.delete_namespaced_pod(victim["metadata"]["name"], namespace, grace_period_seconds=0)

    shrunk = wait(lambda: [r for r in rounds(workdir) if r["world_size"] == 2 and r["time"] > lost_at], 120,
                      "the job to go on at 2 nodes")
    assert shrunk[0]["step"] > 0, "it resumed from a checkpoint, not from the start"
    assert shrunk[0]["base_lr"] == pytest.approx(0.2 * 2 / 3), "linear scaling: lr x new/old world size"
    grown = wait(lambda: [r for r in rounds(workdir) if r["world_size"] == 3 and r["time"] > shrunk[0]["time"]],
                 180, "the job to grow back to 3 nodes")
    assert grown[0]["step"] > shrunk[0]["step"], "it trained at 2 nodes and resumed from a checkpoint taken there"
    assert grown[0]["base_lr"] == pytest.approx(0.2), "scaled back up with the world size"

    k8s.wait_for_condition("grow", "Complete", namespace=namespace, timeout=300)
    final = json.loads((workdir / "final.json").read_text())
    assert final["step"] == STEPS and final["loss"] < 0.05, final  # the data's noise floor is 0.01
    messages = wait(lambda: (lambda m: m if len(m) >= 2 else None)(resize_events(k8s, namespace, "grow")), 60,
                        "both Resized events")
    assert messages[0].startswith("Resized 3 -> 2 nodes"), messages
    assert any(m.startswith("Resized 2 -> 3 nodes") for m in messages[1:]), messages
    assert RESIZE_ANNOTATION in k8s.job("grow", namespace)["metadata"]["annotations"]
