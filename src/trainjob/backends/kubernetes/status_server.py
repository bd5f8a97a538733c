"""Kubeflow Trainer's status endpoint, served by the operator: running jobs push their progress, nobody polls.

``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status`` with
``{"trainerStatus": {"progressPercentage": 42, "estimatedRemainingSeconds": 120, "metrics": [{"name": "loss",
"value": "0.43"}], "lastUpdatedTime": "..."}}`` sets the job's ``status.trainerStatus``, as Kubeflow Trainer v2.2's
controller does. The pods find it through the variables the operator puts in every container
(:func:`inject_status_client`), which the Kubeflow SDK's ``update_trainjob_status`` and trainjob's own
(:mod:`trainjob.torch.metrics`) read:

- ``KUBEFLOW_TRAINER_SERVER_URL``: this endpoint for the pod's own job;
- ``KUBEFLOW_TRAINER_SERVER_TOKEN``: a file holding a service-account token the kubelet projects for the pod with
  the audience ``trainer.kubeflow.org`` (it opens nothing on the API server);
- ``KUBEFLOW_TRAINER_SERVER_CA_CERT``: a file holding the CA of the endpoint's certificate (:mod:`.tls`), from
  ConfigMap ``trainjob-status-ca``, which the operator keeps in each namespace it makes pods in
  (:class:`NamespaceCA`): every pod of a thousand-node job names it rather than carrying its own copy.

``POST .../trainjobs/{name}/collectives`` with ``{"rank": 1, "completedAgo": 0.4, "waitingFor": null}`` (seconds;
``null``: no collective completed yet, none waiting) is how long ago rank 1's collectives last completed and how long
one has been waiting, which a pod's ranks send every few seconds once their first collective ran, in images with
trainjob (:mod:`trainjob.pod_site`, at ``TRAINJOB_COLLECTIVES_URL``, ``collectives``: a reference relative to
``KUBEFLOW_TRAINER_SERVER_URL``). The endpoint keeps the latest of each rank
by its own clock (:meth:`StatusServer.collectives`) for the stall watch of a job that does not report progress;
nothing is written.

Beside the token and the CA, the same volume holds ``stacks-request``, the pod's ``trainjob/stacks-request``
annotation as a downward-API file: ``trainjob stacks NAME`` sets the annotation, and each rank's stacks thread
(:mod:`trainjob.torch.rank_stacks`) answers with its stacks in its log.

A request is accepted when the API server says the token is valid for that audience (a ``TokenReview``) and the pod
it was issued to (named in the review, checked by uid) is a pod of that TrainJob's JobSet in its namespace: a
token of one job cannot write another job's status. Reviews and pods are remembered per token until the token
expires, so a job costs the API server one review and one pod read, then one status write per report interval at
most (``min_interval``; a report that comes sooner waits and is replaced by any newer one)::

    server = StatusServer(api, cache, tls=load_or_create_serving_tls(api, ns, hosts), port=8443)
    await server.start()
    ...
    await server.stop()
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.json_endpoint import JsonEndpoint, Request
from trainjob.backends.kubernetes.resources import (
    CONFIGMAPS,
    JOBSET_NAME_LABEL,
    PART_OF,
    PART_OF_LABEL,
    TRAINJOBS,
)
from trainjob.backends.stall import RankCollectives
from trainjob.constants import (
    COLLECTIVES_URL_ENV,
    STACKS_REQUEST_ANNOTATION,
    STACKS_REQUEST_FILE,
    STATUS_CA_CONFIGMAP,
)
from trainjob.errors import AlreadyExistsError, TrainJobError
from trainjob.progress import MAX_METRICS

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.cache import ObjectCache
    from trainjob.backends.kubernetes.kubeapi import KubeApi
    from trainjob.backends.kubernetes.tls import ServingTLS

log = logging.getLogger("trainjob.operator")
T = TypeVar("T")

AUDIENCE = "trainer.kubeflow.org"
URL_ENV, CA_CERT_ENV, TOKEN_ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
                                   "KUBEFLOW_TRAINER_SERVER_TOKEN")
#: Where the token and the CA are mounted in every container of a job's pods.
MOUNT_PATH = "/var/run/secrets/trainer.kubeflow.org"
VOLUME = "trainjob-status-client"
#: The ConfigMap holding the CA (``ca.crt``) in every namespace the operator makes pods in (:class:`NamespaceCA`).
CA_CONFIGMAP = STATUS_CA_CONFIGMAP
CA_KEY = "ca.crt"
#: The pod-template annotation pods of earlier versions received the CA through (a downward-API file): a suspended
#: JobSet made then keeps it when it resumes.
CA_ANNOTATION = "trainer.kubeflow.org/status-server-ca"
TOKEN_SECONDS = 3600
_ROUTE = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([^/]+)/trainjobs/([^/]+)/(status|collectives)$")
_POD_NAME, _POD_UID = "authentication.kubernetes.io/pod-name", "authentication.kubernetes.io/pod-uid"
#: The longest a review is trusted, whatever the token's own expiry.
REVIEW_SECONDS = 600.0


@dataclass(frozen=True)
class StatusEndpoint:
    """Where pods reach the endpoint (``https://host:port``) and the CA that signed its certificate; ``ca_owner``:
    the Namespace object that owns the CA's ConfigMaps (:class:`NamespaceCA`), ``None``: they have no owner."""

    base_url: str
    ca_pem: str
    ca_owner: dict[str, Any] | None = None

    def url(self, namespace: str, name: str, what: str = "status") -> str:
        """The job's ``status`` endpoint, or its ``collectives`` one."""
        return (f"{self.base_url.rstrip('/')}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/"
                f"{name}/{what}")


def inject_status_client(jobset: dict[str, Any], endpoint: StatusEndpoint) -> None:
    """Give every container of ``jobset``'s pods the endpoint's URL for the job, a projected token with the
    ``trainer.kubeflow.org`` audience, the CA (ConfigMap :data:`CA_CONFIGMAP` of the job's namespace, which
    :meth:`NamespaceCA.ensure` makes) and the file ``trainjob stacks`` asks through, in place (variables a container
    sets itself are kept). What this adds travels with each of the job's pods at each of their changes, to every
    watcher of pods: it is kept small (no per-pod copy of the CA, the collectives URL relative to the status one)."""
    meta = jobset["metadata"]
    env = [
        {"name": URL_ENV, "value": endpoint.url(meta["namespace"], meta["name"])},
        {"name": TOKEN_ENV, "value": f"{MOUNT_PATH}/token"},
        {"name": CA_CERT_ENV, "value": f"{MOUNT_PATH}/{CA_KEY}"},
        {"name": COLLECTIVES_URL_ENV, "value": "collectives"},
    ]
    volume = {"name": VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": "token"}},
        # optional: a ConfigMap deleted by hand costs the pods their status reports (the client says why), not
        # their start; the operator makes it again when it next starts
        {"configMap": {"name": CA_CONFIGMAP, "optional": True}},
        # `trainjob stacks NAME` asks the pod's ranks for their stacks through this one (trainjob.torch.rank_stacks)
        {"downwardAPI": {"items": [
            {"path": STACKS_REQUEST_FILE,
             "fieldRef": {"fieldPath": f"metadata.annotations['{STACKS_REQUEST_ANNOTATION}']"}},
        ]}},
    ]}}
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        template = rj.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        pod = template.setdefault("spec", {})
        volumes = pod.setdefault("volumes", [])
        if not any(v.get("name") == VOLUME for v in volumes):
            volumes.append(volume)
        for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            names = {e.get("name") for e in container.get("env") or []}
            container["env"] = [*(container.get("env") or []), *(e for e in env if e["name"] not in names)]
            mounts = container.setdefault("volumeMounts", [])
            if not any(m.get("name") == VOLUME for m in mounts):
                mounts.append({"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True})


class NamespaceCA:
    """Keeps ConfigMap :data:`CA_CONFIGMAP` (the endpoint's CA, key ``ca.crt``) in each namespace the operator
    makes pods in, which their status-client volume projects: made on the first job there since the operator
    started (one request per namespace, none per job), its CA replaced where it differs (a CA put in the Secret
    by hand). ``owner``: the operator's Namespace, whose deletion (uninstalling trainjob) deletes them all."""

    def __init__(self, api: KubeApi, ca_pem: str, owner: dict[str, Any] | None = None) -> None:
        self.api, self.ca_pem = api, ca_pem
        self._owner = owner
        self._ready: set[str] = set()

    def body(self, namespace: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": CA_CONFIGMAP, "namespace": namespace,
                                "labels": {PART_OF_LABEL: PART_OF}}
        if self._owner is not None:
            owner = self._owner["metadata"]
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Namespace", "name": owner["name"],
                                        "uid": owner["uid"]}]
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {CA_KEY: self.ca_pem}}

    def ensure(self, namespace: str) -> None:
        """Make or mend the namespace's ConfigMap unless done since the operator started; a failure is logged
        (the pods start without the CA, and their status client says so) and tried again at the next job."""
        if namespace in self._ready:
            return
        try:
            try:
                self.api.create(self.body(namespace), CONFIGMAPS)
            except AlreadyExistsError:
                current = self.api.get(CONFIGMAPS, namespace, CA_CONFIGMAP)
                if current is None:  # deleted in between: the next job makes it
                    return
                if (current.get("data") or {}).get(CA_KEY) != self.ca_pem:
                    self.api.patch(CONFIGMAPS, namespace, CA_CONFIGMAP, {"data": {CA_KEY: self.ca_pem}})
                    log.info("replaced the CA in ConfigMap %s/%s", namespace, CA_CONFIGMAP)
        except TrainJobError as exc:
            log.warning("cannot keep ConfigMap %s/%s (the CA the status endpoint's clients verify it by): %s",
                        namespace, CA_CONFIGMAP, exc)
            return
        self._ready.add(namespace)


class Refused(Exception):
    """A request the endpoint answers with ``status`` and ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def trainer_status_of(body: Any) -> dict[str, Any]:
    """The ``trainerStatus`` of a request body, checked field by field (``Refused(400)`` naming what is wrong)."""
    if not isinstance(body, dict) or not isinstance(body.get("trainerStatus"), dict):
        raise Refused(400, 'the body must be a JSON object {"trainerStatus": {...}}')
    given = body["trainerStatus"]
    unknown = set(given) - {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    if unknown:
        raise Refused(400, f"trainerStatus: unknown field(s) {sorted(unknown)}; accepted: progressPercentage, "
                           "estimatedRemainingSeconds, metrics, lastUpdatedTime")
    out: dict[str, Any] = {}
    for key, low, high in (("progressPercentage", 0, 100), ("estimatedRemainingSeconds", 0, None)):
        value = given.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise Refused(400, f"trainerStatus.{key}: must be an integer {bound}, got {value!r}")
        out[key] = int(value)
    metrics = given.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, list) or len(metrics) > MAX_METRICS or not all(
                isinstance(m, dict) and isinstance(m.get("name"), str) and m["name"]
                and isinstance(m.get("value"), str) and set(m) <= {"name", "value"} for m in metrics):
            raise Refused(400, f"trainerStatus.metrics: must be a list of at most {MAX_METRICS} "
                               '{"name": str, "value": str}')
        out["metrics"] = [{"name": m["name"], "value": m["value"][:256]} for m in metrics]
    stamp = given.get("lastUpdatedTime")
    seconds = _seconds_of(stamp) if stamp is not None else time.time()
    if seconds is None:
        raise Refused(400, f"trainerStatus.lastUpdatedTime: must be an RFC 3339 time with a zone, got {stamp!r}")
    out["lastUpdatedTime"] = st.timestamp(seconds)
    return out


def collectives_of(body: Any, now: float) -> RankCollectives:
    """A rank's collectives report (the module's docstring) by the clock ``now`` (``Refused(400)`` naming what is
    wrong)."""
    if not isinstance(body, dict) or set(body) - {"rank", "completedAgo", "waitingFor"}:
        raise Refused(400, 'the body must be a JSON object {"rank": int, "completedAgo": seconds or null, '
                           '"waitingFor": seconds or null}')
    rank = body.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise Refused(400, f"rank: must be an integer >= 0, got {rank!r}")
    ages: list[float | None] = []
    for key in ("completedAgo", "waitingFor"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value < 0):
            raise Refused(400, f"{key}: must be seconds >= 0 or null, got {value!r}")
        ages.append(None if value is None else now - float(value))
    return RankCollectives(rank, ages[0], ages[1])


def _seconds_of(stamp: object) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def _token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, unverified (only to know how long its review may be remembered)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


class StatusServer:
    """The HTTPS endpoint; ``api`` reviews tokens, reads pods and writes statuses; ``cache`` knows the jobs."""

    def __init__(self, api: KubeApi, cache: ObjectCache, tls: ServingTLS | None, host: str = "0.0.0.0",
                 port: int = 8443, min_interval: float = 5.0, clock: Callable[[], float] = time.time,
                 on_report: Callable[[str], None] | None = None,
                 on_written: Callable[[str, str], None] | None = None,
                 on_collectives: Callable[[str, str], None] | None = None) -> None:
        self.api, self.cache, self.tls = api, cache, tls
        self.host, self.port, self.min_interval, self.clock = host, port, min_interval, clock
        self.on_report = on_report or (lambda result: None)
        #: Called with the job's namespace and name once its new progress is written. The watch event of that
        #: write is the operator's own echo, which queues nothing, yet the reconciler must see each report (its
        #: stall watch times the silence between them): the operator queues the job here.
        self.on_written = on_written or (lambda namespace, name: None)
        #: Called with the job's namespace and name when the first collectives report of its ranks arrives (the
        #: reconciler then comes back when the job could be overdue, by the reports it holds then).
        self.on_collectives = on_collectives or (lambda namespace, name: None)
        self._collectives: dict[tuple[str, str], dict[int, RankCollectives]] = {}
        self._collectives_lock = threading.Lock()  # reports arrive on the loop, the reconciler reads in threads
        #: sha256(token) -> (trusted until, namespace, job name) of the reviewed pod
        self._reviewed: dict[str, tuple[float, str, str]] = {}
        self._last_write: dict[tuple[str, str], float] = {}
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._endpoint: JsonEndpoint | None = None

    async def start(self) -> int:
        """Listen; returns the port (the one chosen when ``port`` is 0)."""
        context = self.tls.server_context() if self.tls is not None else None
        self._endpoint = JsonEndpoint(self._route, self.host, self.port, ssl=context)
        self.port = await self._endpoint.start()
        log.info("status endpoint listening on %s:%d (%s)", self.host, self.port, "https" if context else "http")
        return self.port

    async def stop(self) -> None:
        for key in list(self._pending):
            await self._flush(key)
        if self._endpoint is not None:
            await self._endpoint.stop()
            self._endpoint = None

    async def _route(self, request: Request) -> tuple[int, dict[str, Any]]:
        match = _ROUTE.match(request.path.split("?", 1)[0])
        if match is None:
            return 404, {"message": f"not found: {request.path}; reports go to "
                                    "/apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs/NAME/status"}
        if request.method != "POST":
            return 405, {"message": f"{request.method} is not allowed here; reports are POSTed"}
        namespace, name, what = match.groups()
        if what == "status":
            return await self._handle(request, namespace, name)
        return await self._handle_collectives(request, namespace, name)

    async def _handle(self, request: Request, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        """``POST .../status``: a rank's progress, written to the job's status (at most every ``min_interval``)."""
        try:
            trainer_status = await self._running_job_report(request, namespace, name, trainer_status_of)
            await self._accept((namespace, name), trainer_status)
        except Refused as refused:
            self.on_report("rejected")
            log.info("status report for %s/%s refused (%d): %s", namespace, name, refused.status, refused)
            return refused.status, {"message": str(refused)}
        self.on_report("accepted")
        return 200, {"message": "accepted"}

    async def _handle_collectives(self, request: Request, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        """``POST .../collectives``: a rank's collectives report, kept in memory for the stall watch."""
        try:
            report = await self._running_job_report(request, namespace, name,
                                                    lambda body: collectives_of(body, self.clock()))
        except Refused as refused:
            log.info("collectives report for %s/%s refused (%d): %s", namespace, name, refused.status, refused)
            return refused.status, {"message": str(refused)}
        self.keep_collectives(namespace, name, report)
        return 200, {"message": "accepted"}

    async def _running_job_report(self, request: Request, namespace: str, name: str,
                                  parse: Callable[[Any], T]) -> T:
        """The report a pod of TrainJob ``namespace/name`` posted, read by ``parse`` from its JSON body, once its
        token is the job's and the job exists and has not finished; else :class:`Refused` with the HTTP status."""
        token = self._bearer(request.headers.get("authorization", ""))
        await self._authorize(token, namespace, name)
        try:
            body = request.json()
        except ValueError as exc:
            raise Refused(400, f"the body is not JSON: {exc}") from exc
        report = parse(body)
        job = self.cache.get(TRAINJOBS, namespace, name)
        if job is None:
            raise Refused(404, f"TrainJob {namespace}/{name} not found")
        if st.finished_condition(job.get("status") or {}) is not None:
            raise Refused(409, f"TrainJob {namespace}/{name} has finished; it takes no more reports")
        return report

    def keep_collectives(self, namespace: str, name: str, report: RankCollectives) -> None:
        """Keep a rank's accepted collectives report (the latest of each rank); the job's first queues it."""
        with self._collectives_lock:
            ranks = self._collectives.setdefault((namespace, name), {})
            first = not ranks
            ranks[report.rank] = report
        if first:
            self.on_collectives(namespace, name)

    def collectives(self, namespace: str, name: str) -> list[RankCollectives]:
        """The latest collectives report of each rank of the job, by this process's clock. Safe from any thread."""
        with self._collectives_lock:
            return list((self._collectives.get((namespace, name)) or {}).values())

    def forget_collectives(self, namespace: str, name: str) -> None:
        """Drop the job's collectives reports (its pods were replaced, or it finished). Safe from any thread."""
        with self._collectives_lock:
            self._collectives.pop((namespace, name), None)

    @staticmethod
    def _bearer(header: str) -> str:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "an Authorization: Bearer <token> header is required (the projected token in "
                               f"${TOKEN_ENV})")
        return token.strip()

    async def _authorize(self, token: str, namespace: str, name: str) -> None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        known = self._reviewed.get(digest)
        if known is None or known[0] <= now:
            known = await asyncio.to_thread(self._review, token, now)
            self._reviewed = {k: v for k, v in self._reviewed.items() if v[0] > now}
            self._reviewed[digest] = known
        _, pod_namespace, pod_job = known
        if (pod_namespace, pod_job) != (namespace, name):
            raise Refused(403, f"the token belongs to a pod of TrainJob {pod_namespace}/{pod_job}, not "
                               f"{namespace}/{name}")

    def _review(self, token: str, now: float) -> tuple[float, str, str]:
        """Ask the API server about the token, then read the pod it was issued to; (until, namespace, job)."""
        status = self.api.review_token(token, [AUDIENCE])
        if not status.get("authenticated") or AUDIENCE not in (status.get("audiences") or []):
            raise Refused(401, f"the token is not valid for the audience {AUDIENCE!r}"
                               + (f": {status['error']}" if status.get("error") else ""))
        user = status.get("user") or {}
        extra, username = user.get("extra") or {}, user.get("username") or ""
        pod_name, pod_uid = (extra.get(_POD_NAME) or [None])[0], (extra.get(_POD_UID) or [None])[0]
        parts = username.split(":")
        if not pod_name or len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            raise Refused(403, "the token was not issued to a pod (use the token projected into the job's pods)")
        pod_namespace = parts[2]
        pod = self.api.read_pod(pod_namespace, pod_name)
        if pod is None:
            raise Refused(403, f"the token's pod {pod_namespace}/{pod_name} is gone")
        if pod["metadata"].get("uid") != pod_uid:
            raise Refused(403, f"the token's pod {pod_namespace}/{pod_name} is gone (another has its name)")
        job = (pod["metadata"].get("labels") or {}).get(JOBSET_NAME_LABEL)
        if not job:
            raise Refused(403, f"pod {pod_namespace}/{pod_name} belongs to no TrainJob")
        expiry = _token_expiry(token)
        until = min(now + REVIEW_SECONDS, expiry if expiry is not None else now + REVIEW_SECONDS)
        return until, pod_namespace, job

    async def _accept(self, key: tuple[str, str], trainer_status: dict[str, Any]) -> None:
        """Write now, or when ``min_interval`` has passed since the last write (the newest report wins)."""
        waiting = key in self._pending
        self._pending[key] = trainer_status
        if waiting:
            return
        due = self._last_write.get(key, -math.inf) + self.min_interval - self.clock()
        if due <= 0:
            await self._flush(key)
            return

        async def later() -> None:
            await asyncio.sleep(due)
            await self._flush(key)

        asyncio.get_running_loop().create_task(later())

    def pending_report(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job's report still waiting for its interval, if any. The reconciler writes it with the condition
        that finishes the job, so a finished job's status holds the last progress its pods sent; the wait then ends
        in no second write (the job's status already says it). Safe from any thread."""
        return self._pending.get((namespace, name))

    async def _flush(self, key: tuple[str, str]) -> None:
        trainer_status = self._pending.pop(key, None)
        if trainer_status is None:
            return
        namespace, name = key
        self._last_write[key] = self.clock()
        job = self.cache.get(TRAINJOBS, namespace, name) or {}
        old = (job.get("status") or {}).get("trainerStatus") or {}
        if old == trainer_status:
            return
        patch = {**{k: None for k in old if k not in trainer_status}, **trainer_status}
        try:
            written = await asyncio.to_thread(self.api.patch_status, TRAINJOBS, namespace, name,
                                              {"trainerStatus": patch})
        except Exception as exc:  # progress is best effort: the next report tries again
            log.warning("cannot write the progress of TrainJob %s/%s: %s", namespace, name, exc)
            return
        self.cache.store(TRAINJOBS, written)
        self.on_written(namespace, name)
        if len(self._last_write) > 10_000:  # forget jobs not heard from for a while
            cutoff = self.clock() - 10 * self.min_interval
            self._last_write = {k: t for k, t in self._last_write.items() if t > cutoff}
