"""The operator's watches on a real API server: the listing, the events after it, a relisting that delivers what was
deleted meanwhile, and a stop that ends the thread at once; what an expired version's ERROR event does; pods listed
by pages."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster

from trainjob.backends.kubernetes.resources import CONFIGMAPS, PODS
from trainjob.backends.kubernetes.watch import Gone, Watch


def configmap(namespace: str, name: str, app: str = "watched") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}}, "data": {"k": name}}


def next_event(events: queue.Queue[dict[str, Any]], timeout: float = 30) -> tuple[str | None, str]:
    event = events.get(timeout=timeout)
    return event["type"], event["object"]["metadata"]["name"]


def test_a_watch_lists_follows_and_stops(k8s: TrainJobCluster, namespace: str) -> None:
    for name in ("a", "b"):
        k8s.api.create(configmap(namespace, name), CONFIGMAPS)
    k8s.api.create(configmap(namespace, "other", app="not-watched"), CONFIGMAPS)
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    listed = threading.Event()
    watch = Watch(k8s.api, CONFIGMAPS, namespace, events.put, label_selector="app=watched", on_listed=listed.set)
    watch.start()
    try:
        assert listed.wait(30)
        first = [events.get(timeout=5) for _ in range(2)]
        # the listing: each object as a restarted operator sees it, whole (a listing's items carry no kind)
        assert sorted((e["type"], e["object"]["metadata"]["name"], e["object"]["kind"]) for e in first) == [
            (None, "a", "ConfigMap"), (None, "b", "ConfigMap")]
        k8s.api.create(configmap(namespace, "c"), CONFIGMAPS)
        assert next_event(events) == ("ADDED", "c")
        k8s.api.patch(CONFIGMAPS, namespace, "a", {"data": {"k": "changed"}})
        assert next_event(events) == ("MODIFIED", "a")
        k8s.api.delete(CONFIGMAPS, namespace, "b", propagation="Background")
        assert next_event(events) == ("DELETED", "b")
        k8s.api.create(configmap(namespace, "other-2", app="not-watched"), CONFIGMAPS)
        with pytest.raises(queue.Empty):  # filtered by the API server
            events.get(timeout=2)
    finally:
        started = time.monotonic()
        watch.stop()
    assert time.monotonic() - started < 5, "stop waited for the API server to end the watch"
    assert watch._thread is not None and not watch._thread.is_alive()


def test_a_relisting_delivers_what_was_deleted_while_nothing_watched(k8s: TrainJobCluster, namespace: str) -> None:
    for name in ("a", "b", "c"):
        k8s.api.create(configmap(namespace, name), CONFIGMAPS)
    events: list[dict[str, Any]] = []
    watch = Watch(k8s.api, CONFIGMAPS, namespace, events.append, label_selector="app=watched")
    watch._list()
    assert sorted(e["object"]["metadata"]["name"] for e in events) == ["a", "b", "c"]
    k8s.api.delete(CONFIGMAPS, namespace, "b", propagation="Background")
    events.clear()
    watch._list()
    assert [(e["type"], e["object"]["metadata"]) for e in events if e["type"] == "DELETED"] == [
        ("DELETED", {"name": "b", "namespace": namespace})]
    assert sorted(e["object"]["metadata"]["name"] for e in events if e["type"] is None) == ["a", "c"]


def test_pods_come_by_pages(k8s: TrainJobCluster, namespace: str) -> None:
    """What the pod-start watch reads of a job of many nodes: a page of pods per request, every pod once."""
    for index in range(5):
        k8s.api.create({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"p{index}", "namespace": namespace, "labels": {"job": "wide"}},
                        "spec": {"nodeSelector": {"no-such-node": "true"},  # never scheduled, never pulled
                                 "containers": [{"name": "node", "image": "example.invalid/never:1"}]}}, PODS)
    pages = list(k8s.api.pods_in_pages(namespace, "job=wide", page=2))
    assert [sorted(p["metadata"]["name"] for p in page) for page in pages] == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    assert list(k8s.api.pods_in_pages(namespace, "job=wide", "spec.nodeName!=")) == [[]]  # none on a node


def test_an_expired_version_asks_for_a_relisting() -> None:
    """A watch from a version the API server no longer keeps (the operator was away long) ends with an ``ERROR``
    event of code 410: the watch lists again. Another error ends the request with its message (retried)."""
    watch = Watch(None, CONFIGMAPS, "ml", lambda event: None)  # type: ignore[arg-type]  # no request is sent
    expired = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                                           "reason": "Expired", "message": "too old resource version: 5 (900)"}}
    with pytest.raises(Gone):
        watch._event(expired, "5")
    failed = {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcdserver: request timed out"}}
    with pytest.raises(RuntimeError, match="etcdserver: request timed out"):
        watch._event(failed, "5")
    assert watch._event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "77"}}}, "5") == "77"
