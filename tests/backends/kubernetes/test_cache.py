"""The operator's watch cache: newer resource versions win, deletions are final for the object deleted and kept
(bounded) for what they carried."""

from __future__ import annotations

from typing import Any

from trainjob.backends.kubernetes import cache as cache_module
from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.resources import CLUSTER_TRAINING_RUNTIMES, JOBSETS, PODS, TRAINJOBS


def obj(name: str, rv: str, uid: str = "u1", namespace: str | None = "ml", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv, "uid": uid}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, **extra}


def test_a_write_newer_than_a_late_watch_event_is_kept() -> None:
    cache = ObjectCache()
    cache.observe(TRAINJOBS, obj("a", "10", spec={"v": 1}))
    cache.store(TRAINJOBS, obj("a", "12", spec={"v": 2}))  # our patch's response
    cache.observe(TRAINJOBS, obj("a", "11", spec={"v": 1.5}))  # the watch catching up
    assert cache.get(TRAINJOBS, "ml", "a")["spec"] == {"v": 2}
    cache.observe(TRAINJOBS, obj("a", "13", spec={"v": 3}))
    assert cache.get(TRAINJOBS, "ml", "a")["spec"] == {"v": 3}


def test_kinds_namespaces_and_cluster_scope_are_apart() -> None:
    cache = ObjectCache()
    cache.observe(TRAINJOBS, obj("a", "1"))
    cache.observe(JOBSETS, obj("a", "2"))
    cache.observe(TRAINJOBS, obj("a", "3", namespace="other"))
    cache.observe(CLUSTER_TRAINING_RUNTIMES, obj("torch", "4", namespace=None))
    assert cache.get(JOBSETS, "ml", "a")["metadata"]["resourceVersion"] == "2"
    assert cache.get(TRAINJOBS, "other", "a")["metadata"]["resourceVersion"] == "3"
    assert cache.get(CLUSTER_TRAINING_RUNTIMES, "anything", "torch") is not None  # cluster-scoped
    assert [o["metadata"]["namespace"] for o in cache.list(TRAINJOBS, "ml")] == ["ml"]
    assert cache.count(TRAINJOBS) == 2
    assert cache.serves(TRAINJOBS) and not cache.serves(PODS)


def test_a_deleted_object_stays_gone_and_keeps_what_it_carried() -> None:
    cache = ObjectCache()
    cache.observe(JOBSETS, obj("a", "5", metadata_note="x"))
    cache.observe(JOBSETS, obj("a", "6"), deleted=True)
    assert cache.get(JOBSETS, "ml", "a") is None
    assert cache.last_deleted(JOBSETS, "ml", "a")["metadata"]["resourceVersion"] == "6"
    cache.observe(JOBSETS, obj("a", "5"))  # a late event about the deleted one
    assert cache.get(JOBSETS, "ml", "a") is None
    cache.observe(JOBSETS, obj("a", "9", uid="u2"))  # a new JobSet of that name
    assert cache.get(JOBSETS, "ml", "a")["metadata"]["uid"] == "u2"
    assert cache.last_deleted(JOBSETS, "ml", "a") is None


def test_deleted_objects_are_remembered_up_to_a_bound(monkeypatch: Any) -> None:
    monkeypatch.setattr(cache_module, "DELETED_KEPT", 3)
    cache = ObjectCache()
    for i in range(5):
        cache.observe(JOBSETS, obj(f"j{i}", str(i), uid=f"u{i}"), deleted=True)
    assert [cache.last_deleted(JOBSETS, "ml", f"j{i}") is not None for i in range(5)] == [False, False, True, True, True]


def test_managed_fields_are_not_kept_and_the_watched_object_is_not_changed() -> None:
    cache = ObjectCache()
    event = obj("a", "1", status={"ok": True})
    event["metadata"]["managedFields"] = [{"manager": "jobset", "fieldsV1": {"f:status": {}}}]
    cache.observe(JOBSETS, event)
    cache.store(TRAINJOBS, {**obj("a", "2"), "metadata": {**obj("a", "2")["metadata"], "managedFields": []}})
    assert cache.get(JOBSETS, "ml", "a") == obj("a", "1", status={"ok": True})
    assert "managedFields" not in cache.get(TRAINJOBS, "ml", "a")["metadata"]
    assert "managedFields" in event["metadata"]


def test_holds_is_true_for_the_very_version_cached_only() -> None:
    cache = ObjectCache()
    cache.store(TRAINJOBS, obj("a", "7"))  # our write's answer
    assert cache.holds(TRAINJOBS, obj("a", "7"))
    assert not cache.holds(TRAINJOBS, obj("a", "8"))
    assert not cache.holds(TRAINJOBS, obj("b", "7"))
    assert not cache.holds(JOBSETS, obj("a", "7"))
