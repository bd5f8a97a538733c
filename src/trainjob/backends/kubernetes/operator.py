"""The TrainJob operator: kopf watches TrainJobs and JobSets, a work queue feeds :class:`Reconciler`; PyTorchJobs
(``kubeflow.org/v1``) and their pods feed :class:`~.pytorchjob.PyTorchJobReconciler` through a second queue, when
their CRD is the one ``trainjob install`` put there (not the Training Operator's).

Watch events keep the operator's cache (:mod:`.cache`: TrainJobs, JobSets, runtimes) and put the job's key into
the queue (not for the echo of the operator's own write, whose answer the cache holds already); the reconciler reads the current state from that cache and converges it, so missed or repeated events
do no harm and a restarted operator picks every job up again from the initial listing (which requests a pass makes
besides its writes: :mod:`.reconcile`). Failed passes are retried with backoff; jobs with a deadline are queued
again for it::

    from trainjob.backends.kubernetes.operator import OperatorOptions, run_operator

    run_operator(OperatorOptions(workers=4, liveness="http://0.0.0.0:8080/healthz"))

``trainjob operator`` runs it from the command line; deploy/ runs that command in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

import kopf

from trainjob import __version__
from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.config import KubernetesBackendConfig
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
    JOBSETS,
    PYTORCHJOBS,
    TRAINING_RUNTIMES,
    TRAINJOB_NAME_LABEL,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.rest import RestClient, load_client
from trainjob.backends.kubernetes.snapshot import SnapshotSigner, load_or_create_key
from trainjob.backends.kubernetes.status_server import StatusEndpoint, StatusServer
from trainjob.backends.kubernetes.tls import load_or_create_serving_tls
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
    #: Kubeflow's status endpoint, where the jobs' pods push their progress (``None``: read from their logs).
    status_server: StatusServer | None = None
    metrics: OperatorMetrics | None = None


# -- handlers: plain functions, registered in make_registry() --------------------------------------------------------


async def start_workers(memo: OperatorState, **_: Any) -> None:
    """On startup: run the queue's workers; each reconcile runs in a thread (the client is synchronous)."""

    async def handle(key: Any) -> float | None:
        namespace, name = key
        return await _measured(memo, TRAINJOBS.kind, memo.queue, memo.reconciler.reconcile, namespace, name)

    memo.tasks.append(
        asyncio.create_task(memo.queue.run_workers(handle, memo.workers), name="trainjob-workers")
    )
    pytorchjobs = memo.pytorchjobs
    if pytorchjobs is not None:

        async def handle_pytorchjob(key: Any) -> float | None:
            namespace, name = key
            return await _measured(memo, PYTORCHJOBS.kind, memo.pytorchjob_queue, pytorchjobs.reconcile,
                                   namespace, name)

        memo.tasks.append(asyncio.create_task(
            memo.pytorchjob_queue.run_workers(handle_pytorchjob, memo.workers), name="pytorchjob-workers"))


async def warm_framework(**_: Any) -> None:
    """On startup: build the runtime framework (its plugins, entry points of every installed distribution
    included: half a CPU-second) before the watches start, not in the first job's reconcile."""
    from trainjob.runtime.framework import default_framework

    await asyncio.to_thread(default_framework)


async def _measured(memo: OperatorState, kind: str, queue: WorkQueue,
                    reconcile: Callable[[str, str], float | None], namespace: str, name: str) -> float | None:
    """One reconcile in a worker thread, its duration and result counted in the metrics."""
    metrics = memo.metrics
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


async def start_status_server(memo: OperatorState, **_: Any) -> None:
    if memo.status_server is not None:
        await memo.status_server.start()


async def stop_status_server(memo: OperatorState, **_: Any) -> None:
    if memo.status_server is not None:
        await memo.status_server.stop()


async def stop_workers(memo: OperatorState, **_: Any) -> None:
    for task in memo.tasks:
        task.cancel()
    await asyncio.gather(*memo.tasks, return_exceptions=True)
    memo.tasks.clear()


def _cache(memo: OperatorState, ref: Any, event: dict[str, Any]) -> bool:
    """Keep what the event carries; ``False`` when it is news to no one: the cache holds that version already,
    the answer to our own write, which the pass that made it has seen."""
    obj = event.get("object")
    if not isinstance(obj, dict):
        return True
    if event.get("type") == "MODIFIED" and memo.cache.holds(ref, obj):
        return False
    memo.cache.observe(ref, obj, deleted=event.get("type") == "DELETED")
    return True


async def enqueue_trainjob(body: kopf.Body, event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    """Any event about a TrainJob (including the initial listing after a restart) is cached and queues it, but for
    the echo of the operator's own status write."""
    if not _cache(memo, TRAINJOBS, event):
        return
    memo.queue.add((body.metadata.namespace, body.metadata.name))
    if memo.metrics is not None:
        memo.metrics.set_queue_depth(TRAINJOBS.kind, len(memo.queue))


async def cache_cluster_runtime(event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    _cache(memo, CLUSTER_TRAINING_RUNTIMES, event)


async def cache_runtime(event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    _cache(memo, TRAINING_RUNTIMES, event)


async def enqueue_jobset_owner(body: kopf.Body, event: dict[str, Any], memo: OperatorState, **_: Any) -> None:
    """A JobSet changed (status from the JobSet controller, deletion): cache it, queue the TrainJob that owns it
    (not for the echo of the operator's own write)."""
    if not _cache(memo, JOBSETS, event):
        return
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
    client = memo.api.client
    if isinstance(client, RestClient):
        rest = client.config
        return kopf.ConnectionInfo(
            server=rest.host, ca_path=rest.ca_file, ca_data=rest.ca_pem if rest.ca_pem and not rest.ca_file else None,
            insecure=rest.insecure, token=client.bearer_token(), certificate_path=rest.cert_file,
            certificate_data=rest.cert_pem, private_key_path=rest.key_file, private_key_data=rest.key_pem)
    cfg = client.configuration
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


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's "last handled" essence of an object, kept for change handlers (``on.create``/``on.update``) to diff
    against, is built on every watch event by deep-copying the whole object. This operator has only event
    handlers (they put keys on its work queue), so no diff is ever read: keep none, and let an event cost its
    JSON decoding alone (``benchmarks/reconcile.py`` measures a burst of JobSet status events)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    # The watched resources are known; no need to follow CRDs and namespaces (and no RBAC for them).
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    settings.persistence.diffbase_storage = NoDiffBase()
    # Filtered by the API server: kopf's handler filters (labels=) act on events already received and decoded, so
    # without these every pod and JobSet of the cluster came here (most of the CPU on 1,000 KWOK nodes).
    settings.watching.label_selectors[JOBSETS.group, JOBSETS.plural] = TRAINJOB_NAME_LABEL
    settings.watching.label_selectors["v1", "pods"] = f"{OPERATOR_NAME_LABEL}={OPERATOR_NAME}"


def make_registry(pytorchjobs: bool = False) -> kopf.OperatorRegistry:
    """A fresh registry with the operator's handlers (one per operator run, so runs do not share state);
    ``pytorchjobs``: also PyTorchJobs and their pods."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry)(configure)
    kopf.on.startup(registry=registry)(warm_framework)
    kopf.on.startup(registry=registry)(start_workers)
    kopf.on.startup(registry=registry)(start_status_server)
    kopf.on.cleanup(registry=registry)(stop_workers)
    kopf.on.cleanup(registry=registry)(stop_status_server)
    kopf.on.login(registry=registry)(login)
    kopf.on.probe(id="queue", registry=registry)(queue_depth)
    kopf.on.event(TRAINJOBS.group, TRAINJOBS.version, TRAINJOBS.plural, registry=registry)(enqueue_trainjob)
    kopf.on.event(
        JOBSETS.group,
        JOBSETS.version,
        JOBSETS.plural,
        labels={TRAINJOB_NAME_LABEL: kopf.PRESENT},
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
        endpoint = StatusEndpoint(o.status_url, tls.ca_pem)
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
            async with standby_health(o.liveness):
                await elector.acquire()
            await asyncio.to_thread(publish_leader, api, home, True)
            metrics.set_leader(True)
            log.info("leading as %s", elector.identity)
        run = kopf.operator(
            registry=make_registry(pytorchjobs=state.pytorchjobs is not None),
            memo=state,
            standalone=True,
            # kopf would name itself after the process's user, which an image run as an arbitrary UID (a
            # securityContext's runAsUser, OpenShift) has no passwd entry for: getpass fails and the operator exits.
            identity=elector.identity if elector is not None else f"trainjob-operator@{socket.gethostname()}",  # type: ignore[arg-type]
            clusterwide=not o.namespaces,
            namespaces=list(o.namespaces),
            liveness_endpoint=o.liveness,
            stop_flag=o.stop_flag,
            ready_flag=o.ready_flag,
        )
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


def publish_leader(api: KubeApi, namespace: str, leading: bool) -> None:
    """Point the operator Service's EndpointSlice (:data:`~.manifests.LEADER_ENDPOINT_SLICE` in ``namespace``) at
    this replica's pod (``$POD_IP``) when it starts ``leading``; empty it when it stops, so the jobs' reports are
    refused at once rather than sent to a pod that is going. Nothing outside a pod."""
    address, pod = os.environ.get("POD_IP"), os.environ.get("POD_NAME")
    if not address:
        return
    endpoints = [{"addresses": [address], "conditions": {"ready": True},
                  **({"targetRef": {"kind": "Pod", "name": pod, "namespace": namespace}} if pod else {})}]
    change = {"endpoints": endpoints if leading else [],
              "ports": [{"name": "status", "port": STATUS_PORT, "protocol": "TCP"},
                        {"name": "metrics", "port": METRICS_PORT, "protocol": "TCP"}]}
    if api.patch(ENDPOINT_SLICES, namespace, LEADER_ENDPOINT_SLICE, change) is None and leading:
        api.create({"apiVersion": ENDPOINT_SLICES.api_version, "kind": ENDPOINT_SLICES.kind,
                    "metadata": {"name": LEADER_ENDPOINT_SLICE, "namespace": namespace,
                                 "labels": {"kubernetes.io/service-name": NAME,
                                            "endpointslice.kubernetes.io/managed-by": "trainjob-operator"}},
                    "addressType": "IPv6" if ":" in address else "IPv4", **change}, ENDPOINT_SLICES)
    log.info("the operator Service now sends reports to %s", address if leading else "no replica")


async def _while_leading(elector: LeaderElector, run: Coroutine[Any, Any, None]) -> None:
    """Run the operator while the lease is held; stop it the moment a renewal fails (then raise)."""
    operator = asyncio.create_task(run, name="kopf-operator")
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


@contextlib.asynccontextmanager
async def standby_health(liveness: str | None) -> AsyncIterator[None]:
    """While a replica waits for the lease, answer its liveness probe (kopf serves it once leading), so the
    kubelet does not restart a healthy follower."""
    if not liveness:
        yield
        return
    from urllib.parse import urlsplit

    from aiohttp import web

    url = urlsplit(liveness)

    async def healthy(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app = web.Application()
    app.router.add_get(url.path or "/", healthy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, url.hostname or "0.0.0.0", url.port or 80).start()
    try:
        yield
    finally:
        await runner.cleanup()


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
