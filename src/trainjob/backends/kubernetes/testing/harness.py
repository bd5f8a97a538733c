"""A test harness around the API stand-in: a kubeconfig for it, the operator in a thread, controller stand-ins.

The stand-in runs no controllers, so :class:`Cluster` plays the JobSet controller (``set_jobset_status``); the
operator is the real one, started as ``trainjob operator`` starts it::

    with StandInServer() as server:
        cluster = Cluster(server, write_kubeconfig(tmp / "kubeconfig", server.url))
        cluster.operator.start()
        cluster.create_job("mnist", trainer={"numNodes": 2})
        wait_for(lambda: cluster.jobset("mnist"), what="the JobSet")
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trainjob.backends.kubernetes.config import KubernetesBackendConfig, load_api_client
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.manifests import builtin_runtimes
from trainjob.backends.kubernetes.operator import operate
from trainjob.backends.kubernetes.resources import CLUSTER_TRAINING_RUNTIMES, JOBSETS, TRAINJOBS
from trainjob.backends.kubernetes.status import find_condition
from trainjob.backends.kubernetes.testing.server import StandInServer
from trainjob.backends.testing import wait_until


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "tester", "user": {"token": "not-checked"}}],
        "contexts": [
            {"name": "standin", "context": {"cluster": "standin", "user": "tester", "namespace": namespace}}
        ],
        "current-context": "standin",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorThread:
    """The operator, as ``trainjob operator`` runs it, in a background thread; stoppable and restartable."""

    def __init__(self, config: KubernetesBackendConfig, server: StandInServer) -> None:
        self.config = config
        self.server = server
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.failure: BaseException | None = None

    def start(self) -> None:
        """Start it and return once it watches TrainJobs and JobSets (as a started operator does)."""
        self._stop = threading.Event()
        seen = self.server.call(len)
        ready = threading.Event()

        def run() -> None:
            try:
                asyncio.run(operate(self.config, workers=2, stop_flag=self._stop, ready_flag=ready))
            except BaseException as exc:
                self.failure = exc
                ready.set()

        self._thread = threading.Thread(target=run, name="trainjob-operator", daemon=True)
        self._thread.start()
        assert ready.wait(20), "the operator did not become ready"
        assert self.failure is None, f"the operator failed to start: {self.failure!r}"

        def watching() -> bool:
            requests = self.server.call(lambda api: list(api)[seen:])
            watched = {r.resource.plural for r in requests if r.params.get("watch") == "true" and r.resource}
            return {TRAINJOBS.plural, JOBSETS.plural} <= watched

        wait_for(watching, 20, "the operator to watch TrainJobs and JobSets")

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(20)
            assert not self._thread.is_alive(), "the operator did not stop"
            self._thread = None


class Cluster:
    """The stand-in API plus helpers that play the controllers the stand-in does not run."""

    def __init__(self, server: StandInServer, kubeconfig: Path) -> None:
        self.server = server
        self.kubeconfig = kubeconfig
        self.config = KubernetesBackendConfig(config_file=str(kubeconfig))
        self.api = KubeApi(load_api_client(self.config))
        self.operator = OperatorThread(self.config, server)

    def install_builtin_runtimes(self) -> None:
        for runtime in builtin_runtimes():
            self.api.create(runtime, CLUSTER_TRAINING_RUNTIMES)

    def create_job(self, name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": TRAINJOBS.api_version,
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
        }
        return self.api.create(body, TRAINJOBS)

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        job = self.api.get(TRAINJOBS, namespace, name)
        assert job is not None, f"TrainJob {namespace}/{name} is gone"
        return job

    def jobset(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.api.get(JOBSETS, namespace, name)

    def set_jobset_status(self, name: str, status: dict[str, Any], namespace: str = "default") -> None:
        """Play the JobSet controller."""
        self.api.patch_status(JOBSETS, namespace, name, status)

    def start_pod(self, job: str, index: int, namespace: str = "default") -> str:
        """Play the JobSet controller: create node ``index``'s pod (Pending); returns its name."""
        pod = trainer_pod(job, index, namespace)
        self.api.core.create_namespaced_pod(namespace, pod)
        return str(pod["metadata"]["name"])

    def set_pod_phase(self, pod: str, phase: str, namespace: str = "default") -> None:
        """Play the kubelet."""
        self.api.core.patch_namespaced_pod_status(pod, namespace, {"status": {"phase": phase}})

    def write_log(self, pod: str, text: str, namespace: str = "default") -> None:
        """Play the container runtime: append ``text`` to the pod's log."""

        def append(api: Any) -> None:
            api.pod_logs[(namespace, pod)] = api.pod_logs.get((namespace, pod), "") + text

        self.server.call(append)

    def operator_requests(self) -> list[Any]:
        """Every request the operator's own client sent (kopf's watch traffic excluded)."""
        return [
            r
            for r in self.server.call(lambda api: list(api))
            if "trainjob-operator" in r.headers.get("User-Agent", "")
        ]


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "the condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test naming ``what`` on timeout."""
    return wait_until(predicate, timeout, what=what)


def condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return find_condition(job.get("status") or {}, type_)


def has_condition(job: dict[str, Any], type_: str, value: str = "True") -> bool:
    cond = condition(job, type_)
    return cond is not None and cond["status"] == value


def wait_for_condition(
    cluster: Cluster,
    name: str,
    type_: str,
    value: str = "True",
    namespace: str = "default",
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Wait until TrainJob ``name`` has condition ``type_`` with ``value``; returns the job."""

    def check() -> dict[str, Any] | None:
        job = cluster.job(name, namespace)
        return job if has_condition(job, type_, value) else None

    return wait_for(check, timeout, f"TrainJob {namespace}/{name} to have {type_}={value}")


def trainer_pod(job: str, index: int, namespace: str = "default") -> dict[str, Any]:
    """The pod a JobSet controller creates for node ``index`` of ``job`` (labels as JobSet and Job set them)."""
    from trainjob.backends.kubernetes.resources import (
        COMPLETION_INDEX_LABEL,
        JOB_NAME_LABEL,
        REPLICATED_JOB_LABEL,
    )

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-node-0-{index}-{uuid.uuid4().hex[:5]}",
            "namespace": namespace,
            "labels": {JOB_NAME_LABEL: job, REPLICATED_JOB_LABEL: "node", COMPLETION_INDEX_LABEL: str(index)},
            "annotations": {COMPLETION_INDEX_LABEL: str(index)},
        },
        "spec": {
            "hostname": f"{job}-node-0-{index}",
            "subdomain": job,
            "containers": [{"name": "node", "image": "x"}],
        },
        "status": {"phase": "Pending"},
    }


def jobset_condition(type_: str, reason: str, message: str) -> dict[str, Any]:
    """A JobSet status condition as the JobSet controller writes it (``Completed``, ``Failed`` ...)."""
    return {
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
