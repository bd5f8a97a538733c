"""Training progress from the line rank 0 prints (or the record it writes) to ``trainjob get`` and to Kubeflow
Trainer's ``status.trainerStatus`` (v2.2 shape)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from trainjob.progress import (
    parse_line,
    progress_line,
    progress_of_records,
    progress_of_trainer_status,
    records_from_log,
    step_line,
    trainer_status,
)
from trainjob.sdk.types import Progress


@pytest.mark.parametrize(
    ("line", "record"),
    [
        (step_line(120, 1000, {"loss": 0.4312}), {"step": 120, "total_steps": 1000, "metrics": {"loss": 0.4312}}),
        (step_line(7, None, {}), {"step": 7, "total_steps": None, "metrics": {}}),
        (progress_line(42, 120, {"loss": 0.5, "phase": "warm up"}),
         {"progress_percent": 42, "estimated_remaining_seconds": 120, "metrics": {"loss": 0.5, "phase": "warm up"}}),
        (progress_line(None, None, {"acc": float("nan")}),
         {"progress_percent": None, "estimated_remaining_seconds": None, "metrics": {"acc": None}}),
    ],
)
def test_the_lines_rank_0_prints_read_back_as_records(line, record):
    assert parse_line(line) == record


@pytest.mark.parametrize("line", ["step 5 done", "progress bar 42%", "loss=0.3", "step five/10", ""])
def test_other_output_is_no_progress(line):
    assert parse_line(line) is None


def test_a_log_with_timestamps_gives_percent_rate_and_time_left():
    log = "\n".join([
        "2026-11-23T09:00:00Z [rank0]: step 100/1000 loss=2",
        "2026-11-23T09:00:05.5Z some other line",
        "step 150/1000 loss=1.8",  # no timestamp: skipped
        "2026-11-23T09:01:40Z step 200/1000 loss=1.5",
    ])
    progress = progress_of_records(records_from_log(log))

    assert (progress.step, progress.total_steps, progress.metrics) == (200, 1000, {"loss": 1.5})
    assert progress.eta_seconds == pytest.approx(800.0)  # 100 steps took 100 s; 800 are left
    assert trainer_status(progress) == {
        "progressPercentage": 20,
        "estimatedRemainingSeconds": 800,
        "metrics": [{"name": "loss", "value": "1.5"}],
        "lastUpdatedTime": "2026-11-23T09:01:40Z",
    }


def test_a_status_update_replaces_what_the_steps_said_as_kubeflows_does():
    records = [
        {"time": 100.0, "step": 10, "total_steps": 100, "metrics": {"loss": 1.0}},
        {"time": 110.0, "progress_percent": 55, "estimated_remaining_seconds": None, "metrics": {"acc": 0.9}},
    ]
    progress = progress_of_records(records)

    assert (progress.fraction, progress.eta_seconds, progress.metrics) == (0.55, None, {"acc": 0.9})
    assert trainer_status(progress) == {
        "progressPercentage": 55, "metrics": [{"name": "acc", "value": "0.9"}],
        "lastUpdatedTime": "1970-01-01T00:01:50Z",
    }


def test_kubeflow_limits_hold_and_nothing_reported_is_no_status():
    many = {f"m{i}": float(i) for i in range(300)}
    status = trainer_status(Progress(percent=140.0, eta_seconds=-5, metrics=many, updated=datetime.now(UTC)))
    assert (status["progressPercentage"], status["estimatedRemainingSeconds"], len(status["metrics"])) == (100, 0, 256)
    assert trainer_status(None) is None and progress_of_records([]) is None


def test_a_trainer_status_reads_back_as_progress():
    progress = progress_of_trainer_status({
        "progressPercentage": 42, "estimatedRemainingSeconds": 120, "lastUpdatedTime": "2026-11-23T09:01:40Z",
        "metrics": [{"name": "loss", "value": "0.43"}, {"name": "phase", "value": "eval"}],
    })
    assert (progress.percent, progress.eta_seconds, progress.metrics) == (42.0, 120, {"loss": 0.43})
    assert progress_of_trainer_status({"progressPercentage": 1}) is None  # lastUpdatedTime is required
