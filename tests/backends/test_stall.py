"""The stall watch's rules (trainjob.backends.stall): the annotations, the limit a job's pace gives, the action."""

from __future__ import annotations

import doctest

import pytest

import trainjob.backends.stall as stall
from trainjob.backends.stall import (
    ProgressClock,
    RankCollectives,
    StallPolicy,
    collectives_overdue,
    parse_stall_timeout,
    stall_policy,
)
from trainjob.errors import ValidationError

TIMEOUT = "trainjob/stall-timeout"
ACTION = "trainjob/stall-action"


def test_docstring_examples() -> None:
    result = doctest.testmod(stall)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(("text", "seconds"), [
    ("600", 600.0),
    ("2.5", 2.5),
    ("90s", 90.0),
    ("10m", 600.0),
    ("1h30m", 5400.0),
    (" 2M ", 120.0),
    ("off", None),
    ("OFF", None),
])
def test_stall_timeouts_people_write(text: str, seconds: float | None) -> None:
    assert parse_stall_timeout(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "0s", "10x", "ten minutes", "inf", "nan", "5m10", "m"])
def test_a_bad_stall_timeout_names_the_annotation_and_what_is_accepted(text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_stall_timeout(text)
    assert str(caught.value) == (
        f"metadata.annotations[{TIMEOUT}]: must be a duration (\"600\" seconds, \"90s\", \"10m\", \"1h30m\") greater "
        f"than 0, or \"off\", got {text!r}"
    )


@pytest.mark.parametrize(("job", "runtime", "max_restarts", "expected"), [
    ({}, {}, 0, StallPolicy(None, True, "fail")),
    ({}, {}, 2, StallPolicy(None, True, "restart")),
    ({TIMEOUT: "5m"}, {}, 0, StallPolicy(300.0, True, "fail")),
    ({TIMEOUT: "off"}, {}, 0, StallPolicy(None, False, "fail")),
    ({ACTION: "fail"}, {}, 3, StallPolicy(None, True, "fail", action_chosen=True)),
    ({ACTION: "Restart"}, {}, 1, StallPolicy(None, True, "restart", action_chosen=True)),
    # the runtime's annotations apply to its jobs; the job's own win
    ({}, {TIMEOUT: "20m", ACTION: "fail"}, 1, StallPolicy(1200.0, True, "fail", action_chosen=True)),
    ({TIMEOUT: "1m"}, {TIMEOUT: "20m"}, 0, StallPolicy(60.0, True, "fail")),
    ({TIMEOUT: "off"}, {TIMEOUT: "20m"}, 0, StallPolicy(None, False, "fail")),
])
def test_stall_policy_of_a_job_and_its_runtime(job, runtime, max_restarts, expected) -> None:
    assert stall_policy(job, runtime, max_restarts=max_restarts) == expected


@pytest.mark.parametrize(("job", "runtime", "max_restarts", "message"), [
    ({ACTION: "retry"}, {}, 1, f"metadata.annotations[{ACTION}]: must be restart or fail, got 'retry'"),
    ({ACTION: "restart"}, {}, 0, f"metadata.annotations[{ACTION}]: restart needs restarts to spend: set the "
                                 "runtime's elasticPolicy.maxRestarts to 1 or more, or use fail"),
    ({}, {TIMEOUT: "soon"}, 0, f"ClusterTrainingRuntime torch: metadata.annotations[{TIMEOUT}]: must be a duration"),
])
def test_bad_stall_settings_are_refused_naming_where_they_came_from(job, runtime, max_restarts, message) -> None:
    with pytest.raises(ValidationError) as caught:
        stall_policy(job, runtime, max_restarts=max_restarts, runtime_name="ClusterTrainingRuntime torch")
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(("reports", "policy", "now", "overdue"), [
    # not armed before the first report
    ([], StallPolicy(), 10_000.0, None),
    # derived: at least the floor ...
    ([0.0, 1.0, 2.0], StallPolicy(), 62.0, None),
    ([0.0, 1.0, 2.0], StallPolicy(), 62.5, (60.5, 60.0)),
    # ... and only once there is a pace: one report is not enough
    ([5.0], StallPolicy(), 10_000.0, None),
    ([5.0], StallPolicy(timeout=5.0), 10.5, (5.5, 5.0)),
    # ... else 10 x the longest interval between reports (a checkpoint at 100 -> 160 counts)
    ([0.0, 100.0, 160.0, 161.0], StallPolicy(), 1160.0, None),
    ([0.0, 100.0, 160.0, 161.0], StallPolicy(), 1162.0, (1001.0, 1000.0)),
    # explicit: exactly the annotation, whatever the pace
    ([0.0, 100.0], StallPolicy(timeout=5.0), 105.5, (5.5, 5.0)),
    ([0.0, 100.0], StallPolicy(timeout=5.0), 104.0, None),
    # off
    ([0.0, 1.0], StallPolicy(watched=False), 1e9, None),
])
def test_when_a_silent_job_is_overdue(reports, policy, now, overdue) -> None:
    clock = ProgressClock()
    clock.saw(reports)
    assert clock.overdue(policy, now) == overdue


def test_a_reset_clock_waits_for_the_next_report() -> None:
    clock = ProgressClock()
    clock.saw([0.0, 1.0])
    clock.reset()
    assert clock.overdue(StallPolicy(timeout=1.0), now=100.0) is None
    clock.saw([99.0])
    assert clock.overdue(StallPolicy(timeout=1.0), now=100.5) == (1.5, 1.0)


def _ranks(*states: tuple[float | None, float | None]) -> list[RankCollectives]:
    return [RankCollectives(rank, completed, waiting) for rank, (completed, waiting) in enumerate(states)]


@pytest.mark.parametrize(("ranks", "policy", "now", "overdue"), [
    # no rank started a collective, or none waits in one (every rank computing, however long): not stalled
    ([], StallPolicy(), 1e9, None),
    (_ranks((100.0, None), (100.0, None)), StallPolicy(), 1e9, None),
    # the default limit: rank 0 waits in a barrier since 100 while rank 1 evaluates
    (_ranks((99.0, 100.0), (99.0, None)), StallPolicy(), 390.0, None),
    (_ranks((99.0, 100.0), (99.0, None)), StallPolicy(), 401.0, (301.0, 300.0)),
    # the wait counts from the later of its start and the last collective completed on any rank
    (_ranks((10.0, 20.0), (50.0, None)), StallPolicy(timeout=5.0), 54.0, None),
    (_ranks((10.0, 20.0), (50.0, None)), StallPolicy(timeout=5.0), 56.0, (6.0, 5.0)),
    # the first collective of the job never completed
    (_ranks((None, 7.0), (None, None)), StallPolicy(timeout=5.0), 13.0, (6.0, 5.0)),
    # explicit limit, and off
    (_ranks((0.0, 0.0)), StallPolicy(timeout=90.0), 91.0, (91.0, 90.0)),
    (_ranks((0.0, 0.0)), StallPolicy(watched=False), 1e9, None),
])
def test_when_a_job_that_does_not_report_is_overdue(ranks, policy, now, overdue) -> None:
    assert collectives_overdue(ranks, policy, now) == overdue


@pytest.mark.parametrize(("annotations", "max_restarts", "action"), [
    ({}, 0, "warn"),
    ({}, 2, "warn"),  # a job's restart budget does not make a stall of a silent job a restart
    ({ACTION: "fail"}, 0, "fail"),
    ({ACTION: "restart"}, 1, "restart"),
])
def test_a_stall_of_a_job_that_does_not_report_warns_unless_the_action_is_chosen(annotations, max_restarts,
                                                                                 action) -> None:
    assert stall_policy(annotations, max_restarts=max_restarts).collective_action == action


def test_a_policy_round_trips_through_its_dict() -> None:
    policy = stall_policy({TIMEOUT: "5s", ACTION: "fail"})
    assert StallPolicy.from_dict(policy.to_dict()) == policy
    assert StallPolicy.from_dict({"timeout": None, "watched": True, "action": "fail"}) == StallPolicy()
