"""A job outlives its supervisor: a replacement adopts the running nodes, and nodes never run unsupervised."""

from __future__ import annotations

import json
import os
import signal
import time

from jobtest.local import processes_under, trainjob_resource, wait_until

# Node 0 reports one metrics record per step; every node writes its pid and waits for a file before it ends.
STEPPER = """
    import json, os, sys, time
    job_dir = os.environ["TRAINJOB_JOB_DIR"]
    node = os.environ["PET_NODE_RANK"]
    with open(os.path.join(job_dir, f"pid-{node}"), "w") as f:
        f.write(str(os.getpid()))
    step = 0
    while not os.path.exists(os.path.join(job_dir, "finish")) and step < 2000:
        step += 1
        if node == "0":
            with open(os.environ["TRAINJOB_METRICS_FILE"], "a") as f:
                f.write(json.dumps({"time": time.time(), "step": step, "metrics": {"loss": 1 / step}}) + "\\n")
        time.sleep(0.05)
    if os.environ.get("TRAINJOB_RESTART_COUNT") == "0" and os.path.exists(os.path.join(job_dir, "fail-" + node)):
        sys.exit(3)
"""

def kill_supervisor(backend, name: str) -> int:
    pid = backend.store.get_job(name)["supervisor_pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_supervisor_is_replaced_and_the_job_ends_as_it_would_have(backend, script, trainjob_home):
    stepper = script("stepper.py", STEPPER)
    backend.apply(trainjob_resource("steady", ["python", stepper], num_nodes=2))
    job_dir = backend.store.job_dir("steady")
    wait_until(lambda: (j := backend.get_job("steady")).progress and j.progress.step >= 3, timeout=60)
    wait_until(lambda: all((f := job_dir / f"pid-{n}").exists() and f.read_text() for n in (0, 1)), timeout=60)
    node_pids = [int((job_dir / f"pid-{n}").read_text()) for n in (0, 1)]

    lost = kill_supervisor(backend, "steady")
    killed = time.time()

    def replaced():
        return [e for e in backend.get_job_events("steady") if e.reason == "SupervisorReplaced"]

    (event,) = wait_until(replaced, timeout=30)
    assert f"supervisor pid {lost} was lost" in event.message and "adopting 2 running node(s)" in event.message
    wait_until(lambda: backend.get_job("steady").progress.updated.timestamp() > killed + 0.2, timeout=30)
    assert backend.store.get_job("steady")["supervisor_pid"] != lost
    (job_dir / "finish").touch()

    job = backend.wait_for_job_status("steady", timeout=60)
    assert (job.status, job.reason, job.restarts) == ("Complete", "Completed", 0)
    assert [int((job_dir / f"pid-{n}").read_text()) for n in (0, 1)] == node_pids, "the nodes were adopted, not restarted"
    steps = [m["step"] for m in backend.store.metrics("steady")]
    assert steps == list(range(1, steps[-1] + 1)), "metrics written while unsupervised are neither lost nor repeated"
    wait_until(lambda: processes_under(trainjob_home) == [], timeout=15)


def test_an_elastic_job_still_restarts_after_its_supervisor_was_replaced(backend, script, elastic_runtimes):
    stepper = script("stepper.py", STEPPER)
    backend.apply(trainjob_resource("bouncy", ["python", stepper], runtime="torch-elastic"), elastic_runtimes)
    job_dir = backend.store.job_dir("bouncy")
    wait_until(lambda: (job_dir / "pid-1").exists(), timeout=60)

    kill_supervisor(backend, "bouncy")
    wait_until(lambda: any(e.reason == "SupervisorReplaced" for e in backend.get_job_events("bouncy")), timeout=30)
    (job_dir / "fail-1").touch()
    (job_dir / "finish").touch()

    job = backend.wait_for_job_status("bouncy", timeout=60)
    assert (job.status, job.restarts) == ("Complete", 1)
    (restarting,) = [e for e in backend.get_job_events("bouncy") if e.reason == "Restarting"]
    assert "node-1 exited with code 3" in restarting.message


def test_nodes_stop_themselves_when_no_supervisor_can_take_their_job_over(backend, script, trainjob_home):
    stepper = script("stepper.py", STEPPER)
    backend.apply(trainjob_resource("gone", ["python", stepper], num_nodes=2))
    wait_until(lambda: (backend.store.job_dir("gone") / "pid-1").exists(), timeout=60)
    backend.store.transition("gone", "Failed", "Test", "marked over behind the supervisor's back",
                             from_statuses=("Running",))

    kill_supervisor(backend, "gone")

    wait_until(lambda: processes_under(trainjob_home) == [], timeout=30)
    assert (backend.get_job("gone").status, backend.get_job("gone").reason) == ("Failed", "Test")
    exits = [json.loads((backend.store.job_dir("gone") / "logs" / f"node-{n}.exit.json").read_text()) for n in (0, 1)]
    assert [e["stopped"] for e in exits] == [True, True]
