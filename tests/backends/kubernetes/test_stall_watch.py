"""The stall watch on Kubernetes as tables: the reports a running job sent and when, its stall annotations and
restart budget in; when it is due, what it did (restart, fail) and what it asked of the API server out.
The API server is :class:`kubetest.memory_api.MemoryApi`; the rules of :mod:`trainjob.backends.stall` run for real."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubetest.memory_api import MemoryApi

from trainjob.backends.kubernetes.cache import CachedReads, ObjectCache
from trainjob.backends.kubernetes.resources import (
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    JOBSETS,
    REPLICATED_JOB_LABEL,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.stall_watch import StallWatch
from trainjob.backends.kubernetes.status_server import StatusServer
from trainjob.backends.kubernetes.status_writer import StatusWriter
from trainjob.backends.stall import RankCollectives
from trainjob.constants import LAUNCH_ANNOTATION, STALL_RESTARTS_ANNOTATION

NS, NAME, START = "ml", "mnist", 1_800_000_000.0
TEN_S_FAIL = {"trainjob/stall-timeout": "10s", "trainjob/stall-action": "fail"}
TEN_S_RESTART = {"trainjob/stall-timeout": "10s", "trainjob/stall-action": "restart"}
RANK_0_IN_ALL_REDUCE = (
    "2027-01-15T08:00:01Z [trainjob-stacks rank 0] no progress for 6 s; its stacks:\n"
    "2027-01-15T08:00:01Z [trainjob-stacks rank 0] Thread 0x1 (most recent call first):\n"
    '2027-01-15T08:00:01Z [trainjob-stacks rank 0]   File "/venv/torch/distributed/distributed_c10d.py", '
    "line 2810 in all_reduce\n"
    '2027-01-15T08:00:01Z [trainjob-stacks rank 0]   File "/job/train.py", line 30 in <module>\n'
)


@dataclass
class Case:
    """Passes of the watch at ``START + t`` seconds, each with the report the job's status held then."""

    id: str
    annotations: dict[str, str]
    passes: Sequence[tuple[float, str | None]]  # (t, the report's lastUpdatedTime, None: no report yet)
    due_in: float | None  # what the last pass returned
    max_restarts: int = 0  # the JobSet's failurePolicy.maxRestarts
    jobset_restarts: int = 0  # the JobSet's own status.restarts
    reason: str | None = None  # the Failed condition's reason after the last pass (None: not failed)
    stalled: Sequence[str] = ()  # the words each Stalled event holds, in order
    evicted: int = 0  # pods evicted
    restarts_counted: str | None = None  # trainjob/stall-restarts after the last pass
    jobset_deleted: bool = False
    unarm_before_last: bool = False
    logs: dict[int, str] = field(default_factory=dict)  # node -> log of its running pod


CASES = [
    Case("no-report-yet-is-not-watched", TEN_S_FAIL, [(0, None), (60, None)], due_in=None),
    Case("off-is-not-watched", {"trainjob/stall-timeout": "off"}, [(0, "t0"), (600, "t0")], due_in=None),
    Case("a-report-arms-the-watch-for-its-limit", TEN_S_FAIL, [(1, "t1")], due_in=10.5),
    Case("the-same-report-again-does-not-tick-the-clock", TEN_S_FAIL, [(1, "t1"), (6, "t1")], due_in=5.5),
    Case("a-new-report-ticks-the-clock", TEN_S_FAIL, [(1, "t1"), (6, "t6")], due_in=10.5),
    Case("without-a-timeout-the-limit-is-the-floor", {}, [(1, "t1"), (3, "t3")], due_in=60.5),
    Case("overdue-with-fail-fails-and-deletes-the-jobset", TEN_S_FAIL, [(1, "t1"), (12, "t1")], due_in=0.0,
         reason="Stalled", stalled=["no progress for 11.0 s", "(no rank wrote its stacks to its log)",
                                    "; its JobSet was deleted"], jobset_deleted=True),
    Case("the-stuck-ranks-are-named-from-their-stacks", TEN_S_FAIL, [(1, "t1"), (12, "t1")], due_in=0.0,
         reason="Stalled", logs={0: RANK_0_IN_ALL_REDUCE, 1: "2027-01-15T08:00:01Z step 7\n"},
         stalled=["rank 1 wrote no stacks", "every rank waits in all_reduce"], jobset_deleted=True),
    Case("overdue-with-restarts-left-evicts-the-pods-and-counts-first", TEN_S_RESTART, [(1, "t1"), (12, "t1")],
         due_in=None, max_restarts=2, logs={0: "", 1: ""}, evicted=2, restarts_counted="1",
         stalled=["restarting its node group (restart 1 of 2)"]),
    Case("the-jobsets-own-restarts-spend-the-same-budget", TEN_S_RESTART, [(1, "t1"), (12, "t1")], due_in=0.0,
         max_restarts=2, jobset_restarts=2, reason="Stalled", jobset_deleted=True,
         stalled=["; no restart left (2 of 2 spent); its JobSet was deleted"]),
    Case("after-a-restart-the-old-report-does-not-arm-it", TEN_S_RESTART, [(1, "t1"), (12, "t1"), (40, "t1")],
         due_in=None, max_restarts=2, logs={0: ""}, evicted=1, restarts_counted="1",
         stalled=["restart 1 of 2"]),
    Case("unarmed-a-suspended-job-is-not-overdue", TEN_S_FAIL, [(1, "t1"), (30, "t1")], due_in=None,
         unarm_before_last=True),
    Case("an-invalid-timeout-fails-the-job", {"trainjob/stall-timeout": "soon"}, [(1, "t1")], due_in=0.0,
         reason="InvalidStallTimeout"),
]


def _world(case: Case) -> tuple[list[float], MemoryApi, StallWatch, dict[str, Any], dict[str, Any]]:
    clock = [START]
    api = MemoryApi(lambda: clock[0])
    job = api.seed({"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                    "metadata": {"name": NAME, "namespace": NS, "annotations": case.annotations}, "spec": {}})
    launch = {"numNodes": 2, "numProcPerNode": 1}
    jobset = api.seed({"apiVersion": JOBSETS.api_version, "kind": JOBSETS.kind,
                       "metadata": {"name": NAME, "namespace": NS, "annotations": {LAUNCH_ANNOTATION: json.dumps(launch)},
                                    "ownerReferences": [{"kind": "TrainJob", "name": NAME,
                                                         "uid": job["metadata"]["uid"]}]},
                       "spec": {"failurePolicy": {"maxRestarts": case.max_restarts}, "replicatedJobs": []},
                       "status": {"restarts": case.jobset_restarts}})
    for node, log in case.logs.items():
        api.add_pod({"metadata": {"name": f"{NAME}-node-0-{node}", "namespace": NS,
                                  "labels": {JOBSET_NAME_LABEL: NAME, REPLICATED_JOB_LABEL: "node",
                                             COMPLETION_INDEX_LABEL: str(node)}},
                     "spec": {"containers": [{"name": "node"}]}, "status": {"phase": "Running"}}, {"node": log})
    reads = CachedReads(api)
    return clock, api, StallWatch(api, reads, StatusWriter(api, reads, lambda: clock[0])), job, jobset


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_stall_watch(case: Case) -> None:
    clock, api, watch, job, jobset = _world(case)
    due_in: float | None = None
    for i, (t, reported) in enumerate(case.passes):
        clock[0] = START + t
        if case.unarm_before_last and i == len(case.passes) - 1:
            watch.unarm(NS, NAME)
        new = {"trainerStatus": {"progressPercentage": 7, "lastUpdatedTime": reported}} if reported else {}
        stored = api.stored(TRAINJOBS, NS, NAME)
        assert stored is not None
        due_in = watch.watch(stored, stored.get("status") or {}, new, jobset, clock[0])
    assert due_in == (pytest.approx(case.due_in) if case.due_in is not None else None)
    stored = api.stored(TRAINJOBS, NS, NAME)
    assert stored is not None
    failed = [c for c in (stored.get("status") or {}).get("conditions") or [] if c["type"] == "Failed"]
    assert [c["reason"] for c in failed] == ([case.reason] if case.reason else [])
    stalled = [e["message"] for e in api.events if e["reason"] == "Stalled"]
    assert len(stalled) == (1 if case.stalled else 0)
    for words in case.stalled:
        assert words in stalled[0], stalled[0]
    if failed and case.reason == "Stalled":
        assert failed[0]["message"] == stalled[0]
    assert sum(1 for verb, resource, _ in api.requests if resource == "pods/eviction") == case.evicted
    assert (stored["metadata"].get("annotations") or {}).get(STALL_RESTARTS_ANNOTATION) == case.restarts_counted
    assert (api.stored(JOBSETS, NS, NAME) is None) == case.jobset_deleted


def test_a_namesake_of_a_job_that_went_starts_with_a_fresh_clock() -> None:
    case = Case("namesake", TEN_S_FAIL, [], due_in=None)
    clock, api, watch, job, jobset = _world(case)
    report = {"trainerStatus": {"progressPercentage": 7, "lastUpdatedTime": "t1"}}
    watch.watch(job, {}, report, jobset, START + 1)
    namesake = {**job, "metadata": {**job["metadata"], "uid": "another-uid"}}
    assert watch.watch(namesake, {}, {}, jobset, START + 30) is None  # no report of its own yet: not watched
    assert not api.events


RANK_1_IN_SLEEP = (
    "2027-01-15T08:00:01Z [trainjob-stacks rank 1] no progress for 6 s; its stacks:\n"
    "2027-01-15T08:00:01Z [trainjob-stacks rank 1] Current thread 0x2 (most recent call first):\n"
    '2027-01-15T08:00:01Z [trainjob-stacks rank 1]   File "/job/train.py", line 12 in <module>\n'
)


@dataclass
class CollectivesCase:
    """Passes of the watch over a job that never reported progress, at ``START + t`` seconds, each after the
    collectives reports its ranks sent: (rank, completed at t, waiting since t or ``None``)."""

    id: str
    annotations: dict[str, str]
    passes: Sequence[tuple[float, Sequence[tuple[int, float, float | None]]]]
    due_in: float | None
    events: Sequence[tuple[str, str]] = ()  # (reason, words) of each event, in order
    reason: str | None = None


COLLECTIVES_CASES = [
    CollectivesCase("no-collective-yet-is-not-watched", TEN_S_FAIL, [(0, []), (60, [])], due_in=None),
    CollectivesCase("every-rank-computing-is-looked-at-again-later", {"trainjob/stall-timeout": "20s"},
                    [(5, [(0, 4.5, None), (1, 4.8, None)])], due_in=5.0),
    CollectivesCase("a-waiting-rank-is-due-when-its-wait-could-pass-the-limit", {"trainjob/stall-timeout": "20s"},
                    [(22, [(0, 4.0, 4.5), (1, 3.0, None)])], due_in=3.0),
    CollectivesCase("else-a-quarter-of-the-limit-later-as-late-reports-may-move-it", TEN_S_FAIL,
                    [(5, [(0, 4.0, 4.5), (1, 3.0, None)])], due_in=2.5),
    CollectivesCase("the-default-limit-is-looked-at-every-30-s", {}, [(5, [(0, 4.0, 4.5), (1, 3.0, None)])],
                    due_in=30.0),
    CollectivesCase("a-wait-while-collectives-complete-elsewhere-is-no-stall", TEN_S_FAIL,
                    [(20, [(0, 19.0, 4.0), (1, 19.5, None)])], due_in=2.5),
    CollectivesCase("overdue-by-default-warns-naming-the-stuck-rank-and-runs-on", {"trainjob/stall-timeout": "10s"},
                    [(5, [(0, 4.0, 4.5), (1, 4.0, None)]), (15, [(0, 4.0, 4.5), (1, 4.0, None)])],
                    due_in=10.5, events=[("Stalled", "no collective completed for 10.5 s while rank 0 waits in one "
                                                     "(limit 10.0 s: trainjob/stall-timeout): rank 1 is not in the "
                                                     "all_reduce that rank 0 waits in: rank 1 is in <module> "
                                                     "(train.py:12); the job runs on")]),
    CollectivesCase("the-warning-is-repeated-once-per-limit-while-it-lasts", {"trainjob/stall-timeout": "10s"},
                    [(15, [(0, 4.0, 4.5), (1, 4.0, None)]), (20, [(0, 4.0, 4.5), (1, 4.0, None)]),
                     (25.5, [(0, 4.0, 4.5), (1, 4.0, None)])],
                    due_in=10.5, events=[("Stalled", "for 10.5 s"), ("Stalled", "for 21.0 s")]),
    CollectivesCase("collectives completing again end the stall", {"trainjob/stall-timeout": "10s"},
                    [(15, [(0, 4.0, 4.5), (1, 4.0, None)]), (40, [(0, 39.0, None), (1, 39.5, None)])],
                    due_in=2.5, events=[("Stalled", "for 10.5 s"), ("StallEnded", "after a stall of 35.5 s")]),
    CollectivesCase("overdue-with-fail-fails-and-deletes-the-jobset", TEN_S_FAIL,
                    [(15, [(0, 4.0, 4.5), (1, 4.0, None)])], due_in=0.0, reason="Stalled",
                    events=[("Stalled", "rank 1 is in <module> (train.py:12); its JobSet was deleted")]),
]


@pytest.mark.parametrize("case", COLLECTIVES_CASES, ids=[case.id for case in COLLECTIVES_CASES])
def test_a_job_that_does_not_report_is_held_to_its_collectives(case: CollectivesCase) -> None:
    """The ranks' reports reach the watch as the operator keeps them: through the status endpoint's store."""
    clock, api, _, job, jobset = _world(Case(case.id, case.annotations, [], None,
                                             logs={0: RANK_0_IN_ALL_REDUCE, 1: RANK_1_IN_SLEEP}))
    queued: list[tuple[str, str]] = []
    reports = StatusServer(api, ObjectCache(), tls=None, on_collectives=lambda ns, name: queued.append((ns, name)))
    reads = CachedReads(api)
    watch = StallWatch(api, reads, StatusWriter(api, reads, lambda: clock[0]), reports)
    due_in: float | None = None
    for t, ranks in case.passes:
        clock[0] = START + t
        for rank, completed, waiting in ranks:
            reports.keep_collectives(NS, NAME, RankCollectives(rank, START + completed,
                                                               None if waiting is None else START + waiting))
        stored = api.stored(TRAINJOBS, NS, NAME)
        assert stored is not None
        due_in = watch.watch(stored, stored.get("status") or {}, {}, jobset, clock[0])
    assert due_in == (pytest.approx(case.due_in) if case.due_in is not None else None)
    assert queued == ([(NS, NAME)] if any(ranks for _, ranks in case.passes) else [])  # the first report only
    events = [(e["reason"], e["message"]) for e in api.events]
    assert len(events) == len(case.events), events
    for (reason, message), (want_reason, words) in zip(events, case.events, strict=True):
        assert reason == want_reason and words in message, message
    stored = api.stored(TRAINJOBS, NS, NAME)
    assert stored is not None
    failed = [c for c in (stored.get("status") or {}).get("conditions") or [] if c["type"] == "Failed"]
    assert [c["reason"] for c in failed] == ([case.reason] if case.reason else [])
    assert (api.stored(JOBSETS, NS, NAME) is None) == (case.reason == "Stalled")


def test_a_job_that_reports_is_held_to_its_reports_not_its_collectives() -> None:
    clock, api, _, job, jobset = _world(Case("both", TEN_S_FAIL, [], None))
    reports = StatusServer(api, ObjectCache(), tls=None)
    reads = CachedReads(api)
    watch = StallWatch(api, reads, StatusWriter(api, reads, lambda: clock[0]), reports)
    reports.keep_collectives(NS, NAME, RankCollectives(0, START, START + 0.5))  # waiting, long past the limit
    report = {"trainerStatus": {"progressPercentage": 7, "lastUpdatedTime": "t1"}}
    assert watch.watch(job, {}, report, jobset, START + 60) == pytest.approx(10.5)
    assert not api.events
    watch.unarm(NS, NAME)  # its pods replaced: the old pods' collectives go too
    assert reports.collectives(NS, NAME) == []
