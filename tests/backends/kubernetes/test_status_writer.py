"""The status writer as tables: the merge patch a status change becomes, when a pod-count change is held back, and
what a write and a failure ask of the API server (:class:`kubetest.memory_api.MemoryApi`, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from kubetest.memory_api import MemoryApi
from kubetest.memory_api import merge_patch as apply_patch

from trainjob.backends.kubernetes.cache import CachedReads
from trainjob.backends.kubernetes.resources import TRAINJOBS
from trainjob.backends.kubernetes.status_writer import STATUS_SETTLE_SECONDS, StatusWriter, merge_patch

NOW = 1_800_000_000.0
RUNNING = {"jobsStatus": [{"name": "node", "active": 1}]}
BOTH_ACTIVE = {"jobsStatus": [{"name": "node", "active": 2}]}
FAILED = {"type": "Failed", "status": "True", "reason": "JobSetFailed", "message": "m", "lastTransitionTime": "t"}
REPORT = {"progressPercentage": 20, "metrics": [{"name": "loss", "value": "1.5"}], "lastUpdatedTime": "t1"}

PATCHES = [
    # (id, old, new, patch)
    ("nothing-changed", RUNNING, RUNNING, {}),
    ("a-field-changed", RUNNING, BOTH_ACTIVE, BOTH_ACTIVE),
    ("a-field-added", RUNNING, {**RUNNING, "conditions": [FAILED]}, {"conditions": [FAILED]}),
    ("a-field-gone-is-null", {**RUNNING, "conditions": [FAILED]}, RUNNING, {"conditions": None}),
    ("an-object-replaced-nulls-what-it-no-longer-has", {"trainerStatus": REPORT},
     {"trainerStatus": {"progressPercentage": 30, "lastUpdatedTime": "t2"}},
     {"trainerStatus": {"metrics": None, "progressPercentage": 30, "lastUpdatedTime": "t2"}}),
    ("an-object-that-was-not-one-is-set-whole", {"trainerStatus": None}, {"trainerStatus": REPORT},
     {"trainerStatus": REPORT}),
    ("everything-gone", {**RUNNING, "trainerStatus": REPORT}, {}, {"jobsStatus": None, "trainerStatus": None}),
]


@pytest.mark.parametrize(("old", "new", "patch"), [case[1:] for case in PATCHES], ids=[case[0] for case in PATCHES])
def test_merge_patch_is_what_changed_and_applies_to_the_new_status(old: dict, new: dict, patch: dict) -> None:
    assert merge_patch(old, new) == patch
    assert apply_patch(old, merge_patch(old, new)) == new


SETTLING = [
    # (id, seconds since the last write (None: never written; "created S": since the JobSet's create), old, new,
    #  seconds to wait (None: write now))
    ("never-written-writes-now", None, RUNNING, BOTH_ACTIVE, None),
    ("pod-counts-just-after-a-write-wait", 0.25, RUNNING, BOTH_ACTIVE, STATUS_SETTLE_SECONDS - 0.25),
    ("pod-counts-once-settled-write-now", STATUS_SETTLE_SECONDS, RUNNING, BOTH_ACTIVE, None),
    ("a-condition-is-never-held-back", 0.25, RUNNING, {**BOTH_ACTIVE, "conditions": [FAILED]}, None),
    ("a-report-is-never-held-back", 0.25, RUNNING, {**BOTH_ACTIVE, "trainerStatus": REPORT}, None),
    ("no-change-has-nothing-to-wait-for", 0.25, RUNNING, RUNNING, None),
    ("pod-counts-just-after-the-jobset-was-created-wait", "created 0.25", {}, RUNNING, STATUS_SETTLE_SECONDS - 0.25),
    ("pod-counts-once-the-new-jobset-settled-write-now", f"created {STATUS_SETTLE_SECONDS}", {}, RUNNING, None),
]


@pytest.mark.parametrize(("since", "old", "new", "wait"), [case[1:] for case in SETTLING],
                         ids=[case[0] for case in SETTLING])
def test_settling_holds_back_only_pod_counts_just_after_a_write(since: float | str | None, old: dict, new: dict,
                                                                 wait: float | None) -> None:
    clock = [NOW]
    api = MemoryApi(lambda: clock[0])
    api.seed({"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
              "metadata": {"name": "mnist", "namespace": "ml"}, "status": old})
    writer = StatusWriter(api, CachedReads(api), clock=lambda: clock[0])
    if isinstance(since, str):  # "created S": the job's JobSet was created S seconds ago, no status written
        writer.jobset_created("ml", "mnist")
        clock[0] += float(since.split()[1])
    elif since is not None:
        writer.write("ml", "mnist", {}, old)
        clock[0] += since
    assert writer.settling("ml", "mnist", old, new, clock[0]) == wait


def _writer_over(status: dict[str, Any]) -> tuple[MemoryApi, StatusWriter, dict[str, Any]]:
    api = MemoryApi(lambda: NOW)
    job = api.seed({"apiVersion": TRAINJOBS.api_version, "kind": TRAINJOBS.kind,
                    "metadata": {"name": "mnist", "namespace": "ml"}, "status": status})
    return api, StatusWriter(api, CachedReads(api), clock=lambda: NOW), job


NOTHING_COUNTED = {"jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 0}]}
SUSPENDED_COUNTED = {"jobsStatus": [{"name": "node", "active": 0, "suspended": 1}]}
PATCH = [("patch", "trainjobs/status", "ml/mnist")]


@pytest.mark.parametrize(("old", "new", "requests"), [
    (RUNNING, RUNNING, []),
    (RUNNING, BOTH_ACTIVE, PATCH),
    ({}, NOTHING_COUNTED, []),
    ({}, SUSPENDED_COUNTED, PATCH),
    (NOTHING_COUNTED, RUNNING, PATCH),
    (RUNNING, NOTHING_COUNTED, PATCH),
    ({}, {**NOTHING_COUNTED, "conditions": [FAILED]}, PATCH),
], ids=["equal-writes-nothing", "a-change-is-one-status-patch", "a-new-jobsets-zero-counts-write-nothing",
        "a-suspended-count-is-written", "the-first-count-is-written", "counts-back-to-zero-are-written",
        "zero-counts-with-a-condition-are-written"])
def test_write_patches_the_status_subresource_once_per_change(old: dict, new: dict, requests: list) -> None:
    api, writer, _ = _writer_over(old)
    writer.write("ml", "mnist", old, new)
    assert api.requests == requests
    stored = api.stored(TRAINJOBS, "ml", "mnist")
    assert stored is not None and stored["status"] == (new if requests else old)


def test_fail_writes_failed_with_the_reason_and_posts_it_as_a_warning() -> None:
    api, writer, job = _writer_over(RUNNING)
    writer.fail(job, RUNNING, "InvalidTrainJob", "spec.trainer.numNodes: must be >= 1, got 0", NOW)
    stored = api.stored(TRAINJOBS, "ml", "mnist")
    assert stored is not None
    [failed] = stored["status"]["conditions"]
    assert (failed["type"], failed["status"], failed["reason"]) == ("Failed", "True", "InvalidTrainJob")
    assert [(e["type"], e["reason"], e["message"]) for e in api.events] == [
        ("Warning", "InvalidTrainJob", "spec.trainer.numNodes: must be >= 1, got 0")]
    assert api.requests == [("patch", "trainjobs/status", "ml/mnist"), ("create", "events", "ml/mnist")]
