"""The cluster's own faults, with a job training: the API server or etcd killed (SIGKILL) and started again on the
same data, and the JobSet controller down while jobs are created. Each time the job completes, with one JobSet (the
same one) and one ``JobSetCreated`` event, and nothing has to be done to the operator or the job.

Each test prints how long from the fault to recovered, for the record.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster

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
    k8s.create_job("stuck", namespace, annotations={"trainjob/stall-timeout": "10s"},
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
