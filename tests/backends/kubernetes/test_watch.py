"""The operator's watches on a real API server: the listing, the events after it, a relisting that delivers what was
deleted meanwhile, and a stop that ends the thread at once; what an expired version's ERROR event does; pods listed
as printed rows, by pages."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster
from kubetest.memory_api import printed_status

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


def waiting(name: str, reason: str, message: str = "", restarts: int = 0) -> dict[str, Any]:
    """A container status as a kubelet writes it: waiting for ``reason``."""
    return {"name": name, "image": "i", "imageID": "", "ready": False, "restartCount": restarts,
            "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}


#: Pod statuses as a kubelet writes them, and the STATUS ``kubectl get pods`` shows for each.
PRINTED = [
    ({"phase": "Pending"}, "Pending"),
    ({"phase": "Pending", "containerStatuses": [waiting("node", "ImagePullBackOff", "Back-off pulling image")]},
     "ImagePullBackOff"),
    ({"phase": "Pending", "initContainerStatuses": [waiting("init", "CrashLoopBackOff", restarts=3)],
      "containerStatuses": [waiting("node", "PodInitializing")]},
     "Init:CrashLoopBackOff"),
    ({"phase": "Pending", "initContainerStatuses": [waiting("init", "PodInitializing")],
      "containerStatuses": [waiting("node", "PodInitializing")]},
     "Init:0/1"),
    ({"phase": "Pending", "containerStatuses": [
        waiting("node", "CreateContainerConfigError", 'secret "hf" not found')]},
     "CreateContainerConfigError"),
]


def test_pods_come_as_printed_rows_by_pages(k8s: TrainJobCluster, namespace: str) -> None:
    """What the pod-start watch reads of a job of many nodes: the API server's printed rows (as ``kubectl get
    pods``), a page per request, every pod once; the STATUS it prints is what the in-memory API server prints
    (its tests rely on it)."""
    for index, (status, _) in enumerate(PRINTED):
        init = [{"name": "init", "image": "example.invalid/never:1"}] if "initContainerStatuses" in status else []
        k8s.api.create({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"p{index}", "namespace": namespace, "labels": {"job": "wide"}},
                        "spec": {"nodeName": "no-such-node",  # bound, but no kubelet runs it: the status is ours
                                 "initContainers": init,
                                 "containers": [{"name": "node", "image": "example.invalid/never:1"}]}}, PODS)
        assert k8s.api.patch_status(PODS, namespace, f"p{index}", status) is not None
    pages = list(k8s.api.table_in_pages(PODS, namespace, "job=wide", page=2))
    assert [[row["Name"] for row in page] for page in pages] == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    rows = [row for page in pages for row in page]
    assert [(row["Status"], row["Node"]) for row in rows] == [(printed, "no-such-node") for _, printed in PRINTED]
    assert [printed_status(k8s.api.read_pod(namespace, row["Name"]) or {}) for row in rows] == [
        printed for _, printed in PRINTED]
    assert list(k8s.api.table_in_pages(PODS, namespace, "job=wide", "spec.nodeName=")) == [[]]  # all on a node


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
