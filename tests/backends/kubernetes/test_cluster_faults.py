"""The cluster's own faults, with a job training: the API server or etcd killed (SIGKILL) and started again on the
same data, and the JobSet controller down while jobs are created. Each time the job completes, with one JobSet (the
same one) and one ``JobSetCreated`` event, and nothing has to be done to the operator or the job. A node lost with
the job's pods on it: they are replaced on the node left and resume from the checkpoint.

Each test prints how long from the fault to recovered, for the record.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster
from kubetest.controlplane import NODE_NAME

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
    return {"numNodes": 2, "command": [sys.executable, "-c", SCRIPT], "resourcesPerNode": {"requests": {"cpu": "1"}}}


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


#: Reports progress through the status endpoint for a few steps, then stops making progress (a stuck data loader).
STALLS = """
import time
from trainjob.torch import report
for step in range(6):
    report({"loss": 1.0 / (step + 1)}, step=step, total_steps=100)
    time.sleep(1.0)
time.sleep(600)
"""


def test_a_job_that_stops_reporting_progress_is_failed_as_stalled(k8s: TrainJobCluster, namespace: str) -> None:
    """The watchdog on Kubernetes works from the progress the status endpoint receives (no log is read): past
    ``trainjob/stall-timeout`` without a report the job fails with reason ``Stalled`` and its pods are stopped."""
    k8s.create_job("stuck", namespace, annotations={"trainjob/stall-timeout": "10s", "trainjob/stall-action": "fail"},
                   trainer={"numNodes": 1, "command": [sys.executable, "-c", STALLS],
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
    """Each rank watches its own reports (the operator sets ``TRAINJOB_STALL_DUMP``): silent for half the limit, it
    writes its stacks to its log; the operator, finding the job stalled, reads them and names the rank that is not
    in the collective the others wait in, with its frame."""
    script = workdir / "stuck_rank.py"
    script.write_text(STUCK_RANK)
    k8s.create_job("named", namespace,
                   annotations={"trainjob/stall-timeout": "20s", "trainjob/stall-action": "fail"},
                   trainer={"numNodes": 2, "command": [str(Path(sys.executable).parent / "torchrun"), str(script)],
                            "resourcesPerNode": {"requests": {"cpu": "100m"}}})
    failed = k8s.wait_for_condition("named", "Failed", namespace=namespace, timeout=240)
    condition = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert condition["reason"] == "Stalled", condition
    assert "rank 1 is not in the all_reduce that rank 0 waits in: rank 1 is in __getitem__ (stuck_rank.py:12)" \
        in condition["message"], condition["message"]

#: Reports 6 steps of progress; its first run hangs after the third (a stuck data loader), a run after that finishes.
STALLS_ONCE = """
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
                   trainer={"numNodes": 1, "command": [sys.executable, "-c", STALLS_ONCE, str(workdir / "ran")],
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
LOST = "lost-node"
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def test_a_lost_nodes_pods_are_replaced_on_the_node_left_and_resume(
    k8s: TrainJobCluster, namespace: str, workdir: Any
) -> None:
    """A second node runs the job; its agent and every process of its pods are SIGKILLed (the machine is gone). The
    Node goes NotReady once its heartbeats lapse; its pods cannot finish terminating without a kubelet, so, as
    Kubernetes documents for a node that was shut down, the node is tainted ``out-of-service``: its pods are evicted
    and deleted. The built-in runtime's podFailurePolicy ignores a pod marked ``DisruptionTarget``, so the Job
    controller replaces both without spending one of the JobSet's ``maxRestarts``; the new pods run on the node left,
    from the checkpoint, in the same JobSet."""
    cp, core = k8s.cp, k8s.api.core
    cp.add_node(LOST)
    try:
        core.patch_node(NODE_NAME, {"spec": {"unschedulable": True}})  # the job starts on the node to be lost
        try:
            k8s.create_job("lost", namespace,
                           trainer={"numNodes": 2, "command": [sys.executable, "-c", RESUMES, str(workdir)],
                                    "resourcesPerNode": {"requests": {"cpu": "1"}}})
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
        lost_at = time.monotonic()
        cp.lose_node(LOST)

        def ready(name: str) -> str:
            conditions = core.read_node(name).status.conditions or []
            return next((c.status for c in conditions if c.type == "Ready"), "Unknown")

        not_ready = _until(lambda: ready(LOST) != "True", 120, f"{LOST} NotReady")
        node = core.read_node(LOST)
        core.patch_node(LOST, {"spec": {"taints": [*(t.to_dict() for t in node.spec.taints or []), OUT_OF_SERVICE]}})
        stopped_at = min(step(0), step(1))

        def running_on_the_node_left() -> bool:
            pods = k8s.pods("lost", namespace)
            return _running(k8s, namespace, "lost") and {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}

        moved = _until(running_on_the_node_left, 180, "the group running again on the node left",
                       lambda: k8s.diagnostics("lost", namespace))
        _until(lambda: _complete(k8s, namespace, "lost"), 180, "lost Complete",
                      lambda: k8s.diagnostics("lost", namespace))
        print(f"node lost: NotReady {not_ready:.1f} s after the kill; its pods running again on the node left "
              f"{not_ready + moved:.1f} s after it (tainted out-of-service at NotReady); Complete after "
              f"{time.monotonic() - lost_at:.1f} s")
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
    finally:
        cp.remove_node(LOST)
