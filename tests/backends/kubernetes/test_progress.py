"""``status.trainerStatus`` on Kubernetes from node-0's log: pure functions, no cluster."""

from __future__ import annotations

from trainjob.backends.kubernetes.progress import (
    RESIZE_ANNOTATION,
    is_elastic,
    new_resizes,
    resizes_from_logs,
    should_read_progress,
    trainer_status_from_log,
)

LOG = """\
2026-11-23T09:00:00.000000001Z [rank0]: step 100/1000 loss=2
2026-11-23T09:01:40Z [rank0]: progress 20% eta 800s loss=1.5 note="eval next"
"""
STATUS = {
    "progressPercentage": 20,
    "estimatedRemainingSeconds": 800,
    "metrics": [{"name": "loss", "value": "1.5"}, {"name": "note", "value": "eval next"}],
    "lastUpdatedTime": "2026-11-23T09:01:40Z",
}


def test_the_last_progress_line_becomes_the_trainer_status():
    assert trainer_status_from_log(LOG) == STATUS
    assert trainer_status_from_log("2026-11-23T09:00:00Z hello\n") is None


def test_reading_the_same_log_twice_gives_the_same_status():
    assert trainer_status_from_log(LOG) == trainer_status_from_log(LOG) == STATUS  # so a second read patches nothing


def test_the_log_is_read_while_the_job_runs():
    running, pending = {"status": {"phase": "Running"}}, {"status": {"phase": "Pending"}}
    active = {"status": {"jobsStatus": [{"name": "node", "ready": 1, "active": 1}]}}  # a running job has no conditions
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert should_read_progress(active, running)
    assert not should_read_progress(active, pending) and not should_read_progress(active, None)
    assert not should_read_progress(done, running)


RESIZE_LOG_A = """\
2026-11-23T09:00:05.5Z [rank0]: [trainjob] resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 40
2026-11-23T09:00:06Z [rank0]: step 41 loss=0.5
"""
RESIZE_LOG_B = """\
2026-11-23T09:00:05.5Z [trainjob] resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 40
2026-11-23T09:01:00.000000001Z [trainjob] resized 2 -> 3 nodes (world size 2 -> 3), resuming at step 60
"""


def test_resizes_are_read_from_every_pod_once_and_in_order():
    assert resizes_from_logs([RESIZE_LOG_B, RESIZE_LOG_A]) == [
        ("2026-11-23T09:00:05.5Z", "Resized 3 -> 2 nodes (world size 3 -> 2), resuming at step 40"),
        ("2026-11-23T09:01:00.000000001Z", "Resized 2 -> 3 nodes (world size 2 -> 3), resuming at step 60"),
    ]
    assert resizes_from_logs(["[trainjob] resized 3 -> 2 nodes (no timestamp)"]) == []


def test_only_resizes_after_the_last_reported_one_are_new():
    found = resizes_from_logs([RESIZE_LOG_B])
    assert new_resizes({"metadata": {}}, found) == found
    reported = {"metadata": {"annotations": {RESIZE_ANNOTATION: "2026-11-23T09:00:05.5Z"}}}
    assert [m for _, m in new_resizes(reported, found)] == [
        "Resized 2 -> 3 nodes (world size 2 -> 3), resuming at step 60"
    ]
    everything = {"metadata": {"annotations": {RESIZE_ANNOTATION: found[-1][0]}}}
    assert new_resizes(everything, found) == []


def jobset(nnodes):
    container = {"name": "node", "env": [{"name": "PET_NNODES", "value": nnodes}]}
    return {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [container]}}}}}
    ]}}


def test_only_a_range_of_nodes_is_elastic():
    assert is_elastic(jobset("2:3"), "node")
    assert not is_elastic(jobset("3"), "node")
    assert not is_elastic(jobset("2:3"), "trainer")
