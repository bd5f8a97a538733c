"""``status.trainerStatus`` on Kubernetes from node-0's log: pure functions, no cluster."""

from __future__ import annotations

from trainjob.backends.kubernetes.progress import (
    should_read_progress,
    trainer_status_from_log,
    trainer_status_patch,
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


def test_a_patch_only_when_the_status_changes():
    job = {"status": {"conditions": []}}
    assert trainer_status_patch(job, LOG) == {"status": {"trainerStatus": STATUS}}
    assert trainer_status_patch({"status": {"trainerStatus": STATUS}}, LOG) is None  # read twice: no patch
    assert trainer_status_patch(job, "no progress here") is None


def test_the_log_is_read_while_the_job_runs():
    running, pending = {"status": {"phase": "Running"}}, {"status": {"phase": "Pending"}}
    active = {"status": {"conditions": [{"type": "Running", "status": "True"}]}}
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert should_read_progress(active, running)
    assert not should_read_progress(active, pending) and not should_read_progress(active, None)
    assert not should_read_progress(done, running)
