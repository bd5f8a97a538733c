"""The TrainJob operator: kopf watches TrainJobs and JobSets, a work queue feeds :class:`Reconciler`; PyTorchJobs
(``kubeflow.org/v1``) and their pods feed :class:`~.pytorchjob.PyTorchJobReconciler` through a second queue, when
their CRD is the one ``trainjob install`` put there (not the Training Operator's).

Watch events keep the operator's cache (:mod:`.cache`: TrainJobs, JobSets, runtimes) and put the job's key into
the queue; the reconciler reads the current state from that cache and converges it, so missed or repeated events
do no harm, a pass asks the API server only to write, and a restarted operator picks every job up again from the
initial listing. Failed passes are retried with backoff; jobs with a deadline are queued again for it::

    from trainjob.backends.kubernetes import KubernetesBackendConfig
    from trainjob.backends.kubernetes.operator import run_operator

    run_operator(KubernetesBackendConfig(), workers=4, liveness="http://0.0.0.0:8080/healthz")

``trainjob operator`` runs it from the command line; deploy/ runs that command in the cluster.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import kopf

from trainjob import __version__
from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.config import KubernetesBackendConfig, load_api_client
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.pytorchjob import (
    OPERATOR_NAME,
    OPERATOR_NAME_LABEL,
    PyTorchJobReconciler,
    owns_crd,
)
from trainjob.backends.kubernetes.reconcile import Reconciler
from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOB_NAME_LABEL,
    JOBSETS,
    PYTORCHJOBS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.snapshot import SnapshotSigner, load_or_create_key
from trainjob.backends.kubernetes.workqueue import WorkQueue

log = logging.getLogger("trainjob.operator")

USER_AGENT = f"trainjob-operator/{__version__}"


@dataclass
class OperatorState:
    """What the handlers share (kopf passes it to every handler as ``memo``)."""

    api: KubeApi
    reconciler: Reconciler
    cache: ObjectCache = field(default_factory=ObjectCache)
    queue: WorkQueue = field(default_factory=WorkQueue)
    workers: int = 4
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: ``None`` when PyTorchJobs are another controller's (their CRD was not installed by trainjob).
    pytorchjobs: PyTorchJobReconciler | None = None
    pytorchjob_queue: WorkQueue = field(default_factory=WorkQueue)


# -- handlers: plain functions, registered in make_registry() --------------------------------------------------------


async def start_workers(memo: OperatorState, **_: Any) -> None:
    """On startup: run the queue's workers; each reconcile runs in a thread (the client is synchronous)."""

    async def handle(key: Any) -> float | None:
        namespace, name = key
        return await asyncio.to_thread(memo.reconciler.reconcile, namespace, name)

    memo.tasks.append(
        asyncio.create_task(memo.queue.run_workers(handle, memo.workers), name="trainjob-workers")
    )
    pytorchjobs = memo.pytorchjobs
    if pytorchjobs is not None:

        async def handle_pytorchjob(key: Any) -> float | None:
            namespace, name = key
            return await asyncio.to_thread(pytorchjobs.reconcile, namespace, name)

        memo.tasks.append(asyncio.create_task(
            memo.pytorchjob_queue.run_workers(handle_pytorchjob, memo.workers), name="pytorchjob-workers"))


async def stop_workers(memo: OperatorState, **_: Any) -> None:
    for task in memo.tasks:
        task.cancel()
    await asyncio.gather(*memo.tasks, return_exceptions=True)
    memo.tasks.clear()


def _cache(memo: OperatorState, ref: Any, event: dict[str, Any]) -> None:
    obj = event.get("object")
    if isinstance(obj, dict):
        memo.cache.observe(ref, obj, deleted=event.get("type") == "DELETED")


async def enqueue_trainjob(body: kopf.Body, event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    """Any event about a TrainJob (including the initial listing after a restart) is cached and queues it."""
    _cache(memo, TRAINJOBS, event)
    memo.queue.add((body.metadata.namespace, body.metadata.name))


async def cache_cluster_runtime(event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    _cache(memo, CLUSTER_TRAINING_RUNTIMES, event)


async def cache_runtime(event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    _cache(memo, TRAINING_RUNTIMES, event)


async def enqueue_jobset_owner(body: kopf.Body, event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    """A JobSet changed (status from the JobSet controller, deletion): cache it, queue the TrainJob that owns it."""
    _cache(memo, JOBSETS, event)
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == TRAINJOBS.kind and ref.get("apiVersion") == TRAINJOBS.api_version:
            memo.queue.add((body.metadata.namespace, ref["name"]))


async def enqueue_pytorchjob(body: kopf.Body, memo: OperatorState, **_: Any) -> None:
    """Any event about a PyTorchJob queues it."""
    memo.pytorchjob_queue.add((body.metadata.namespace, body.metadata.name))


async def enqueue_pod_owner(body: kopf.Body, memo: OperatorState, **_: Any) -> None:
    """A PyTorchJob's pod changed (the kubelet's status, deletion): queue the PyTorchJob that owns it."""
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == PYTORCHJOBS.kind and ref.get("apiVersion") == PYTORCHJOBS.api_version:
            memo.pytorchjob_queue.add((body.metadata.namespace, ref["name"]))


def login(memo: OperatorState, **_: Any) -> kopf.ConnectionInfo:
    """Give kopf the same credentials as the reconciler's client (kubeconfig, context or in-cluster)."""
    cfg = memo.api.client.configuration
    if cfg.refresh_api_key_hook is not None:
        cfg.refresh_api_key_hook(cfg)
    auth = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken") or ""
    token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else (auth or None)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


def queue_depth(memo: OperatorState, **_: Any) -> int:
    """Liveness probe detail: how many jobs wait for a reconcile."""
    return len(memo.queue)


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    # The watched resources are known; no need to follow CRDs and namespaces (and no RBAC for them).
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60


def make_registry(pytorchjobs: bool = False) -> kopf.OperatorRegistry:
    """A fresh registry with the operator's handlers (one per operator run, so runs do not share state);
    ``pytorchjobs``: also PyTorchJobs and their pods."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(registry=registry)(start_workers)
    kopf.on.cleanup(registry=registry)(stop_workers)
    kopf.on.login(registry=registry)(login)
    kopf.on.probe(id="queue", registry=registry)(queue_depth)
    kopf.on.event(TRAINJOBS.group, TRAINJOBS.version, TRAINJOBS.plural, registry=registry)(enqueue_trainjob)
    kopf.on.event(
        JOBSETS.group,
        JOBSETS.version,
        JOBSETS.plural,
        labels={JOB_NAME_LABEL: kopf.PRESENT},
        registry=registry,
    )(enqueue_jobset_owner)
    for runtime, handler in ((CLUSTER_TRAINING_RUNTIMES, cache_cluster_runtime), (TRAINING_RUNTIMES, cache_runtime)):
        kopf.on.event(runtime.group, runtime.version, runtime.plural, registry=registry)(handler)
    if pytorchjobs:
        kopf.on.event(PYTORCHJOBS.group, PYTORCHJOBS.version, PYTORCHJOBS.plural, registry=registry)(
            enqueue_pytorchjob)
        kopf.on.event("", "v1", "pods", labels={OPERATOR_NAME_LABEL: OPERATOR_NAME}, registry=registry)(
            enqueue_pod_owner)
    return registry


async def operate(
    config: KubernetesBackendConfig,
    *,
    workers: int = 4,
    namespaces: Collection[str] = (),
    liveness: str | None = None,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
    key_namespace: str | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or the task is cancelled).

    ``key_namespace`` holds the Secret with the key that signs runtime snapshots (:mod:`.snapshot`): the
    operator's own namespace in a pod, else ``trainjob-system``."""
    api = KubeApi(load_api_client(config, user_agent=USER_AGENT))
    key = await asyncio.to_thread(load_or_create_key, api, key_namespace or operator_namespace())
    cache = ObjectCache()
    state = OperatorState(api=api, reconciler=Reconciler(api, SnapshotSigner(key), cache=cache), cache=cache,
                          workers=workers)
    if await asyncio.to_thread(owns_crd, api, f"{PYTORCHJOBS.plural}.{PYTORCHJOBS.group}"):
        state.pytorchjobs = PyTorchJobReconciler(api)
    else:
        log.info("not reconciling PyTorchJobs: their CRD is absent or another controller's")
    try:
        await kopf.operator(
            registry=make_registry(pytorchjobs=state.pytorchjobs is not None),
            memo=state,
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        api.client.close()


def operator_namespace() -> str:
    """The namespace the operator runs in: its pod's, else the one ``trainjob install`` uses."""
    from trainjob.backends.kubernetes.manifests import NAMESPACE

    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or NAMESPACE
    except OSError:
        return NAMESPACE


def run_operator(config: KubernetesBackendConfig, **options: Any) -> None:
    """Blocking form of :func:`operate` (what ``trainjob operator`` calls)."""
    asyncio.run(operate(config, **options))
