"""The local queue: jobs that request resources never oversubscribe this machine; they wait, in order, and one
bigger than the machine runs alone, scaled to it."""

from __future__ import annotations

import json
import os

import pytest
from jobtest.local import trainjob_resource, wait_until

from trainjob.errors import ValidationError

CORES = len(os.sched_getaffinity(0))

#: Records when it ran and on which cores, then sleeps a little: enough to see overlaps, without torch. With
#: ``until:PATH`` it runs until that file exists (another job's ``started-0``, which each run leaves in its job
#: directory at its start), 120 s at most: an overlap that does not depend on how fast a busy machine starts them.
TIMED = """
    import json, os, sys, time
    started = time.time()
    node = os.environ.get("PET_NODE_RANK", "0")
    open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], f"started-{node}"), "w").close()
    until = sys.argv[1] if len(sys.argv) > 1 else "0.6"
    if until.startswith("until:"):
        while not os.path.exists(until[6:]) and time.time() < started + 120:
            time.sleep(0.05)
    else:
        time.sleep(float(until))
    record = {"start": started, "end": time.time(), "cpus": sorted(os.sched_getaffinity(0)),
              "omp": os.environ.get("OMP_NUM_THREADS"), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}
    for file in ("ran.json", f"ran-{node}.json"):
        with open(os.path.join(os.environ["TRAINJOB_JOB_DIR"], file), "w") as f:
            json.dump(record, f)
"""

#: Events about the image and the environment, which depend on the caller's shell, not on the queue.
NOT_QUEUE_EVENTS = ("ImageNotUsed", "EnvironmentInherited", "EnvironmentNotInherited")


def job(name, script, cpu=None, seconds=None, priority=None, oversubscribe=False, nodes=1):
    command = ["python", script, *([str(seconds)] if seconds is not None else [])]
    annotations = {}
    if priority is not None:
        annotations["trainjob/priority"] = str(priority)
    if oversubscribe:
        annotations["trainjob/oversubscribe"] = "true"
    resource = trainjob_resource(name, command, num_nodes=nodes,
                                 **({"resources_per_node": {"requests": {"cpu": str(cpu)}}} if cpu else {}))
    resource.metadata.annotations = annotations or None
    return resource


def ran(backend, name):
    return json.loads((backend.store.job_dir(name) / "ran.json").read_text())


def ran_node(backend, name, node):
    return json.loads((backend.store.job_dir(name) / f"ran-{node}.json").read_text())


def test_three_jobs_that_each_need_the_whole_machine_run_one_after_another_in_order(backend, script):
    timed = script("timed.py", TIMED)
    for name in ("first", "second", "third"):
        backend.apply(job(name, timed, cpu=CORES))

    second, third = backend.get_job("second"), backend.get_job("third")
    assert (second.status, second.reason) == ("Queued", "WaitingForResources")
    assert second.message.startswith(f"waiting for {CORES} CPU(s) (0 of {CORES} free)")
    assert "held by first" in second.message
    assert third.status == "Queued" and "1 job(s) ahead in the queue" in third.message
    assert [e.reason for e in backend.get_job_events("second") if e.reason not in NOT_QUEUE_EVENTS] == ["Created", "Queued"]

    for name in ("first", "second", "third"):
        assert backend.wait_for_job_status(name, timeout=120).status == "Complete"
    runs = [ran(backend, name) for name in ("first", "second", "third")]
    assert runs[0]["end"] <= runs[1]["start"] and runs[1]["end"] <= runs[2]["start"], "they overlapped"
    assert all(r["cpus"] == sorted(os.sched_getaffinity(0)) for r in runs)
    events = {e.reason: e.message for e in backend.get_job_events("third")}
    assert events["Admitted"].startswith("resources free after")


def test_a_job_bigger_than_the_machine_runs_alone_scaled_to_it_after_the_running_job(backend, script, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the machine has
    timed = script("timed.py", TIMED)
    backend.apply(job("hog", timed, cpu=CORES, seconds=1.5))
    backend.apply(trainjob_resource("big", ["python", timed, "0.3"], num_nodes=2, resources_per_node={
        "requests": {"cpu": str(4 * CORES), "memory": "4Ei", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"}}))
    backend.apply(job("after", timed, cpu=1, seconds=0.1))  # fits, but waits behind big: the queue is strict

    waiting = backend.get_job("big")
    assert (waiting.status, waiting.reason) == ("Queued", "WaitingForResources")
    assert waiting.message.startswith("waiting for the machine to be free: the job is bigger than this machine, so "
                                      "it runs alone, scaled to it; running: hog; scaled to this machine: ")
    for name in ("hog", "big", "after"):
        assert backend.wait_for_job_status(name, timeout=120).status == "Complete"
    hog, runs, after = ran(backend, "hog"), [ran_node(backend, "big", i) for i in (0, 1)], ran(backend, "after")
    assert hog["end"] <= min(r["start"] for r in runs) and max(r["end"] for r in runs) <= after["start"], "overlap"
    share, cores = max(1, CORES // 2), sorted(os.sched_getaffinity(0))
    assert [r["cpus"] for r in runs] == [[cores[(i * share + k) % CORES] for k in range(share)] for i in (0, 1)]
    assert {(r["omp"], r["gpus"]) for r in runs} == {(str(share), "")}  # 1 process per node; no GPU to give
    done = backend.get_job("big")
    assert done.message.startswith(
        f"all 2 node(s) exited with code 0; scaled to this machine: {8 * CORES} CPUs asked, the 2 node(s) "
        f"{'share' if CORES < 2 else 'divide'} {CORES} core(s); 2 GPUs asked, there are 0: the ranks see none; 8Ei of "
        "memory asked, there is ")
    assert done.message.endswith(": not enforced")
    (event,) = [e for e in backend.get_job_events("big") if e.reason == "ScaledToMachine"]
    assert event.type == "Warning" and event.message.startswith("the job asks for more than this machine has")
    assert "CPUsShared" not in [e.reason for e in backend.get_job_events("big")]


def test_strict_resources_refuse_a_job_that_could_never_fit_at_submit_with_the_numbers(backend, script, monkeypatch):
    timed = script("timed.py", TIMED)
    monkeypatch.setenv("TRAINJOB_STRICT_RESOURCES", "1")

    with pytest.raises(ValidationError, match=rf"2 node\(s\) x {CORES} CPU\(s\) = {2 * CORES} CPUs, this machine has "
                       rf"{CORES} .*; strict resources are on \(TRAINJOB_STRICT_RESOURCES=1\)"):
        backend.apply(job("too-big", timed, cpu=CORES, nodes=2))
    memory = trainjob_resource("too-much-memory", ["python", timed], resources_per_node={"requests": {"memory": "4Ei"}})
    with pytest.raises(ValidationError, match=r"1 node\(s\) x 4Ei = 4Ei of memory, this machine has \d"):
        backend.apply(memory)
    monkeypatch.delenv("TRAINJOB_STRICT_RESOURCES")
    annotated = job("annotated", timed, cpu=CORES, nodes=2)
    annotated.metadata.annotations = {"trainjob/strict-resources": "true"}
    with pytest.raises(ValidationError, match=r"strict resources are on \(annotation trainjob/strict-resources"):
        backend.apply(annotated)

    assert backend.list_jobs() == []
    assert not backend.store.job_dir("too-big").exists()


def started(backend, name):
    """``until:`` the file a TIMED run of job ``name`` leaves at its start."""
    return f"until:{backend.store.job_dir(name) / 'started-0'}"


def test_oversubscribing_starts_at_once_as_before(backend, script):
    timed = script("timed.py", TIMED)
    backend.apply(job("hog", timed, cpu=CORES, seconds=started(backend, "rude")))
    backend.apply(job("rude", timed, cpu=CORES, seconds=0.1, oversubscribe=True))
    backend.apply(job("big", timed, cpu=CORES, nodes=2, seconds=0.1, oversubscribe=True))  # would never fit

    for name in ("hog", "rude", "big"):
        assert backend.wait_for_job_status(name, timeout=120).status == "Complete"
    hog, rude = ran(backend, "hog"), ran(backend, "rude")
    assert rude["start"] < hog["end"], "an oversubscribing job does not wait"
    assert "CPUsShared" in [e.reason for e in backend.get_job_events("big")]


def test_jobs_that_request_nothing_are_best_effort_and_never_wait(backend, script):
    timed = script("timed.py", TIMED)
    backend.apply(job("hog", timed, cpu=CORES, seconds=started(backend, "free-rider")))
    backend.apply(job("free-rider", timed, seconds=0.1))

    for name in ("hog", "free-rider"):
        assert backend.wait_for_job_status(name, timeout=60).status == "Complete"
    assert ran(backend, "free-rider")["start"] < ran(backend, "hog")["end"]


def test_priority_goes_first_then_submission_order(backend, script, monkeypatch):
    monkeypatch.setenv("TRAINJOB_PRIORITY_CLASSES", "high=1000")
    timed = script("timed.py", TIMED)
    backend.apply(job("running", timed, cpu=CORES, seconds=1.0))
    backend.apply(job("early", timed, cpu=CORES))
    backend.apply(job("urgent", timed, cpu=CORES, priority=10))
    vip = job("vip", timed, cpu=CORES)  # a manifest written for Kueue: its labels mean the same here
    vip.metadata.labels = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}
    backend.apply(vip)
    backend.apply(job("late", timed, cpu=CORES))

    assert "2 job(s) ahead" in backend.get_job("early").message
    assert "; queue team-a; priority 1000 (kueue.x-k8s.io/priority-class high)" in backend.get_job("vip").message
    created = next(e for e in backend.get_job_events("vip") if e.reason == "Created")
    assert created.message.endswith("; queue team-a; priority 1000 (kueue.x-k8s.io/priority-class high)")
    for name in ("running", "early", "urgent", "vip", "late"):
        assert backend.wait_for_job_status(name, timeout=120).status == "Complete"
    order = sorted(("early", "urgent", "vip", "late"), key=lambda name: ran(backend, name)["start"])
    assert order == ["vip", "urgent", "early", "late"]


def test_jobs_that_fit_side_by_side_get_disjoint_cores(backend, script):
    if CORES < 2:
        pytest.skip("needs two cores")
    timed = script("timed.py", TIMED)
    backend.apply(job("left", timed, cpu=1, seconds=started(backend, "right")))
    backend.apply(job("right", timed, cpu=1, seconds=started(backend, "left")))

    for name in ("left", "right"):
        assert backend.wait_for_job_status(name, timeout=60).status == "Complete"
    left, right = ran(backend, "left"), ran(backend, "right")
    assert left["start"] < right["end"] and right["start"] < left["end"], "both fit, so both ran at once"
    assert len(left["cpus"]) == len(right["cpus"]) == 1 and left["cpus"] != right["cpus"]


def test_deleting_or_suspending_frees_the_machine_and_a_suspended_queued_job_requeues(backend, script):
    timed = script("timed.py", TIMED)
    backend.apply(job("holder", timed, cpu=CORES, seconds=600))
    backend.apply(job("waiter", timed, cpu=CORES, seconds=600))
    backend.apply(job("later", timed, cpu=CORES, seconds=0.1))
    wait_until(lambda: backend.get_job("holder").status == "Running", timeout=30)

    backend.suspend_job("waiter")  # leaves the queue; "later" moves up but still waits for "holder"
    assert backend.get_job("waiter").status == "Suspended"
    assert "ahead" not in backend.get_job("later").message

    backend.delete_job("holder")
    assert backend.wait_for_job_status("later", timeout=60).status == "Complete"
    backend.resume_job("waiter")
    wait_until(lambda: backend.get_job("waiter").status == "Running", timeout=30, what="the resumed job to be admitted")


def test_bad_queue_annotations_are_refused(backend, script):
    timed = script("timed.py", TIMED)
    with pytest.raises(ValidationError, match=r"metadata.annotations\[trainjob/priority\]: must be an integer"):
        backend.apply(job("bad", timed, cpu=1, priority="high"))
    assert backend.list_jobs() == []


def test_a_job_created_suspended_for_a_queue_says_what_starts_it_and_runs_once_resumed(backend, script):
    """Kubeflow's ``examples/yaml/03-kueue-integration.yaml``: ``suspend: true`` and the label
    ``kueue.x-k8s.io/queue-name: training-queue``, for Kueue to resume. No Kueue runs here: the job stays Suspended
    and says so, and resumed, the machine's own queue admits it."""
    timed = script("timed.py", TIMED)
    resource = trainjob_resource("kueued", ["python", timed, "0.1"], spec={"suspend": True},
                                 resources_per_node={"requests": {"cpu": "1"}})
    resource.metadata.labels = {"kueue.x-k8s.io/queue-name": "training-queue"}
    backend.apply(resource)

    held = backend.get_job("kueued")
    assert held.status == "Suspended"
    assert "`trainjob resume kueued` starts it" in held.message and "'training-queue'" in held.message
    backend.resume_job("kueued")
    assert backend.wait_for_job_status("kueued", timeout=60).status == "Complete"
