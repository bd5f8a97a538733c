"""The TrainJob operator: watches (:mod:`.watch`) follow TrainJobs and JobSets and a work queue feeds
:class:`Reconciler`; PyTorchJobs (``kubeflow.org/v1``) and their pods feed
:class:`~.pytorchjob.PyTorchJobReconciler` through a second queue, when their CRD is the one ``trainjob install``
put there (not the Training Operator's).

Watch events keep the operator's cache (:mod:`.cache`: TrainJobs, JobSets, runtimes) and put the job's key into
the queue (not for the echo of the operator's own write, whose answer the cache holds already); the reconciler
reads the current state from that cache and converges it, so missed or repeated events do no harm and a restarted operator picks every job up again from the initial listing (which requests a pass makes
besides its writes: :mod:`.reconcile`). Failed passes are retried with backoff; jobs with a deadline are queued
again for it::

    from trainjob.backends.kubernetes.operator import OperatorOptions, run_operator

    run_operator(OperatorOptions(workers=4, liveness="http://0.0.0.0:8080/healthz"))

``trainjob operator`` runs it from the command line; deploy/ runs that command in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from trainjob import __version__
from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.config import KubernetesBackendConfig
from trainjob.backends.kubernetes.health import HealthServer
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.leader import LeaderElector, LeadershipLost
from trainjob.backends.kubernetes.manifests import (
    LEADER_ENDPOINT_SLICE,
    LEASE_NAME,
    METRICS_PORT,
    NAME,
    STATUS_PORT,
)
from trainjob.backends.kubernetes.metrics import OperatorMetrics
from trainjob.backends.kubernetes.pytorchjob import (
    OPERATOR_NAME,
    OPERATOR_NAME_LABEL,
    PyTorchJobReconciler,
    owns_crd,
)
from trainjob.backends.kubernetes.reconcile import Reconciler
from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    ENDPOINT_SLICES,
    JOBS,
    JOBSET_NAME_LABEL,
    JOBSETS,
    NAMESPACES,
    PODS,
    PYTORCHJOBS,
    TRAINING_RUNTIMES,
    TRAINJOB_NAME_LABEL,
    TRAINJOBS,
    ResourceRef,
)
from trainjob.backends.kubernetes.rest import load_client
from trainjob.backends.kubernetes.snapshot import SnapshotSigner, load_or_create_key
from trainjob.backends.kubernetes.status_server import StatusEndpoint, StatusServer
from trainjob.backends.kubernetes.tls import load_or_create_serving_tls
from trainjob.backends.kubernetes.watch import Watches
from trainjob.backends.kubernetes.workqueue import WorkQueue
from trainjob.errors import TrainJobError

log = logging.getLogger("trainjob.operator")

USER_AGENT = f"trainjob-operator/{__version__}"


@dataclass
class OperatorState:
    """What the event handlers and the workers share."""

    api: KubeApi
    reconciler: Reconciler
    cache: ObjectCache = field(default_factory=ObjectCache)
    queue: WorkQueue = field(default_factory=WorkQueue)
    workers: int = 4
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    #: ``None`` when PyTorchJobs are another controller's (their CRD was not installed by trainjob).
    pytorchjobs: PyTorchJobReconciler | None = None
    pytorchjob_queue: WorkQueue = field(default_factory=WorkQueue)
    #: Kubeflow's status endpoint, where the jobs' pods push their progress (``None``: read from their logs).
    status_server: StatusServer | None = None
    metrics: OperatorMetrics | None = None


# -- what runs beside the watches --------------------------------------------------------------------------------


def start_workers(state: OperatorState) -> None:
    """Run the queue's workers; each reconcile runs in a thread (the client is synchronous)."""

    async def handle(key: Any) -> float | None:
        namespace, name = key
        return await _measured(state, TRAINJOBS.kind, state.queue, state.reconciler.reconcile, namespace, name)

    state.tasks.append(
        asyncio.create_task(state.queue.run_workers(handle, state.workers), name="trainjob-workers")
    )
    pytorchjobs = state.pytorchjobs
    if pytorchjobs is not None:

        async def handle_pytorchjob(key: Any) -> float | None:
            namespace, name = key
            return await _measured(state, PYTORCHJOBS.kind, state.pytorchjob_queue, pytorchjobs.reconcile,
                                   namespace, name)

        state.tasks.append(asyncio.create_task(
            state.pytorchjob_queue.run_workers(handle_pytorchjob, state.workers), name="pytorchjob-workers"))


async def warm_framework() -> None:
    """Build the runtime framework (its plugins, entry points of every installed distribution included: half a
    CPU-second) and the validators of the models a reconcile reads a job and its runtime into (built on first use:
    25 ms) before the watches start, not in the first job's reconcile."""
    from trainjob.runtime.framework import default_framework

    def warm() -> None:
        from trainjob.api import ClusterTrainingRuntime, TrainingRuntime, TrainJob

        default_framework()
        for model in (TrainJob, TrainingRuntime, ClusterTrainingRuntime):
            model.model_rebuild(force=True)

    await asyncio.to_thread(warm)


async def _measured(state: OperatorState, kind: str, queue: WorkQueue,
                    reconcile: Callable[[str, str], float | None], namespace: str, name: str) -> float | None:
    """One reconcile in a worker thread, its duration and result counted in the metrics."""
    metrics = state.metrics
    if metrics is None:
        return await asyncio.to_thread(reconcile, namespace, name)
    metrics.set_queue_depth(kind, len(queue))
    start = time.perf_counter()
    try:
        again = await asyncio.to_thread(reconcile, namespace, name)
    except Exception:
        metrics.observe_reconcile(kind, time.perf_counter() - start, "error")
        raise
    metrics.observe_reconcile(kind, time.perf_counter() - start, "success" if again is None else "requeue_after")
    return again


async def stop_workers(state: OperatorState) -> None:
    for task in state.tasks:
        task.cancel()
    await asyncio.gather(*state.tasks, return_exceptions=True)
    state.tasks.clear()


# -- event handlers: plain functions of the state and a watch event (:mod:`.watch`), run on the loop --------------


def _cache(state: OperatorState, ref: Any, event: dict[str, Any]) -> bool:
    """Keep what the event carries; ``False`` when it is news to no one: the cache holds that version already,
    the answer to our own write, which the pass that made it has seen."""
    obj = event.get("object")
    if not isinstance(obj, dict):
        return True
    if event.get("type") == "MODIFIED" and state.cache.holds(ref, obj):
        return False
    state.cache.observe(ref, obj, deleted=event.get("type") == "DELETED")
    return True


def _key_of(event: dict[str, Any]) -> tuple[str, str]:
    meta = (event.get("object") or {}).get("metadata") or {}
    return meta.get("namespace") or "", str(meta.get("name"))


def _owners(event: dict[str, Any], ref: Any) -> list[str]:
    """The names of the ``ref`` objects that own the event's object."""
    meta = (event.get("object") or {}).get("metadata") or {}
    return [owner["name"] for owner in meta.get("ownerReferences") or []
            if owner.get("kind") == ref.kind and owner.get("apiVersion") == ref.api_version]


def enqueue_trainjob(state: OperatorState, event: dict[str, Any]) -> None:
    """Any event about a TrainJob (including the initial listing after a restart) is cached and queues it, but for
    the echo of the operator's own status write."""
    if not _cache(state, TRAINJOBS, event):
        return
    state.queue.add(_key_of(event))
    if state.metrics is not None:
        state.metrics.set_queue_depth(TRAINJOBS.kind, len(state.queue))


def cache_cluster_runtime(state: OperatorState, event: dict[str, Any]) -> None:
    _cache(state, CLUSTER_TRAINING_RUNTIMES, event)


def cache_runtime(state: OperatorState, event: dict[str, Any]) -> None:
    _cache(state, TRAINING_RUNTIMES, event)


def enqueue_jobset_owner(state: OperatorState, event: dict[str, Any]) -> None:
    """A JobSet changed (status from the JobSet controller, deletion): cache it, queue the TrainJob that owns it
    (not for the echo of the operator's own write)."""
    if not _cache(state, JOBSETS, event):
        return
    namespace = _key_of(event)[0]
    for owner in _owners(event, TRAINJOBS):
        state.queue.add((namespace, owner))


def cache_child_job(state: OperatorState, event: dict[str, Any]) -> None:
    """A JobSet's child Job changed (its pod counts): cached for the pod-start watch, which reads them when the
    job's next look is due. A pass is queued only when more of its pods are being deleted than before (its
    ``terminating``): a pod evicted, preempted or lost may have to take its group down with it at once
    (:mod:`.disruptions`)."""
    obj = event.get("object")
    namespace, name = _key_of(event)
    before = state.cache.get(JOBS, namespace, name) or {}
    if not _cache(state, JOBS, event) or event.get("type") == "DELETED" or not isinstance(obj, dict):
        return
    terminating = int((obj.get("status") or {}).get("terminating") or 0)
    if terminating > int((before.get("status") or {}).get("terminating") or 0):
        jobset = ((obj.get("metadata") or {}).get("labels") or {}).get(JOBSET_NAME_LABEL)
        if jobset:
            state.queue.add((namespace, str(jobset)))


def enqueue_pytorchjob(state: OperatorState, event: dict[str, Any]) -> None:
    """Any event about a PyTorchJob queues it."""
    state.pytorchjob_queue.add(_key_of(event))


def enqueue_pod_owner(state: OperatorState, event: dict[str, Any]) -> None:
    """A PyTorchJob's pod changed (the kubelet's status, deletion): queue the PyTorchJob that owns it."""
    namespace = _key_of(event)[0]
    for owner in _owners(event, PYTORCHJOBS):
        state.pytorchjob_queue.add((namespace, owner))


#: A watch's handler: what the event means to the operator (its cache, its queues).
EventHandler = Callable[[OperatorState, dict[str, Any]], None]

#: What the operator watches: the kind, the API server's label selector (the operator never receives the other
#: pods and JobSets of the cluster: on 1,000 KWOK nodes, decoding them was most of its CPU), and the handler.
#: PyTorchJobs and their pods only where trainjob's operator reconciles them.
TRAINJOB_WATCHES: tuple[tuple[ResourceRef, str, EventHandler], ...] = (
    (TRAINJOBS, "", enqueue_trainjob),
    (JOBSETS, TRAINJOB_NAME_LABEL, enqueue_jobset_owner),
    (CLUSTER_TRAINING_RUNTIMES, "", cache_cluster_runtime),
    (TRAINING_RUNTIMES, "", cache_runtime),
    (JOBS, JOBSET_NAME_LABEL, cache_child_job),
)
PYTORCHJOB_WATCHES: tuple[tuple[ResourceRef, str, EventHandler], ...] = (
    (PYTORCHJOBS, "", enqueue_pytorchjob),
    (PODS, f"{OPERATOR_NAME_LABEL}={OPERATOR_NAME}", enqueue_pod_owner),
)


def make_watches(state: OperatorState, loop: asyncio.AbstractEventLoop, namespaces: Collection[str] = ()) -> Watches:
    """The operator's watches over ``state.api``: each kind of :data:`TRAINJOB_WATCHES` (and of
    :data:`PYTORCHJOB_WATCHES` when ``state.pytorchjobs``), in every namespace or in each of ``namespaces``
    (cluster-scoped kinds everywhere)."""
    watches = Watches(state.api, loop)
    kinds = TRAINJOB_WATCHES + (PYTORCHJOB_WATCHES if state.pytorchjobs is not None else ())
    for ref, selector, handler in kinds:
        for namespace in (list(namespaces) or [None]) if ref.namespaced else [None]:
            watches.add(ref, namespace, functools.partial(handler, state), label_selector=selector)
    return watches


@dataclass(frozen=True)
class OperatorOptions:
    """How :func:`operate` runs: one field per ``trainjob operator`` flag (named as its options), and what only a
    caller in Python sets (``stop_flag``, ``ready_flag``, ``key_namespace``, the hosts servers bind).

    ``key_namespace`` holds the Secret with the key that signs runtime snapshots (:mod:`.snapshot`), the status
    endpoint's TLS (:mod:`.tls`) and the leader Lease: the operator's own namespace in a pod, else
    ``trainjob-system``. ``status_url``: where the jobs' pods reach this operator's status endpoint
    (``https://host:port``), served on ``status_host:status_port``; without it the operator reads progress from node
    0's log instead. ``leader_elect``: reconcile only while holding the Lease (:mod:`.leader`) with
    ``lease_duration``, ``renew_deadline`` and ``retry_period``; a replica that loses it raises
    :class:`~.leader.LeadershipLost` (so its process exits and restarts as a follower). ``metrics_port``: serve
    Prometheus metrics (:mod:`.metrics`) on ``/metrics`` there."""

    #: The cluster to reach (kubeconfig, context or in-cluster).
    config: KubernetesBackendConfig = field(default_factory=KubernetesBackendConfig)
    #: Concurrent reconciles.
    workers: int = 4
    #: The namespaces watched; empty: all.
    namespaces: Collection[str] = ()
    #: Where health probes are served, e.g. ``http://0.0.0.0:8080/healthz``.
    liveness: str | None = None
    #: Stops the operator when set (else it runs until its task is cancelled).
    stop_flag: threading.Event | asyncio.Event | None = None
    #: Set once the operator watches.
    ready_flag: threading.Event | asyncio.Event | None = None
    key_namespace: str | None = None
    status_url: str | None = None
    status_port: int = 8443
    status_host: str = "0.0.0.0"
    leader_elect: bool = False
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"


def _namespace_object(api: KubeApi, name: str) -> dict[str, Any] | None:
    """Namespace ``name`` (the operator's: it owns the ConfigMaps of the status endpoint's CA), ``None`` when it
    cannot be read (they are then made without an owner)."""
    try:
        return api.get(NAMESPACES, None, name)
    except TrainJobError as exc:
        log.warning("cannot read Namespace %s, which owns the status endpoint's CA ConfigMaps: %s (they are made "
                    "without an owner, and outlive the operator's namespace)", name, exc)
        return None


async def operate(options: OperatorOptions) -> None:
    """Run the operator as ``options`` say until their ``stop_flag`` is set (or the task is cancelled)."""
    o = options
    metrics = OperatorMetrics()
    if o.metrics_port is not None:
        metrics.serve(o.metrics_host, o.metrics_port)
    api = KubeApi(metrics.instrument(load_client(o.config, user_agent=USER_AGENT)))
    home = o.key_namespace or operator_namespace()
    key = await asyncio.to_thread(load_or_create_key, api, home)
    cache = ObjectCache()
    metrics.job_counts = lambda: jobs_by_state(cache)
    queue = WorkQueue(on_take=lambda _key, waited: metrics.observe_queue_wait(TRAINJOBS.kind, waited))
    endpoint = server = None
    if o.status_url:
        tls = await asyncio.to_thread(load_or_create_serving_tls, api, home, status_hosts(o.status_url, home))
        endpoint = StatusEndpoint(o.status_url, tls.ca_pem, await asyncio.to_thread(_namespace_object, api, home))
        server = StatusServer(api, cache, tls, host=o.status_host, port=o.status_port,
                              on_report=lambda result: metrics.observe_status_report(result == "accepted"),
                              on_written=lambda namespace, name: queue.add((namespace, name)),
                              on_collectives=lambda namespace, name: queue.add((namespace, name)))
    state = OperatorState(
        api=api, reconciler=Reconciler(api, SnapshotSigner(key), cache=cache, status_endpoint=endpoint,
                                       pending_progress=server.pending_report if server is not None else None,
                                       collective_reports=server),
        cache=cache, workers=o.workers, status_server=server, metrics=metrics,
        queue=queue,
        pytorchjob_queue=WorkQueue(on_take=lambda _key, waited: metrics.observe_queue_wait(PYTORCHJOBS.kind, waited)))
    if await asyncio.to_thread(owns_crd, api, f"{PYTORCHJOBS.plural}.{PYTORCHJOBS.group}"):
        state.pytorchjobs = PyTorchJobReconciler(api)
    else:
        log.info("not reconciling PyTorchJobs: their CRD is absent or another controller's")
    elector = None
    try:
        if o.leader_elect:
            elector = LeaderElector(api, home, LEASE_NAME, lease_duration=o.lease_duration,
                                    renew_deadline=o.renew_deadline, retry_period=o.retry_period)
            with health_server(o.liveness, lambda: {"standby": True}):
                await elector.acquire()
            await asyncio.to_thread(publish_leader, api, home, True)
            metrics.set_leader(True)
            log.info("leading as %s", elector.identity)
        run = serve(state, o)
        if elector is None:
            await run
        else:
            await _while_leading(elector, run)
    finally:
        if elector is not None:
            metrics.set_leader(False)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(publish_leader, api, home, False)
            with contextlib.suppress(Exception):
                await elector.release()
        api.close()
        metrics.close()


async def serve(state: OperatorState, options: OperatorOptions) -> None:
    """Reconcile until ``options.stop_flag`` is set, SIGINT or SIGTERM arrives (in the main thread), or the task is
    cancelled: the runtime framework built, the workers and the status endpoint started, then the watches; ready
    (``options.ready_flag``) once every watch has delivered its first listing. Stopping ends the watches first, then
    the workers (a reconcile in progress finishes in its thread), then the status endpoint (its pending reports
    written)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = _stop_on_signals(loop, stop)
    watches = make_watches(state, loop, options.namespaces)
    try:
        with health_server(options.liveness, lambda: {"queue": len(state.queue)}):
            await warm_framework()
            start_workers(state)
            if state.status_server is not None:
                await state.status_server.start()
            watches.start()
            log.info("%d watches%s", len(watches),
                     f" in {', '.join(options.namespaces)}" if options.namespaces else " in every namespace")
            waiting = asyncio.create_task(_stopped(stop, options.stop_flag))
            listed = asyncio.create_task(watches.listed())
            try:
                await asyncio.wait({waiting, listed}, return_when=asyncio.FIRST_COMPLETED)
                if listed.done() and options.ready_flag is not None:
                    options.ready_flag.set()
                await waiting
            finally:
                for task in (waiting, listed):
                    task.cancel()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        await asyncio.to_thread(watches.stop)
        await stop_workers(state)
        if state.status_server is not None:
            await state.status_server.stop()


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> list[int]:
    """SIGINT and SIGTERM (the kubelet stopping the pod) set ``stop``, where the loop runs in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return []
    signals = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
            signals.append(signum)
    return signals


async def _stopped(stop: asyncio.Event, flag: threading.Event | asyncio.Event | None) -> None:
    """Until ``stop`` or ``flag`` is set."""
    while not stop.is_set():
        if flag is not None and flag.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2 if flag is not None else None)


@contextlib.contextmanager
def health_server(liveness: str | None, report: Callable[[], dict[str, Any]]) -> Iterator[None]:
    """Answer the liveness probe at ``liveness`` (nothing when ``None``) while in the block."""
    if not liveness:
        yield
        return
    with HealthServer(liveness, report):
        yield


def publish_leader(api: KubeApi, namespace: str, leading: bool) -> None:
    """Point the operator Service's EndpointSlice (:data:`~.manifests.LEADER_ENDPOINT_SLICE` in ``namespace``) at
    this replica's pod (``$POD_IP``) when it starts ``leading``; empty it when it stops, so the jobs' reports are
    refused at once rather than sent to a pod that is going. Nothing outside a pod.

    Emptying is conditional: only a slice that still points at this pod, and unchanged since it was read (its
    ``resourceVersion`` in the patch: a conflict otherwise). A leader that lost its Lease (its renewals failed for
    ``renew_deadline``, as in a stall) learns so only after another replica may have taken the Lease and published
    itself there; emptying the slice then would cut the new leader off until the next change of leader."""
    address, pod = os.environ.get("POD_IP"), os.environ.get("POD_NAME")
    if not address:
        return
    endpoints = [{"addresses": [address], "conditions": {"ready": True},
                  **({"targetRef": {"kind": "Pod", "name": pod, "namespace": namespace}} if pod else {})}]
    change: dict[str, Any] = {"endpoints": endpoints if leading else [],
                              "ports": [{"name": "status", "port": STATUS_PORT, "protocol": "TCP"},
                                        {"name": "metrics", "port": METRICS_PORT, "protocol": "TCP"}]}
    if not leading:
        current = api.get(ENDPOINT_SLICES, namespace, LEADER_ENDPOINT_SLICE)
        if current is None or not any(address in (e.get("addresses") or []) for e in current.get("endpoints") or []):
            log.info("the operator Service sends reports to another replica: left as it is")
            return
        change["metadata"] = {"resourceVersion": current["metadata"]["resourceVersion"]}
    if api.patch(ENDPOINT_SLICES, namespace, LEADER_ENDPOINT_SLICE, change) is None and leading:
        api.create({"apiVersion": ENDPOINT_SLICES.api_version, "kind": ENDPOINT_SLICES.kind,
                    "metadata": {"name": LEADER_ENDPOINT_SLICE, "namespace": namespace,
                                 "labels": {"kubernetes.io/service-name": NAME,
                                            "endpointslice.kubernetes.io/managed-by": "trainjob-operator"}},
                    "addressType": "IPv6" if ":" in address else "IPv4", **change}, ENDPOINT_SLICES)
    log.info("the operator Service now sends reports to %s", address if leading else "no replica")


async def _while_leading(elector: LeaderElector, run: Coroutine[Any, Any, None]) -> None:
    """Run the operator while the lease is held; stop it the moment a renewal fails (then raise)."""
    operator = asyncio.create_task(run, name="operator")
    hold = asyncio.create_task(elector.hold(), name="leader-lease")
    try:
        done, _ = await asyncio.wait({operator, hold}, return_when=asyncio.FIRST_COMPLETED)
        if hold in done:
            operator.cancel()
            await asyncio.gather(operator, return_exceptions=True)
            hold.result()  # raises LeadershipLost
            raise LeadershipLost("the leader lease was lost")
        operator.result()
    finally:
        for task in (operator, hold):
            task.cancel()
        await asyncio.gather(operator, hold, return_exceptions=True)


def jobs_by_state(cache: ObjectCache) -> dict[str, int]:
    """How many TrainJobs of the cache are in each state (as ``kubectl get trainjobs`` shows it)."""
    from trainjob.backends.kubernetes.views import job_status

    counts: dict[str, int] = {}
    for job in cache.list(TRAINJOBS):
        state = job_status(job)[0]
        counts[state] = counts.get(state, 0) + 1
    return counts


def status_hosts(status_url: str, namespace: str) -> list[str]:
    """The names the status endpoint's certificate must carry: the URL's host, and the operator Service's."""
    from urllib.parse import urlsplit

    from trainjob.backends.kubernetes.manifests import NAME

    host = urlsplit(status_url).hostname
    if not host:
        raise ValueError(f"--status-url: {status_url!r} has no host; expected e.g. https://{NAME}.{namespace}.svc:8443")
    service = f"{NAME}.{namespace}.svc"
    return list(dict.fromkeys([host, service, f"{service}.cluster.local"]))


def operator_namespace() -> str:
    """The namespace the operator runs in: its pod's, else the one ``trainjob install`` uses."""
    from trainjob.backends.kubernetes.manifests import NAMESPACE

    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or NAMESPACE
    except OSError:
        return NAMESPACE


def run_operator(options: OperatorOptions) -> None:
    """Blocking form of :func:`operate` (what ``trainjob operator`` calls)."""
    asyncio.run(operate(options))
