"""How job listings read: durations, progress with loss and ETA, aligned columns."""

from __future__ import annotations

import pytest

from trainjob.backends.local.client.views import eta_seconds
from trainjob.cli.jobs_format import human_duration, progress_summary, table


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (-3, "0s"), (42.9, "42s"), (192, "3m12s"), (7500, "2h5m"), (273600, "3d4h")],
)
def test_durations_read_like_kubectl(seconds, text):
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    ("step", "total", "loss", "eta", "text"),
    [
        (None, None, None, None, "-"),
        (120, 320, 0.41234, 65, "38% 120/320 loss=0.4123 eta 1m5s"),
        (7, None, None, None, "step 7"),
        (None, None, 2.5, None, "loss=2.5"),
    ],
)
def test_progress_shows_what_was_reported(step, total, loss, eta, text):
    assert progress_summary(step, total, loss, eta) == text


@pytest.mark.parametrize(
    ("status", "step", "first_step", "first_time", "last_time", "eta"),
    [
        ("Running", 30, 10, 100.0, 120.0, 70.0),  # 20 steps in 20 s, 70 steps left
        ("Running", 10, 10, 100.0, 100.0, None),  # one record: no rate yet
        ("Complete", 30, 10, 100.0, 120.0, None),  # finished jobs have no ETA
    ],
)
def test_eta_extrapolates_the_observed_step_rate(status, step, first_step, first_time, last_time, eta):
    assert eta_seconds(status, step, 100, first_step, first_time, last_time) == eta


def test_tables_align_columns_and_leave_the_last_unpadded():
    assert table(["NAME", "STATUS"], [["a", "Running"], ["long-name", "-"]]).splitlines() == [
        "NAME        STATUS",
        "a           Running",
        "long-name   -",
    ]
