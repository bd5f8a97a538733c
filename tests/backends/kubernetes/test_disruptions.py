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
    disruption_hazards,
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
    # the replacement, made after the eviction, is left to run; a peer that failed already is marked (its exit is
    # then ignored), one that succeeded is left alone
    ([pod("a", marked=EVICTED), pod("a2", made="2026-12-07T10:05:03Z"), pod("b", phase="Failed"),
      pod("c", phase="Succeeded")], "a", ["b"]),
    ([pod("a", marked=EVICTED), pod("a2", made="2026-12-07T10:05:03Z")], None, []),
    # the peers are marked already (the spread happened): nothing more to stop
    ([pod("a", marked=EVICTED), pod("b", marked=(PEER_REASON, "2026-12-07T10:05:01Z"))], None, []),
    # marks of this operator (a suspension) are no disruption by Kubernetes
    ([pod("a", marked=(SUSPENDED_REASON, "2026-12-07T10:05:00Z")), pod("b")], None, []),
    # two disruptions: the first one is the cause
    ([pod("a", marked=("DeletionByPodGC", "2026-12-07T10:06:00Z")), pod("b", marked=EVICTED), pod("c")], "b", ["c"]),
    # no disruption at all
    ([pod("a"), pod("b")], None, []),
], ids=["evicted", "failed-peer-marked", "replacement-left", "spread-already", "suspension-is-ours", "first-cause", "none"])
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


@pytest.mark.parametrize(("annotations", "jobset_restarts", "total", "described"), [
    ({}, 0, 0, "0"),
    ({"trainjob/disruptions": "2"}, 0, 2, "2 (2 after a disruption: not counted against maxRestarts)"),
    ({"trainjob/restarts-reported": "1", "trainjob/stall-restarts": "1", "trainjob/disruptions": "1"}, 0, 3,
     "3 (1 after a failure, 1 after a stall, 1 after a disruption: not counted against maxRestarts)"),
    ({"trainjob/restarts-reported": "1"}, 2, 2, "2"),  # the JobSet's count ahead of the reported one
    ({"trainjob/disruptions": "x"}, 0, 0, "0"),
], ids=["none", "disruptions", "each-reason", "jobset-ahead", "garbage"])
def test_restarts_are_counted_by_why_and_described(annotations: dict[str, str], jobset_restarts: int, total: int,
                                                   described: str) -> None:
    from trainjob.backends.kubernetes.views import trainjob_view
    from trainjob.cli.describe import _restarts

    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "mnist", "namespace": "ml", "creationTimestamp": "2026-12-07T10:00:00Z",
                        "annotations": annotations},
           "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}}}
    view = trainjob_view(job, [], {"status": {"restarts": jobset_restarts}})
    assert view.restarts == total
    if jobset_restarts:  # the annotations say one reason less than the JobSet did: the total alone is honest
        assert _restarts(view).startswith(str(total))
    else:
        assert _restarts(view) == described


def _jobset(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"podFailurePolicy": {"rules":
                                                                                                  list(rules)}}}}]}}


IGNORE = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
FAIL_ON_1 = {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [1]}}


@pytest.mark.parametrize(("jobset", "hazard"), [
    (_jobset(IGNORE, FAIL_ON_1), None),
    (_jobset(FAIL_ON_1), "replicatedJobs[node].podFailurePolicy.rules[0] fails the job on an exit code"),
    (_jobset(FAIL_ON_1, IGNORE), "rules[0]"),
    (_jobset({"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}}), None),
    ({"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {}}}]}}, None),
], ids=["ignore-first", "fail-only", "fail-before-ignore", "count", "no-policy"])
def test_a_policy_that_fails_on_a_stopped_pod_is_named(jobset: dict[str, Any], hazard: str | None) -> None:
    found = disruption_hazards(jobset)
    if hazard is None:
        assert found == []
    else:
        assert len(found) == 1 and hazard in found[0] and "DisruptionTarget" in found[0]
