"""Kubeflow Training Operator v1 ``PyTorchJob`` on the cluster: pods and headless services created directly, as v1 did.

One pass of :meth:`PyTorchJobReconciler.reconcile` reads the job and its pods and converges: a missing pod (and its
service) is created, a failed ``ExitCode`` pod with a retryable exit code is recreated, the status is written, and
a finished job's pods are cleaned and the job deleted after its TTL::

    PyTorchJobReconciler(api).reconcile("default", "my-training")   # seconds until it wants another pass, or None

=====================================  ===============================================================================
pods                                   ``{job}-master-0`` (``Master``, at most one) and ``{job}-worker-{i}``; owned by
                                       the PyTorchJob; ``hostname`` = the pod's name, ``subdomain`` = its service's
services                               one headless service per pod, named like it: ``{job}-master-0`` resolves
label ``training.kubeflow.org/...``    ``job-name`` = job, ``replica-type`` = ``master``/``worker``,
                                       ``replica-index`` = i, ``operator-name`` = ``pytorchjob-controller``,
                                       ``job-role`` = ``master`` on the Master's pod (what the v1 SDK selects logs by)
``restartPolicy``                      ``OnFailure`` (default), ``Always``, ``Never``: the pod's; ``ExitCode``: the pod
                                       runs with ``Never`` and is recreated when its exit code is retryable (>= 128)
=====================================  ===============================================================================

Env of every container (a variable the container sets itself wins), v1's names and values:

=====================  ============================================================================================
``MASTER_ADDR``        ``{job}-master-0`` (``PET_MASTER_ADDR`` too); only with a Master
``MASTER_PORT``        the Master container's port named ``pytorchjob-port``, else 23456 (``PET_MASTER_PORT`` too)
``WORLD_SIZE``         replicas x ``nprocPerNode`` (1 when it is ``auto``/``cpu``/``gpu``); not with elasticPolicy
``RANK``               the node's rank: Master 0, Worker i -> i + 1 (i without a Master); ``PET_NODE_RANK`` too
``PET_NNODES``         the replicas; with elasticPolicy ``minReplicas:maxReplicas``
``PET_NPROC_PER_NODE`` ``nprocPerNode`` (``elasticPolicy.nProcPerNode``, else ``auto``)
``PET_RDZV_*``         elasticPolicy: ``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT`` (``rdzvHost`` or ``{job}-worker-0``,
                       ``rdzvPort`` or the master port), ``PET_RDZV_ID``, ``PET_RDZV_CONF`` (``k=v,...``),
                       ``PET_MAX_RESTARTS``, ``PET_STANDALONE``
``PYTHONUNBUFFERED``   ``1``
=====================  ============================================================================================

Status (``kubeflow.org/v1`` ``JobStatus``): ``conditions`` of type ``Created``, ``Running``, ``Restarting``,
``Succeeded``, ``Failed`` with reasons ``PyTorchJob{Type}`` (``DeadlineExceeded``, ``BackoffLimitExceeded`` for those
failures), ``lastUpdateTime`` and ``lastTransitionTime``; a pod recreated (``ExitCode``) or a container the kubelet
holds in ``CrashLoopBackOff`` (``OnFailure``) makes the job ``Restarting``, its message naming the pod, the restarts
and the last run's exit code and last line (the containers get ``terminationMessagePolicy:
FallbackToLogsOnError`` unless their template sets one); ``Running`` and ``Restarting`` replace each other and
``Running`` turns ``False`` when the job finishes. ``replicaStatuses`` ``{Master: {active, succeeded, failed,
labelSelector}, Worker: ...}`` (zero counts omitted, as Go's ``omitempty`` does), ``startTime``, ``completionTime``.
The job succeeds when the Master's pod succeeded (without a Master: every Worker's); it fails when a pod failed and
is not recreated (the message names the pod and its exit code), past ``backoffLimit`` (container restarts plus
recreations), or past ``activeDeadlineSeconds``.

``runPolicy.cleanPodPolicy`` (default ``None``) says which pods (and services) go when the job finished: ``Running``
the unfinished ones, ``All`` all; a *failed* job's unfinished pods are always stopped. ``ttlSecondsAfterFinished``
deletes the job. ``schedulingPolicy`` becomes a ``scheduling.x-k8s.io`` PodGroup (``minMember``: ``minAvailable``,
else every pod) and the pods' ``scheduling.x-k8s.io/pod-group`` label, when that CRD is served; otherwise a
``PodGroupUnavailable`` event says it is ignored. ``queue`` (Volcano's) is not used.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import time
from dataclasses import dataclass
from typing import Any

from trainjob.api.errors import validate_model
from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.resources import (
    COSCHEDULING_PODGROUPS,
    CRDS,
    PART_OF,
    PART_OF_LABEL,
    PODS,
    PYTORCHJOBS,
    SERVICES,
)
from trainjob.backends.kubernetes.status import timestamp
from trainjob.constants import POD_GROUP_LABEL
from trainjob.convert.pytorchjob_api import MASTER, WORKER, PyTorchJob
from trainjob.errors import AlreadyExistsError, ValidationError

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
OPERATOR_NAME = "pytorchjob-controller"
#: How many times the operator recreated this pod (``ExitCode``); counted against ``backoffLimit``.
RECREATIONS_ANNOTATION = "trainjob/recreations"
DEFAULT_MASTER_PORT = 23456
MASTER_PORT_NAME = "pytorchjob-port"
CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED = "Created", "Running", "Restarting", "Succeeded", "Failed"
#: Seconds between passes while pods run (pod events queue the job sooner).
RESYNC = 30.0


@dataclass(frozen=True)
class Replica:
    """One pod of the job: ``Replica("Worker", 1, ...)`` is ``{job}-worker-1``."""

    type: str
    index: int
    rank: int
    template: dict[str, Any]
    restart_policy: str

    def pod_name(self, job: str) -> str:
        return f"{job}-{self.type.lower()}-{self.index}"


def replicas_of(job: PyTorchJob) -> list[Replica]:
    """The pods a job asks for, Master first (rank 0), Workers after it."""
    specs = job.spec.pytorch_replica_specs
    out: list[Replica] = []
    offset = 1 if MASTER in specs else 0
    for rtype in (MASTER, WORKER):
        spec = specs.get(rtype)
        if spec is None:
            continue
        for index in range(1 if spec.replicas is None else spec.replicas):
            rank = 0 if rtype == MASTER else index + offset
            out.append(Replica(rtype, index, rank, spec.template, spec.restart_policy or "OnFailure"))
    return out


def master_port(job: PyTorchJob) -> int:
    """The Master container's port named ``pytorchjob-port``, else 23456 (v1's default)."""
    master = job.spec.pytorch_replica_specs.get(MASTER)
    for container in ((master.template.get("spec") or {}).get("containers") or []) if master else []:
        for port in container.get("ports") or []:
            if port.get("name") == MASTER_PORT_NAME:
                return int(port["containerPort"])
    return DEFAULT_MASTER_PORT


def training_env(job: PyTorchJob, replica: Replica, count: int) -> dict[str, str]:
    """The variables v1 sets for ``replica`` of a job of ``count`` pods (the module docstring's table)."""
    spec, elastic = job.spec, job.spec.elastic_policy
    nproc = str(spec.nproc_per_node or (elastic.n_proc_per_node if elastic else None) or "auto")
    port = master_port(job)
    env = {"PYTHONUNBUFFERED": "1"}
    if MASTER in spec.pytorch_replica_specs:
        master = f"{job.name}-master-0"
        env |= {"MASTER_ADDR": master, "PET_MASTER_ADDR": master,
                "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port)}
    env["PET_NPROC_PER_NODE"] = nproc
    if elastic is None:
        env |= {"WORLD_SIZE": str(count * (int(nproc) if nproc.isdigit() else 1)), "RANK": str(replica.rank),
                "PET_NODE_RANK": str(replica.rank), "PET_NNODES": str(count)}
        return env
    env["PET_NNODES"] = f"{elastic.min_replicas or count}:{elastic.max_replicas or count}"
    host = elastic.rdzv_host or f"{job.name}-worker-0"
    env["PET_RDZV_ENDPOINT"] = f"{host}:{elastic.rdzv_port or port}"
    if elastic.rdzv_backend:
        env["PET_RDZV_BACKEND"] = elastic.rdzv_backend
    if elastic.rdzv_id:
        env["PET_RDZV_ID"] = elastic.rdzv_id
    if elastic.rdzv_conf:
        env["PET_RDZV_CONF"] = ",".join(f"{c.key}={c.value}" for c in elastic.rdzv_conf)
    if elastic.max_restarts is not None:
        env["PET_MAX_RESTARTS"] = str(elastic.max_restarts)
    if elastic.standalone:
        env["PET_STANDALONE"] = "1"
    return env


def replica_labels(job_name: str, replica: Replica) -> dict[str, str]:
    labels = {JOB_NAME_LABEL: job_name, OPERATOR_NAME_LABEL: OPERATOR_NAME,
              REPLICA_TYPE_LABEL: replica.type.lower(), REPLICA_INDEX_LABEL: str(replica.index)}
    if replica.type == MASTER:
        labels[JOB_ROLE_LABEL] = "master"
    return labels


def owner_reference(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def build_pod(obj: dict[str, Any], job: PyTorchJob, replica: Replica, count: int,
              recreations: int = 0, pod_group: bool = False) -> dict[str, Any]:
    """The pod of ``replica``: its template with the v1 labels, env, host name and restart policy."""
    template = copy.deepcopy(replica.template)
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    name = replica.pod_name(job.name)
    labels = {**(meta.get("labels") or {}), **replica_labels(job.name, replica)}
    if pod_group:
        labels[POD_GROUP_LABEL] = job.name
    annotations = dict(meta.get("annotations") or {})
    if recreations:
        annotations[RECREATIONS_ANNOTATION] = str(recreations)
    env = training_env(job, replica, count)
    for container in spec.get("containers") or []:
        # a crash's last words in the pod's status (a crash loop's Restarting message), unless the template says
        container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
        own = {e["name"] for e in container.get("env") or []}
        container["env"] = [*(container.get("env") or []),
                             *({"name": k, "value": v} for k, v in env.items() if k not in own)]
    spec["hostname"], spec["subdomain"] = name, name
    spec["restartPolicy"] = "Never" if replica.restart_policy == "ExitCode" else replica.restart_policy
    pod_meta: dict[str, Any] = {"name": name, "namespace": obj["metadata"]["namespace"], "labels": labels,
                                "ownerReferences": [owner_reference(obj)]}
    if annotations:
        pod_meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def build_service(obj: dict[str, Any], job: PyTorchJob, replica: Replica) -> dict[str, Any]:
    """A headless service named like the pod, so that its name resolves to the pod."""
    labels = replica_labels(job.name, replica)
    selector = {k: v for k, v in labels.items() if k != JOB_ROLE_LABEL}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": replica.pod_name(job.name), "namespace": obj["metadata"]["namespace"],
                         "labels": labels, "ownerReferences": [owner_reference(obj)]},
            "spec": {"clusterIP": "None", "selector": selector,
                     "ports": [{"name": MASTER_PORT_NAME, "port": master_port(job)}]}}


def set_condition(conditions: list[dict[str, Any]], type_: str, reason: str, message: str,
                  now: str) -> list[dict[str, Any]]:
    """v1's rules: an unchanged (type, reason) keeps its times; Running and Restarting replace each other; a
    finished job's Running turns False. The new condition goes last (``kubectl get`` shows the last one)."""
    current = next((c for c in conditions if c["type"] == type_), None)
    if current is not None and current["status"] == "True" and current.get("reason") == reason:
        if current.get("message") == message:
            return conditions
        return [c if c is not current else {**c, "message": message, "lastUpdateTime": now} for c in conditions]
    transition = current["lastTransitionTime"] if current and current["status"] == "True" else now
    kept = []
    for c in conditions:
        if c["type"] == type_ or {c["type"], type_} == {RUNNING, RESTARTING}:
            continue
        if type_ in (SUCCEEDED, FAILED) and c["type"] == RUNNING and c["status"] == "True":
            c = {**c, "status": "False", "lastUpdateTime": now, "lastTransitionTime": now}
        kept.append(c)
    return [*kept, {"type": type_, "status": "True", "reason": reason, "message": message,
                    "lastUpdateTime": now, "lastTransitionTime": transition}]


def finished(status: dict[str, Any]) -> bool:
    return any(c["type"] in (SUCCEEDED, FAILED) and c["status"] == "True" for c in status.get("conditions") or [])


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The first terminated container state of a pod (exit code, reason), or ``{}``."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
        if state:
            return dict(state)
    return {}


def crash_loop(pod: dict[str, Any]) -> str | None:
    """``pod X: container Y restarted 6 time(s), in CrashLoopBackOff; its last run exited with code 2: python:
    can't open file ...`` for a pod whose container the kubelet keeps restarting (``restartPolicy: OnFailure``)
    and now holds back; ``None`` for any other pod."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") != "CrashLoopBackOff":
            continue
        last = (status.get("lastState") or {}).get("terminated") or {}
        words = [line.strip() for line in str(last.get("message") or "").splitlines() if line.strip()]
        said = f": {words[-1]}" if words else ""
        return (f"pod {pod['metadata']['name']}: container {status.get('name')} restarted "
                f"{status.get('restartCount', 0)} time(s), in CrashLoopBackOff; its last run exited with code "
                f"{last.get('exitCode', '?')}{said}")
    return None


def _restarts(pod: dict[str, Any]) -> int:
    in_place = sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])
    return in_place + int((pod["metadata"].get("annotations") or {}).get(RECREATIONS_ANNOTATION, 0))


def owns_crd(api: KubeApi, name: str) -> bool:
    """Whether CRD ``name`` exists and ``trainjob install`` put it there (label ``app.kubernetes.io/part-of``)."""
    crd = api.get(CRDS, None, name)
    return crd is not None and (crd["metadata"].get("labels") or {}).get(PART_OF_LABEL) == PART_OF


class PyTorchJobReconciler:
    """Converges PyTorchJobs; state lives in the job's status and its pods, none in this object."""

    def __init__(self, api: KubeApi, clock: Any = time.time) -> None:
        self.api = api
        self.clock = clock

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass; the seconds until the job wants another (a deadline, a TTL, a resync), or ``None``."""
        obj = self.api.get(PYTORCHJOBS, namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        status: dict[str, Any] = copy.deepcopy(obj.get("status") or {})
        now = self.clock()
        stamp = timestamp(now)
        try:
            job = validate_model(PyTorchJob, {k: v for k, v in obj.items() if k != "status"})
        except ValidationError as exc:
            if not finished(status):
                self._finish(obj, status, FAILED, "PyTorchJobFailed", f"PyTorchJob {name} is invalid: {exc}", stamp)
            return None
        if finished(status):
            return self._after_finish(obj, job, status, now)

        replicas = replicas_of(job)
        pods = {p["metadata"]["name"]: p for p in self.api.list_pods(namespace, f"{JOB_NAME_LABEL}={name}")
                if any(r.get("uid") == obj["metadata"]["uid"] for r in p["metadata"].get("ownerReferences") or [])}
        conditions = list(status.get("conditions") or [])
        pod_group = False
        if not conditions:
            conditions = set_condition(conditions, CREATED, "PyTorchJobCreated", f"PyTorchJob {name} is created.",
                                       stamp)
            self.api.post_event(obj, "Normal", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
        if job.spec.run_policy and job.spec.run_policy.scheduling_policy and len(pods) < len(replicas):
            pod_group = self._ensure_pod_group(obj, job, len(replicas), first=len(conditions) == 1)
        status.setdefault("startTime", stamp)

        restarting: list[str] = []
        for replica in replicas:
            pod_name = replica.pod_name(name)
            pod = pods.get(pod_name)
            if pod is None:
                pods[pod_name] = self._create(obj, job, replica, len(replicas), 0, pod_group)
            elif self._recreatable(job, replica, pod, pods):
                self.api.delete(PODS, namespace, pod_name, grace_period_seconds=0)
                pods[pod_name] = self._create(obj, job, replica, len(replicas), _restarts(pod) + 1, pod_group)
                restarting.append(f"{pod_name} exited with code {_terminated(pod).get('exitCode')}")

        status["replicaStatuses"] = self._replica_statuses(name, replicas, pods)
        status["conditions"] = conditions
        outcome = self._outcome(job, replicas, pods, status, now)
        if outcome is not None:
            type_, reason, message = outcome
            return self._finish(obj, status, type_, reason, message, stamp, job=job, pods=pods)
        crash_loops = [line for pod in pods.values() if (line := crash_loop(pod))]
        if restarting or crash_loops:
            message = f"PyTorchJob {namespace}/{name} is restarting because {', '.join(restarting + crash_loops)}."
            before = next((c.get("message") for c in conditions if c["type"] == RESTARTING
                           and c["status"] == "True"), None)
            status["conditions"] = set_condition(conditions, RESTARTING, "PyTorchJobRestarting", message, stamp)
            if message != before:
                self.api.post_event(obj, "Warning", "PyTorchJobRestarting", message)
        elif self._leader_running(name, replicas, pods):
            status["conditions"] = set_condition(conditions, RUNNING, "PyTorchJobRunning",
                                                 f"PyTorchJob {namespace}/{name} is running.", stamp)
        self._write(obj, status)
        deadline = job.spec.run_policy.active_deadline_seconds if job.spec.run_policy else None
        if deadline:
            return min(RESYNC, max(_seconds(status["startTime"]) + deadline - now, 0.0))
        return RESYNC

    # -- one pass, step by step -----------------------------------------------------------------------------------

    def _create(self, obj: dict[str, Any], job: PyTorchJob, replica: Replica, count: int, recreations: int,
                pod_group: bool) -> dict[str, Any]:
        with contextlib.suppress(AlreadyExistsError):
            self.api.create(build_service(obj, job, replica), SERVICES)
        try:
            return self.api.create(build_pod(obj, job, replica, count, recreations, pod_group), PODS)
        except AlreadyExistsError:  # still terminating, or created by a pass that raced this one
            return {"metadata": {"name": replica.pod_name(job.name)}, "status": {"phase": "Pending"}}

    def _recreatable(self, job: PyTorchJob, replica: Replica, pod: dict[str, Any],
                     pods: dict[str, dict[str, Any]]) -> bool:
        """``ExitCode``: a pod that failed with a retryable code (>= 128: killed by a signal) is recreated, while
        the job's restarts stay within ``backoffLimit``."""
        if replica.restart_policy != "ExitCode" or _phase(pod) != "Failed":
            return False
        if int(_terminated(pod).get("exitCode") or 0) < 128:
            return False
        limit = job.spec.run_policy.backoff_limit if job.spec.run_policy else None
        return limit is None or sum(map(_restarts, pods.values())) < limit

    def _ensure_pod_group(self, obj: dict[str, Any], job: PyTorchJob, count: int, first: bool) -> bool:
        """Create the job's PodGroup; ``False`` (and, on the first pass, an event) when the CRD is not served."""
        policy = job.spec.run_policy.scheduling_policy if job.spec.run_policy else None
        meta = obj["metadata"]
        group = {"apiVersion": COSCHEDULING_PODGROUPS.api_version, "kind": COSCHEDULING_PODGROUPS.kind,
                 "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                              "ownerReferences": [owner_reference(obj)]},
                 "spec": {"minMember": (policy.min_available if policy else None) or count}}
        try:
            self.api.create(group, COSCHEDULING_PODGROUPS)
        except AlreadyExistsError:
            pass
        except ApiError as exc:
            if exc.status != 404:
                raise
            if first:
                self.api.post_event(obj, "Warning", "PodGroupUnavailable",
                                    "runPolicy.schedulingPolicy is ignored: the cluster serves no "
                                    f"{COSCHEDULING_PODGROUPS.plural}.{COSCHEDULING_PODGROUPS.group} (install "
                                    "scheduler-plugins' coscheduling to gang-schedule this job)")
            return False
        return True

    @staticmethod
    def _replica_statuses(name: str, replicas: list[Replica], pods: dict[str, dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for rtype in dict.fromkeys(r.type for r in replicas):
            phases = [_phase(pods[r.pod_name(name)]) for r in replicas if r.type == rtype and r.pod_name(name) in pods]
            counts = {"active": sum(p in ("Pending", "Running") for p in phases),
                      "succeeded": phases.count("Succeeded"), "failed": phases.count("Failed")}
            out[rtype] = {**{k: v or None for k, v in counts.items()},  # None: merge-patched away, as omitempty
                          "labelSelector": {"matchLabels": {JOB_NAME_LABEL: name, OPERATOR_NAME_LABEL: OPERATOR_NAME,
                                                            REPLICA_TYPE_LABEL: rtype.lower()}}}
        return out

    @staticmethod
    def _leaders(replicas: list[Replica]) -> list[Replica]:
        """Whose pods decide: the Master, or every Worker without one."""
        masters = [r for r in replicas if r.type == MASTER]
        return masters or replicas

    def _leader_running(self, name: str, replicas: list[Replica], pods: dict[str, dict[str, Any]]) -> bool:
        return any(_phase(pods[r.pod_name(name)]) == "Running" for r in self._leaders(replicas))

    def _outcome(self, job: PyTorchJob, replicas: list[Replica], pods: dict[str, dict[str, Any]],
                 status: dict[str, Any], now: float) -> tuple[str, str, str] | None:
        """(condition, reason, message) when the job finished in this pass."""
        name, namespace = job.name, job.metadata.namespace
        policy = job.spec.run_policy
        if policy and policy.active_deadline_seconds and now - _seconds(status["startTime"]) >= \
                policy.active_deadline_seconds:
            return FAILED, "DeadlineExceeded", (f"PyTorchJob {name} has failed because it was active longer than "
                                                f"the specified deadline ({policy.active_deadline_seconds}s)")
        if policy and policy.backoff_limit is not None and sum(map(_restarts, pods.values())) > policy.backoff_limit:
            return FAILED, "BackoffLimitExceeded", (f"PyTorchJob {name} has failed because it has reached the "
                                                    f"specified backoff limit ({policy.backoff_limit})")
        for replica in replicas:
            pod = pods[replica.pod_name(name)]
            if _phase(pod) == "Failed":
                code = _terminated(pod).get("exitCode")
                return FAILED, "PyTorchJobFailed", (
                    f"PyTorchJob {namespace}/{name} has failed because 1 {replica.type} replica(s) failed: "
                    f"pod {replica.pod_name(name)} exited with code {code}")
        if all(_phase(pods[r.pod_name(name)]) == "Succeeded" for r in self._leaders(replicas)):
            return SUCCEEDED, "PyTorchJobSucceeded", f"PyTorchJob {namespace}/{name} successfully completed."
        return None

    def _finish(self, obj: dict[str, Any], status: dict[str, Any], type_: str, reason: str, message: str,
                stamp: str, job: PyTorchJob | None = None,
                pods: dict[str, dict[str, Any]] | None = None) -> float | None:
        status["conditions"] = set_condition(list(status.get("conditions") or []), type_, reason, message, stamp)
        status["completionTime"] = stamp
        self._write(obj, status)
        self.api.post_event(obj, "Normal" if type_ == SUCCEEDED else "Warning", reason, message)
        if job is None:
            return None
        return self._after_finish(obj, job, status, self.clock(), pods)

    def _after_finish(self, obj: dict[str, Any], job: PyTorchJob, status: dict[str, Any], now: float,
                      pods: dict[str, dict[str, Any]] | None = None) -> float | None:
        """Clean pods per ``cleanPodPolicy`` (a failed job's unfinished pods always), then the TTL."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        policy = job.spec.run_policy
        clean = (policy.clean_pod_policy if policy else None) or "None"
        failed = any(c["type"] == FAILED and c["status"] == "True" for c in status.get("conditions") or [])
        if clean == "None" and failed:
            clean = "Running"
        if clean != "None":
            if pods is None:
                pods = {p["metadata"]["name"]: p for p in self.api.list_pods(namespace, f"{JOB_NAME_LABEL}={name}")}
            for pod_name, pod in pods.items():
                if "uid" in pod["metadata"] and (clean == "All" or _phase(pod) in ("Pending", "Running")):
                    self.api.delete(PODS, namespace, pod_name)
                    self.api.delete(SERVICES, namespace, pod_name)
        ttl = policy.ttl_seconds_after_finished if policy else None
        if ttl is None or "completionTime" not in status:
            return None
        left = _seconds(status["completionTime"]) + ttl - now
        if left > 0:
            return left
        self.api.delete(PYTORCHJOBS, namespace, name)
        return None

    def _write(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if _without_nones(status) != (obj.get("status") or {}):
            self.api.patch_status(PYTORCHJOBS, obj["metadata"]["namespace"], obj["metadata"]["name"], status)


def _without_nones(value: Any) -> Any:
    """What the API server stores of a merge patch: keys set to ``None`` are absent."""
    if isinstance(value, dict):
        return {k: _without_nones(v) for k, v in value.items() if v is not None}
    return value


def _seconds(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
