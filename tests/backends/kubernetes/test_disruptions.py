"""The disruption decisions (:mod:`trainjob.backends.kubernetes.disruptions`) as tables: which pods a suspension
marks, and which peers of a pod Kubernetes disrupted must stop with it."""

from __future__ import annotations

from typing import Any

import pytest

from trainjob.backends.kubernetes.disruptions import (
    DISRUPTION_TARGET,
    PEER_REASON,
    SUSPENDED_REASON,
    condition,
    group_disruption,
    reason_in_words,
    unmarked,
)


def pod(name: str, phase: str = "Running", made: str = "2026-12-07T10:00:00Z",
        marked: tuple[str, str] | None = None) -> dict[str, Any]:
    """A pod made at ``made``; ``marked``: (reason, time) of a ``DisruptionTarget=True`` condition."""
    conditions = [{"type": "Ready", "status": "True"}]
    if marked is not None:
        conditions.append({"type": DISRUPTION_TARGET, "status": "True", "reason": marked[0],
                           "lastTransitionTime": marked[1]})
    return {"metadata": {"name": name, "creationTimestamp": made}, "status": {"phase": phase,
                                                                            "conditions": conditions}}


EVICTED = ("EvictionByEvictionAPI", "2026-12-07T10:05:00Z")


@pytest.mark.parametrize(("pods", "marked"), [
    ([pod("a"), pod("b")], ["a", "b"]),
    ([pod("a", phase="Pending"), pod("b", phase="Succeeded"), pod("c", phase="Failed")], ["a"]),
    ([pod("a", marked=EVICTED), pod("b", marked=(SUSPENDED_REASON, "2026-12-07T10:05:00Z")), pod("c")], ["c"]),
    ([], []),
], ids=["running", "finished-ones-left", "marked-ones-left", "no-pods"])
def test_a_suspension_marks_the_unfinished_unmarked_pods(pods: list[dict[str, Any]], marked: list[str]) -> None:
    assert [p["metadata"]["name"] for p in unmarked(pods)] == marked


@pytest.mark.parametrize(("pods", "cause", "peers"), [
    # an evicted pod: the peers made before the eviction stop with it
    ([pod("a", marked=EVICTED), pod("b"), pod("c", phase="Pending")], "a", ["b", "c"]),
    # the replacement, made after the eviction, is left to run; so is a finished peer
    ([pod("a", marked=EVICTED), pod("a2", made="2026-12-07T10:05:03Z"), pod("b", phase="Failed")], None, []),
    # the peers are marked already (the spread happened): nothing more to stop
    ([pod("a", marked=EVICTED), pod("b", marked=(PEER_REASON, "2026-12-07T10:05:01Z"))], None, []),
    # marks of this operator (a suspension) are no disruption by Kubernetes
    ([pod("a", marked=(SUSPENDED_REASON, "2026-12-07T10:05:00Z")), pod("b")], None, []),
    # two disruptions: the first one is the cause
    ([pod("a", marked=("DeletionByPodGC", "2026-12-07T10:06:00Z")), pod("b", marked=EVICTED), pod("c")], "b", ["c"]),
    # no disruption at all
    ([pod("a"), pod("b")], None, []),
], ids=["evicted", "replacement-left", "spread-already", "suspension-is-ours", "first-cause", "none"])
def test_a_disrupted_pod_takes_down_the_peers_made_before_it(pods: list[dict[str, Any]], cause: str | None,
                                                             peers: list[str]) -> None:
    found = group_disruption(pods)
    if cause is None:
        assert found is None
        return
    assert found is not None
    assert found.cause["metadata"]["name"] == cause
    assert [p["metadata"]["name"] for p in found.peers] == peers


def test_the_condition_is_what_kubernetes_writes_and_the_reasons_read_as_words() -> None:
    mark = condition(SUSPENDED_REASON, "suspended", 1_796_637_600.0)
    assert mark == {"type": "DisruptionTarget", "status": "True", "reason": "TrainJobSuspended",
                    "message": "suspended", "lastTransitionTime": "2026-12-07T10:00:00Z"}
    assert reason_in_words("PreemptionByScheduler").startswith("preempted by the scheduler")
    assert reason_in_words("SomethingNew") == "disrupted (SomethingNew)"
