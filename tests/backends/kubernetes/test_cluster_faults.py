"""The cluster's own faults, with a job training: the API server or etcd killed (SIGKILL) and started again on the
same data, and the JobSet controller down while jobs are created. Each time the job completes, with one JobSet (the
same one) and one ``JobSetCreated`` event, and nothing has to be done to the operator or the job. A node lost with
jobs on it: a static job's pods are replaced on the node left and resume from the checkpoint; an elastic job spread
over both nodes goes on at the node left, then grows back.

Each test prints how long from the fault to recovered, for the record.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster
from kubetest.controlplane import NODE_NAME, SECOND_NODE

from trainjob.backends.kubernetes.progress import RESIZE_ANNOTATION

STEPS = 24
STEP_SECONDS = 0.5
SCRIPT = f"""
import os, time
for step in range({STEPS}):
    print(f"node {{os.environ['PET_NODE_RANK']}} step {{step}}", flush=True)
    time.sleep({STEP_SECONDS})
print("done", flush=True)
"""


def _trainer() -> dict[str, Any]:
    return {"numNodes": 2, "command": ["python", "-c", SCRIPT], "resourcesPerNode": {"requests": {"cpu": "1"}}}


def _running(k8s: TrainJobCluster, namespace: str, name: str) -> bool:
    pods = k8s.pods(name, namespace)
    return len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)


def _until(predicate: Any, timeout: float, what: str, diagnostics: Any = None) -> float:
    """Seconds until ``predicate()`` holds (asked through the API server, which may refuse for a while)."""
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start
        except Exception:  # the API server down or not ready yet: ask again
            pass
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not after {timeout:g} s\n{diagnostics() if diagnostics else ''}")
        time.sleep(0.2)


def _complete(k8s: TrainJobCluster, namespace: str, name: str) -> bool:
    conditions = (k8s.job(name, namespace).get("status") or {}).get("conditions") or []
    failed = [c for c in conditions if c["type"] == "Failed" and c["status"] == "True"]
    assert not failed, failed
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def _created_events(k8s: TrainJobCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    out = k8s.kubectl("get", "events", "-n", namespace, "--field-selector",
                      f"involvedObject.name={name},reason=JobSetCreated", "-o", "json").stdout
    return json.loads(out)["items"]


def _training_job(k8s: TrainJobCluster, namespace: str, name: str) -> str:
    """Create the job, wait until both nodes run; the JobSet's uid."""
    k8s.create_job(name, namespace, trainer=_trainer())
    _until(lambda: _running(k8s, namespace, name), 120, f"{name} running", lambda: k8s.diagnostics(name, namespace))
    jobset = k8s.jobset(name, namespace)
    assert jobset is not None
    return jobset["metadata"]["uid"]


def _check_one_jobset_and_event(k8s: TrainJobCluster, namespace: str, name: str, uid: str) -> None:
    jobset = k8s.jobset(name, namespace)
    assert jobset is not None and jobset["metadata"]["uid"] == uid, "the JobSet was made again"
    events = _created_events(k8s, namespace, name)
    assert len(events) == 1 and events[0].get("count", 1) == 1, events
    assert k8s.operator.alive(), k8s.operator.tail()


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_a_job_completes_across_a_restart_of(component: str, k8s: TrainJobCluster, namespace: str) -> None:
    name = f"across-{component.split('-')[-1]}"
    uid = _training_job(k8s, namespace, name)
    cp = k8s.cp
    killed = time.monotonic()
    cp.kill(component)
    time.sleep(3)  # down for a while, as a crash-looping pod would be
    cp.start_again(component)
    cp.wait_ready()
    serving = time.monotonic() - killed
    done = _until(lambda: _complete(k8s, namespace, name), 180, f"{name} Complete after the {component} restart",
                  lambda: k8s.diagnostics(name, namespace))
    print(f"{component} killed: serving again after {serving:.1f} s, job Complete {serving + done:.1f} s after the "
          f"kill (the job had {STEPS * STEP_SECONDS:g} s to train)")
    _check_one_jobset_and_event(k8s, namespace, name, uid)
    logs = k8s.kubectl("logs", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}", "--tail=-1").stdout
    assert logs.count("done") == 2, logs[-2000:]


def test_jobs_created_while_the_jobset_controller_is_down_start_when_it_returns(
    k8s: TrainJobCluster, namespace: str
) -> None:
    cp = k8s.cp
    cp.kill("jobset")
    try:
        k8s.create_job("while-down", namespace, trainer=_trainer())
        time.sleep(15)  # JobSet's webhooks refuse every JobSet meanwhile: the operator keeps trying
        job = k8s.job("while-down", namespace)
        assert not [c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == "Failed"], job
        assert k8s.jobset("while-down", namespace) is None
    finally:
        back = time.monotonic()
        cp.start_again("jobset")
    running = _until(lambda: _running(k8s, namespace, "while-down"), 180, "while-down running after JobSet returned",
                     lambda: k8s.diagnostics("while-down", namespace))
    _until(lambda: _complete(k8s, namespace, "while-down"), 180, "while-down Complete",
           lambda: k8s.diagnostics("while-down", namespace))
    print(f"JobSet controller back: the job's pods running {running:.1f} s later")
    assert len(_created_events(k8s, namespace, "while-down")) == 1
    assert time.monotonic() - back < 360


#: A script that runs as PID 1 of its container, where SIGTERM has no default action: it exits on it, as torchrun
#: does, so its pods go at once when deleted or evicted rather than after the 30 s grace period.
EXITS_ON_SIGTERM = """
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
"""

#: Reports progress through the status endpoint for a few steps, then stops making progress (a stuck data loader).
STALLS = EXITS_ON_SIGTERM + """
import time
from trainjob.torch import report
for step in range(6):
    report({"loss": 1.0 / (step + 1)}, step=step, total_steps=100)
    time.sleep(1.0)
time.sleep(600)
"""


def test_a_job_that_stops_reporting_progress_is_failed_as_stalled(k8s: TrainJobCluster, namespace: str) -> None:
    """The stall watch on Kubernetes works from the progress the status endpoint receives (no log is read): past
    ``trainjob/stall-timeout`` without a report the job fails with reason ``Stalled`` and its pods are stopped."""
    k8s.create_job("stuck", namespace, annotations={"trainjob/stall-timeout": "10s", "trainjob/stall-action": "fail"},
                   trainer={"numNodes": 1, "command": ["python", "-c", STALLS],
                            "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    _until(lambda: (k8s.job("stuck", namespace).get("status") or {}).get("trainerStatus"), 120,
           "a progress report", lambda: k8s.diagnostics("stuck", namespace))

    def stalled() -> dict[str, Any] | None:
        conditions = (k8s.job("stuck", namespace).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Failed" and c["status"] == "True"), None)

    took = _until(stalled, 120, "Failed as Stalled", lambda: k8s.diagnostics("stuck", namespace))
    failed = stalled()
    assert failed is not None and failed["reason"] == "Stalled", failed
    assert "no progress for" in failed["message"] and "limit 10.0 s" in failed["message"], failed
    print(f"stalled job failed {took:.1f} s after its first progress report showed (it reports for ~6 s)")
    _until(lambda: k8s.jobset("stuck", namespace) is None and not k8s.pods("stuck", namespace), 60,
           "the stuck job's JobSet and pods gone")
    events = k8s.kubectl("get", "events", "-n", namespace, "--field-selector",
                         "involvedObject.name=stuck,reason=Stalled", "-o", "json").stdout
    assert len(json.loads(events)["items"]) == 1




#: Two ranks training; rank 1's data loader blocks at step 8 (a stuck mount), so rank 0 waits in all_reduce.
STUCK_RANK = """
import time
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
import trainjob.torch as tt

class Batches(Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, index):
        if index == 8 and dist.get_rank() == 1:
            time.sleep(600)
        return torch.ones(4)

dist.init_process_group("gloo")
for step, batch in enumerate(DataLoader(Batches(), batch_size=1), start=1):
    dist.all_reduce(batch)
    tt.report({"loss": 1.0 / step}, step=step, total_steps=1000)
    time.sleep(0.2)
"""


def test_a_stalled_jobs_stuck_rank_is_named_from_the_stacks_it_wrote(
    k8s: TrainJobCluster, namespace: str, workdir: Any
) -> None:
    """``trainjob stacks NAME`` asks a running job's ranks for their stacks (an annotation on its pods, which the
    kubelet writes into a file of their status-client volume) and names the rank the others wait for. Then the
    job's own stacks thread: each rank watches its own reports (the operator sets ``TRAINJOB_STALL_DUMP``); silent for
    half the limit, it writes its stacks to its log; the operator, finding the job stalled, reads them and names the
    rank that is not in the collective the others wait in, with its frame."""
    script = workdir / "stuck_rank.py"
    script.write_text(STUCK_RANK)
    k8s.create_job("named", namespace,
                   annotations={"trainjob/stall-timeout": "30s", "trainjob/stall-action": "fail"},
                   trainer={"numNodes": 2, "command": ["torchrun", str(script)],
                            "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    _until(lambda: _running(k8s, namespace, "named"), 120, "named running", lambda: k8s.diagnostics("named", namespace))
    flags = ["--backend", "kubernetes", "--kubeconfig", str(k8s.kubeconfig), "-n", namespace]
    stuck = "rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (stuck_rank.py:12)"
    answers: list[str] = []

    def named_on_demand() -> bool:  # each call asks again; the first ones may come before rank 1 is stuck
        began = time.monotonic()
        done = k8s.trainjob("stacks", "named", *flags, env={"TRAINJOB_BACKEND": "", "KUBECONFIG": ""}, check=False)
        answers.append(f"at {began - asked:.1f} s, took {time.monotonic() - began:.1f} s: exit {done.returncode}\n"
                       f"{done.stdout}{done.stderr}")
        return done.returncode == 0 and stuck in done.stdout

    asked = time.monotonic()
    _until(named_on_demand, 40, "`trainjob stacks named` naming rank 1", lambda: "\n".join(answers))
    print(f"`trainjob stacks` named the stuck rank in {len(answers)} call(s), {time.monotonic() - asked:.1f} s; "
          f"each call: {'; '.join(a.split(': exit')[0] for a in answers)}")
    assert "--- rank 0 (node-0) ---" in answers[-1] and "--- rank 1 (node-1) ---" in answers[-1], answers[-1]

    failed = k8s.wait_for_condition("named", "Failed", namespace=namespace, timeout=240)
    condition = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "Stalled", condition
    assert stuck in condition["message"], condition["message"]

#: The seeds' kind of script, with no trainjob call: gloo, an all_reduce every 0.1 s; rank 1 blocks at step 10.
PLAIN_STALL = """
import time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
for step in range(1, 1001):
    if step == 10 and dist.get_rank() == 1:
        print(f"rank 1 stalls at {time.time():.3f}", flush=True)
        time.sleep(600)  # blocked, as a data loader reading from a stuck mount would be
    dist.all_reduce(torch.ones(4))
    time.sleep(0.1)
"""


def test_a_script_that_never_reports_is_held_to_its_collectives_and_its_stuck_rank_named(
    k8s: TrainJobCluster, namespace: str, workdir: Any
) -> None:
    """A plain torchrun script in the training image (which has trainjob): its ranks report their collectives to
    the operator (``trainjob.pod_site``, read at start-up) and write their stacks when collectives stop; rank 1
    sleeping outside the all_reduce rank 0 waits in is a stall once the wait passes the limit, and the job's
    message names rank 1 and its frame."""
    script = workdir / "plain_stall.py"
    script.write_text(PLAIN_STALL)
    k8s.create_job("plain", namespace,
                   annotations={"trainjob/stall-timeout": "10s", "trainjob/stall-action": "fail"},
                   trainer={"numNodes": 2, "command": ["torchrun", str(script)],
                            "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    _until(lambda: _running(k8s, namespace, "plain"), 120, "plain running", lambda: k8s.diagnostics("plain", namespace))

    def stalled_at() -> float | None:
        logs = k8s.kubectl("logs", "-n", namespace, "-l", "jobset.sigs.k8s.io/jobset-name=plain", "--tail=-1",
                           "--prefix", check=False).stdout
        found = re.search(r"rank 1 stalls at ([0-9.]+)", logs)
        return float(found[1]) if found else None

    _until(stalled_at, 120, "rank 1 stalled", lambda: k8s.diagnostics("plain", namespace))
    stalled = stalled_at()
    failed = k8s.wait_for_condition("plain", "Failed", namespace=namespace, timeout=180)
    took = time.time() - (stalled or 0.0)
    condition = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "Stalled", condition
    assert ("while rank 0 waits in one (limit 10.0 s: trainjob/stall-timeout): rank 1 is not in the all_reduce that "
            "rank 0 waits in: rank 1 is in <module> (plain_stall.py:9)") in condition["message"], condition["message"]
    print(f"plain script: failed as Stalled {took:.1f} s after rank 1 stalled (limit 10 s)")


#: Reports 6 steps of progress; its first run hangs after the third (a stuck data loader), a run after that finishes.
STALLS_ONCE = EXITS_ON_SIGTERM + """
import sys, time
from pathlib import Path
from trainjob.torch import report
marker = Path(sys.argv[1])
first = not marker.exists()
marker.touch()
for step in range(6):
    report({"loss": 1.0 / (step + 1)}, step=step + 1, total_steps=6)
    time.sleep(1.0)
    if first and step == 2:
        time.sleep(600)
print("finished", flush=True)
"""


def test_a_stalled_job_restarts_its_node_group_and_completes(k8s: TrainJobCluster, namespace: str, workdir: Any) -> None:
    """``trainjob/stall-action: restart`` on Kubernetes: the operator evicts the stuck job's pods, the Job controller
    replaces them (the runtime ignores an eviction), and the restart is counted against ``failurePolicy.maxRestarts``
    in ``trainjob/stall-restarts``; the job completes."""
    k8s.create_job("restarts", namespace,
                   annotations={"trainjob/stall-timeout": "10s", "trainjob/stall-action": "restart"},
                   trainer={"numNodes": 1, "command": ["python", "-c", STALLS_ONCE, str(workdir / "ran")],
                            "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    started = time.monotonic()
    done = k8s.wait_for_condition("restarts", "Complete", namespace=namespace, timeout=240)
    print(f"stalled job restarted and Complete {time.monotonic() - started:.1f} s after it was created "
          "(it reports for ~3 s, then nothing for the 10 s limit)")
    events = json.loads(k8s.kubectl("get", "events", "-n", namespace, "--field-selector",
                                    "involvedObject.name=restarts,reason=Stalled", "-o", "json").stdout)["items"]
    assert len(events) == 1 and "restarting its node group (restart 1 of 3)" in events[0]["message"], events
    assert done["metadata"]["annotations"]["trainjob/stall-restarts"] == "1"
    logs = k8s.kubectl("logs", "-n", namespace, "-l", "jobset.sigs.k8s.io/jobset-name=restarts", "--tail=-1").stdout
    assert "finished" in logs, logs[-2000:]
    jobs = k8s.batch_jobs("restarts", namespace)
    assert [j["status"].get("failed", 0) for j in jobs] == [0], "an eviction is not a failure of the Job"

#: Two nodes training 40 steps of 0.5 s; each node's step is its checkpoint, in a directory both nodes share (as a
#: claim on network storage would be), and a node starts from it.
RESUMES = """
import json, os, sys, time
from pathlib import Path
state = Path(sys.argv[1]) / f"node-{os.environ['PET_NODE_RANK']}.json"
start = json.loads(state.read_text())["step"] if state.exists() else 0
print(f"node {os.environ['PET_NODE_RANK']} resumes at step {start}", flush=True)
for step in range(start, 40):
    time.sleep(0.5)
    state.write_text(json.dumps({"step": step + 1}))
print("done", flush=True)
"""
#: The node a test loses: the cluster's second one, brought back afterwards.
LOST = SECOND_NODE
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


#: Keeps the elastic job's pods from being scheduled until the test places them, one at a time.
PLACEMENT_GATE = "trainjob.dev/placed-by-test"
ELASTIC_WORKER = Path(__file__).resolve().parents[1] / "local" / "elastic_worker.py"
ELASTIC_STEPS = 160


def _index(pod: dict[str, Any]) -> str:
    return pod["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index", "")


def _place(k8s: TrainJobCluster, namespace: str, job: str, index: str, node: str, skip: set[str] = frozenset()) -> str:
    """Let node ``index``'s pod of ``job`` (one not in ``skip``, by uid) be scheduled and wait until it is bound to
    ``node`` (the only schedulable one then); its uid."""
    def gated() -> dict[str, Any] | None:
        return next((p for p in k8s.pods(job, namespace) if _index(p) == index and p["metadata"]["uid"] not in skip
                     and not p["metadata"].get("deletionTimestamp")), None)

    _until(gated, 60, f"{job} node {index}'s pod")
    pod = gated()
    k8s.api.core.patch_namespaced_pod(pod["metadata"]["name"], namespace,
                                      [{"op": "remove", "path": "/spec/schedulingGates"}])
    uid: str = pod["metadata"]["uid"]
    _until(lambda: any(p["metadata"]["uid"] == uid and p["spec"].get("nodeName") == node
                       for p in k8s.pods(job, namespace)), 60, f"{job} node {index} on {node}",
           lambda: k8s.diagnostics(job, namespace))
    return uid


def _rounds(out: Path) -> list[dict[str, Any]]:
    path = out / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_lost_node_static_pods_move_and_an_elastic_job_shrinks_to_the_node_left(
    k8s: TrainJobCluster, namespace: str, workdir: Any
) -> None:
    """The second node is lost (its kubelet, containerd and every container SIGKILLed: the machine is gone) with two jobs
    on it. The Node goes NotReady once its heartbeats lapse; its pods cannot finish terminating without a kubelet, so,
    as Kubernetes documents for a node that was shut down, the node is tainted ``out-of-service``: its pods are
    evicted and deleted.

    - A static job whose two pods both ran there: the built-in runtime's podFailurePolicy ignores a pod marked
      ``DisruptionTarget``, so the Job controller replaces both without spending one of the JobSet's
      ``maxRestarts``; the new pods run on the node left, from the checkpoint, in the same JobSet.
    - An elastic job (1 to 2 nodes) spread over both nodes, its rendezvous on the node left: it goes on at 1 node
      from its checkpoint once the lost node's rendezvous keep-alives lapse, well before the node is even NotReady,
      its learning rate scaled with the world size; its replaced pod (placed on the node left) joins again and it
      grows back to 2. The operator turns each resize into a ``Resized`` event."""
    cp, core = k8s.cp, k8s.api.core
    elastic_out = workdir / "elastic"
    elastic_out.mkdir()

    def gated_elastic(spec: dict[str, Any]) -> None:
        spec["mlPolicy"].pop("numNodes", None)
        spec["mlPolicy"]["torch"]["elasticPolicy"] = {"minNodes": 1, "maxNodes": 2, "maxRestarts": 5}
        for rj in spec["template"]["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["backoffLimit"] = 2
            rj["template"]["spec"]["template"]["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}]

    k8s.namespaced_runtime(namespace, "elastic-placed", gated_elastic)
    try:
        core.patch_node(LOST, {"spec": {"unschedulable": True}})
        k8s.create_job("shrink", namespace, runtime="elastic-placed", runtime_kind="TrainingRuntime", trainer={
            "command": ["torchrun", str(ELASTIC_WORKER), str(ELASTIC_STEPS), "10", "40", "linear"],
            "env": [{"name": "ELASTIC_OUT", "value": str(elastic_out)}, {"name": "ELASTIC_STEP_SECONDS", "value": "0.25"}],
            "resourcesPerNode": {"requests": {"cpu": "400m"}},  # four fit on one 2-CPU node, as after the loss
        })
        _place(k8s, namespace, "shrink", "0", NODE_NAME)  # the rendezvous' host stays
        core.patch_node(NODE_NAME, {"spec": {"unschedulable": True}})
        core.patch_node(LOST, {"spec": {"unschedulable": False}})
        try:
            lost_pod = _place(k8s, namespace, "shrink", "1", LOST)
            _until(lambda: any(r["world_size"] == 2 for r in _rounds(elastic_out)), 120,
                   "the elastic job training across both nodes", lambda: k8s.diagnostics("shrink", namespace))
            _until(lambda: (elastic_out / "ckpt").exists() and any((elastic_out / "ckpt").iterdir()), 60,
                   "the elastic job's first checkpoint")
            k8s.create_job("lost", namespace,
                           trainer={"numNodes": 2, "command": ["python", "-c", RESUMES, str(workdir)],
                                    "resourcesPerNode": {"requests": {"cpu": "400m"}}})
            _until(lambda: _running(k8s, namespace, "lost"), 120, "lost running",
                   lambda: k8s.diagnostics("lost", namespace))
        finally:
            core.patch_node(NODE_NAME, {"spec": {"unschedulable": False}})
        assert {p["spec"]["nodeName"] for p in k8s.pods("lost", namespace)} == {LOST}
        uid = k8s.jobset("lost", namespace)["metadata"]["uid"]

        def step(node: int) -> int:
            path = workdir / f"node-{node}.json"
            return int(json.loads(path.read_text())["step"]) if path.exists() else 0

        _until(lambda: min(step(0), step(1)) >= 4, 60, "4 steps trained")
        lost_at, lost_wall = time.monotonic(), time.time()
        cp.lose_node(LOST)

        def ready(name: str) -> str:
            conditions = core.read_node(name).status.conditions or []
            return next((c.status for c in conditions if c.type == "Ready"), "Unknown")

        seen: dict[str, float] = {}

        def shrunk_and_not_ready() -> bool:  # when each was first seen
            if "shrunk" not in seen and any(r["world_size"] == 1 and r["time"] > lost_wall for r in _rounds(elastic_out)):
                seen["shrunk"] = time.monotonic() - lost_at
            if "not_ready" not in seen and ready(LOST) != "True":
                seen["not_ready"] = time.monotonic() - lost_at
            return len(seen) == 2

        _until(shrunk_and_not_ready, 120, f"the elastic job going on at 1 node and {LOST} NotReady",
               lambda: f"{seen}\n{k8s.diagnostics('shrink', namespace)}")
        first_shrunk = next(r for r in _rounds(elastic_out) if r["world_size"] == 1)
        assert first_shrunk["step"] > 0, "it resumed from a checkpoint, not from the start"
        not_ready = seen["not_ready"]
        node = core.read_node(LOST)
        core.patch_node(LOST, {"spec": {"taints": [*(t.to_dict() for t in node.spec.taints or []), OUT_OF_SERVICE]}})
        stopped_at = min(step(0), step(1))

        def running_on_the_node_left() -> bool:
            pods = k8s.pods("lost", namespace)
            return _running(k8s, namespace, "lost") and {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}

        tainted = time.monotonic() - lost_at
        _until(running_on_the_node_left, 180, "the group running again on the node left",
               lambda: k8s.diagnostics("lost", namespace))
        moved = time.monotonic() - lost_at
        _place(k8s, namespace, "shrink", "1", NODE_NAME, skip={lost_pod})  # the replaced pod, on the node left
        _until(lambda: [r for r in _rounds(elastic_out) if r["world_size"] == 2 and r["time"] > first_shrunk["time"]],
               180, "the elastic job grown back to 2 nodes", lambda: k8s.diagnostics("shrink", namespace))
        grown = next(r for r in _rounds(elastic_out) if r["world_size"] == 2 and r["time"] > first_shrunk["time"])
        assert first_shrunk["base_lr"] == pytest.approx(0.2 / 2), "linear scaling: lr x new/old world size"
        assert grown["step"] > first_shrunk["step"], "it trained at 1 node and resumed from a checkpoint taken there"
        assert grown["base_lr"] == pytest.approx(0.2), "scaled back up with the world size"
        _until(lambda: _complete(k8s, namespace, "lost"), 180, "lost Complete",
               lambda: k8s.diagnostics("lost", namespace))
        static_done = time.monotonic() - lost_at
        _until(lambda: _complete(k8s, namespace, "shrink"), 240, "shrink Complete",
               lambda: k8s.diagnostics("shrink", namespace))
        print(f"node lost: the elastic job went on at 1 node {first_shrunk['time'] - lost_wall:.1f} s after the kill; "
              f"NotReady {not_ready:.1f} s after it; the static job's pods running again on the node left "
              f"{moved:.1f} s after it (tainted out-of-service {tainted:.1f} s after it), Complete after "
              f"{static_done:.1f} s; the elastic job Complete after {time.monotonic() - lost_at:.1f} s")

        jobset = k8s.jobset("lost", namespace)
        assert jobset is not None and jobset["metadata"]["uid"] == uid, "the same JobSet"
        assert (jobset.get("status") or {}).get("restarts") == 0, "an eviction spends none of maxRestarts"
        jobs = k8s.batch_jobs("lost", namespace)
        assert [(j["status"].get("succeeded"), j["status"].get("failed", 0)) for j in jobs] == [(2, 0)], jobs
        assert len(_created_events(k8s, namespace, "lost")) == 1
        logs = k8s.kubectl("logs", "-n", namespace, "-l", "jobset.sigs.k8s.io/jobset-name=lost", "--tail=-1").stdout
        resumed = sorted(int(line.rsplit(" ", 1)[1]) for line in logs.splitlines() if "resumes at step" in line)
        assert len(resumed) == 2 and min(resumed) >= stopped_at > 0, (resumed, stopped_at, logs[-2000:])
        assert logs.count("done") == 2, logs[-2000:]

        final = json.loads((elastic_out / "final.json").read_text())
        assert final["step"] == ELASTIC_STEPS and final["loss"] < 0.05, final
        def resized() -> list[str] | None:  # the operator turns each resize rank 0 logged into an event
            messages = [e["message"] for e in k8s.api.list_events(namespace, "shrink") if e["reason"] == "Resized"]
            return messages if len(messages) >= 2 else None

        _until(resized, 60, "both Resized events")
        messages = resized() or []
        assert any(m.startswith("Resized 2 -> 1 nodes") for m in messages), messages
        assert any(m.startswith("Resized 1 -> 2 nodes") for m in messages), messages
        assert RESIZE_ANNOTATION in k8s.job("shrink", namespace)["metadata"]["annotations"]
        assert (k8s.jobset("shrink", namespace).get("status") or {}).get("restarts", 0) == 0, "torchrun's own restarts"
    finally:
        core.patch_node(NODE_NAME, {"spec": {"unschedulable": False}})
        cp.restore_node(LOST)
