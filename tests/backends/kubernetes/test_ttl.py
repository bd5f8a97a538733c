"""The operator's TTL decision: seconds until a finished TrainJob should be deleted."""

from __future__ import annotations

import pytest

from trainjob.backends.kubernetes.status import parse_timestamp
from trainjob.backends.kubernetes.ttl import ttl_remaining

FINISHED_AT = "2026-01-02T03:04:05Z"
NOW = parse_timestamp(FINISHED_AT) + 100


def trainjob(ttl=None, conditions=()):
    annotations = {} if ttl is None else {"trainjob/ttl-seconds-after-finished": ttl}
    return {"metadata": {"name": "a", "annotations": annotations}, "status": {"conditions": list(conditions)}}


def condition(type_, status="True", when=FINISHED_AT):
    return {"type": type_, "status": status, "reason": type_, "message": "", "lastTransitionTime": when}


@pytest.mark.parametrize(
    ("case", "job", "expected"),
    [
        ("complete_before_its_ttl_waits_the_rest", trainjob("300", [condition("Complete")]), 200),
        ("failed_counts_as_finished", trainjob("60", [condition("Failed")]), -40),
        ("ttl_zero_deletes_at_once", trainjob("0", [condition("Complete")]), -100),
        ("running_job_is_kept", trainjob("0", [condition("Complete", "False")]), None),
        ("suspended_job_is_kept", trainjob("0", [condition("Suspended")]), None),
        ("no_annotation_is_kept", trainjob(None, [condition("Complete")]), None),
        ("unreadable_ttl_is_kept", trainjob("1h", [condition("Complete")]), None),
        ("unreadable_time_is_kept", trainjob("0", [condition("Complete", when="yesterday")]), None),
        ("no_status_is_kept", {"metadata": {"annotations": {"trainjob/ttl-seconds-after-finished": "0"}}}, None),
    ],
)
def test_ttl_remaining(case, job, expected):
    assert ttl_remaining(job, NOW) == expected
