"""Reconcile one TrainJob: runtime snapshot -> Plan -> JobSet (+ PodGroup) -> status. Idempotent, restart-safe.

Every call reads the TrainJob and its JobSet from the API server and converges them; nothing is kept in memory,
so an operator that restarts (or two calls for the same job) does the right thing::

    api = KubeApi(load_api_client(KubernetesBackendConfig()))
    reconciler = Reconciler(api, SnapshotSigner(load_or_create_key(api, "trainjob-system")))
    again_in = reconciler.reconcile("ml-team", "mnist")   # seconds until a deadline check, or None

Steps, each skipped when already done:

1. jobs that finished, that are being deleted, or whose ``spec.managedBy`` names another controller are left alone;
2. the referenced runtime (a ClusterTrainingRuntime, or a TrainingRuntime from the job's own namespace) is copied
   into the job's ``trainer.kubeflow.org/runtime-snapshot`` annotation before anything is built from it, so
   editing the runtime later never changes this job, not even when its JobSet must be built again (the status
   keeps the Kubeflow Trainer shape, which the API server would prune extra fields from). The snapshot is signed
   (:mod:`.snapshot`): one the operator did not write is replaced, with a ``Warning`` Event;
3. the runtime framework resolves the job into a Plan and renders the JobSet (and PodGroup), created with owner
   references to the TrainJob so deleting the job deletes them. Extended resources (``nvidia.com/gpu``) requested
   without a limit get an equal limit, as the API server requires, with an Event. A JobSet that someone else
   deleted is created again, with a ``Warning`` Event (a script that checkpoints resumes from its checkpoint);
4. ``spec.suspend`` is mirrored to the JobSet's ``spec.suspend``; a job resumed (admitted by a queue such as Kueue)
   also brings the pod template fields JobSet lets change while suspended (labels, annotations, node selector,
   tolerations, scheduling gates) to what its ``podTemplateOverrides`` say now. Nothing else of an existing JobSet
   is ever changed;
5. the status is derived from the JobSet (:mod:`.status`): no condition while the job runs, as the Kubeflow SDK
   expects; each restart of the node group under the JobSet's ``failurePolicy`` becomes a ``Restarting`` event
   (``attempt 2 of 4: node-1 rank 1: ...``); past ``activeDeadlineSeconds`` the job fails and its JobSet is deleted. While node 0 runs, the end of its log is read for the last ``update_trainjob_status`` /
   ``report`` line, which becomes ``status.trainerStatus`` (:mod:`.progress`); a running job is looked at again
   every :data:`~.progress.RESYNC_SECONDS`;
6. a finished job with a ``trainjob/ttl-seconds-after-finished`` annotation is deleted once that many seconds
   have passed since it finished (:mod:`.ttl`); its JobSet and pods go with it through their owner references.

A job that cannot run (unknown runtime, invalid spec) gets ``Failed`` with the reason, a message naming the field
and what to change, and a ``Warning`` Event.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from trainjob.api import TrainJob, resource_from_dict
from trainjob.backends.kubernetes import progress
from trainjob.backends.kubernetes import status as st
from trainjob.backends.kubernetes.cache import ObjectCache
from trainjob.backends.kubernetes.failure import root_cause
from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.resources import (
    ANCESTOR_STEP_LABEL,
    CLUSTER_TRAINING_RUNTIMES,
    CONTROLLER_NAME,
    COSCHEDULING_PODGROUPS,
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    JOBSETS,
    RUNTIME_KINDS,
    TRAINER_GROUP,
    TRAINJOBS,
    VOLCANO_PODGROUPS,
    ResourceRef,
)
from trainjob.backends.kubernetes.snapshot import SnapshotSigner, has_snapshot
from trainjob.backends.kubernetes.status_server import StatusEndpoint, inject_status_client
from trainjob.backends.kubernetes.ttl import ttl_remaining
from trainjob.backends.kubernetes.views import trainer_pods
from trainjob.backends.stacks import RankStacks, find_stuck_ranks
from trainjob.backends.stall import ProgressClock, dump_setting, stall_policy
from trainjob.constants import LAUNCH_ANNOTATION, STALL_DUMP_ENV, TRAINER_NODE
from trainjob.errors import AlreadyExistsError, NotFoundError, TrainJobError, ValidationError
from trainjob.runtime import resolve
from trainjob.runtime.launch import LaunchValues, resolve_launch_values
from trainjob.runtime.render import render_objects
from trainjob.stall_dumps import dumps_in_log

log = logging.getLogger("trainjob.operator")

DEFAULT_TRAINER = TRAINER_NODE
#: Pod counts (``jobsStatus``) of one job are written at most this often: a burst of JobSet updates while its
#: pods start becomes one write. Conditions are written at once.
STATUS_SETTLE_SECONDS = 1.0
#: How many restarts of the JobSet (``status.restarts``) the operator has reported as ``Restarting`` events.
RESTARTS_ANNOTATION = "trainjob/restarts-reported"
#: How many times the stall watchdog restarted the job's node group (``trainjob/stall-action: restart``); with the
#: JobSet's own restarts they spend the runtime's ``failurePolicy.maxRestarts``.
STALL_RESTARTS_ANNOTATION = "trainjob/stall-restarts"


def is_managed_here(job: dict[str, Any]) -> bool:
    """Whether this operator reconciles ``job``: ``spec.managedBy`` absent or naming this controller."""
    return (job.get("spec") or {}).get("managedBy") in (None, "", CONTROLLER_NAME)


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": TRAINJOBS.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class Reconciler:
    """Converges TrainJobs through a :class:`KubeApi`; ``clock`` is injectable for deadline tests."""

    def __init__(self, api: KubeApi, signer: SnapshotSigner, clock: Callable[[], float] = time.time,
                 cache: ObjectCache | None = None, status_endpoint: StatusEndpoint | None = None,
                 pending_progress: Callable[[str, str], dict[str, Any] | None] | None = None) -> None:
        self.api = api
        self.signer = signer
        self.clock = clock
        #: The watches' objects (TrainJobs, JobSets, runtimes): read instead of the API server when given.
        self.cache = cache
        #: Where the pods push their progress (:mod:`.status_server`); ``None``: it is read from node 0's log.
        self.status_endpoint = status_endpoint
        #: A job's pushed report still waiting to be written (:meth:`.StatusServer.pending_report`): a job's last
        #: report may arrive within the endpoint's write interval, just before the job finishes.
        self.pending_progress = pending_progress
        #: The JobSet (uid) whose JobSetCreated event this process posted, by job; forgotten with the job.
        self._announced: dict[tuple[str, str], str] = {}
        #: When each job's status was last written (its pod counts are written at most every STATUS_SETTLE_SECONDS).
        self._written: dict[tuple[str, str], float] = {}
        #: Each running job's progress as this process saw it arrive, by job: (job uid, the last
        #: ``trainerStatus`` seen, its clock); forgotten when the job finishes or goes.
        self._clocks: dict[tuple[str, str], tuple[str, dict[str, Any] | None, ProgressClock]] = {}

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One pass over TrainJob ``namespace/name``; returns seconds until the next pass is due, if any."""
        job = self._read(TRAINJOBS, namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp") or not is_managed_here(job):
            self._forget(namespace, name)
            return None
        status: dict[str, Any] = dict(job.get("status") or {})
        now = self.clock()
        if st.finished_condition(status) is not None:
            self._forget(namespace, name)
            return self._expire(job, now)
        spec = job.get("spec") or {}

        suspend = bool(spec.get("suspend"))
        jobset = self._read(JOBSETS, namespace, name)
        if jobset is not None and not _owned_by(jobset, job):
            if _left_by_a_namesake(jobset):
                return 1.0  # a deleted TrainJob of the same name: the API server's GC removes its JobSet
            message = (
                f"a JobSet {name!r} that this TrainJob did not create exists in namespace {namespace!r}; "
                "delete it or give the TrainJob another name"
            )
            self._fail(job, status, "JobSetConflict", message, now)
            return None
        if jobset is None:
            if status.get("jobsStatus"):  # it existed: someone else deleted it
                self.api.post_event(
                    job,
                    "Warning",
                    "JobSetRecreated",
                    f"JobSet {name!r} was deleted by someone else; creating it again (training restarts, from "
                    "its last checkpoint when the script keeps one)",
                )
            snapshot = self._snapshot(job, status, now)
            if snapshot is None:
                return None
            jobset = self._build(job, status, snapshot, now)
            if jobset is None:
                return None
            if not _owned_by(jobset, job):  # the create met one the cache had not shown yet
                return 1.0 if _left_by_a_namesake(jobset) else 0.0
        else:
            if not status and self._announced.get((namespace, name)) != jobset["metadata"].get("uid"):
                self._announce(job, jobset)  # made by a pass (another replica's?) that ended before its event
            if bool((jobset.get("spec") or {}).get("suspend")) != suspend:
                change: dict[str, Any] = {"suspend": suspend}
                if not suspend:  # resumed: admitted (Kueue) with the node selectors and tolerations it chose
                    templates = self._admitted_templates(job, jobset)
                    if templates is not None:
                        change["replicatedJobs"] = templates
                jobset = self._stored(JOBSETS, self.api.patch(JOBSETS, namespace, name, {"spec": change})) or jobset

        trainer = trainer_name(jobset)
        new = st.derive_status(status, suspend, jobset, now)
        if st.is_true(new, st.FAILED) and not st.is_true(status, st.FAILED):
            new = self._explain_failure(job, new, now)
        elif st.finished_condition(new) is None:
            self._report_restarts(job, jobset)
        remaining = st.deadline_remaining(suspend, jobset, spec.get("activeDeadlineSeconds"), now)
        if remaining is not None and remaining <= 0 and st.finished_condition(new) is None:
            self._fail_past_deadline(job, status, new, now)
            return None
        if not suspend and st.finished_condition(new) is None and _trainer_started(jobset, trainer):
            stall_in = self._watch_progress(job, status, new, jobset, now)
            if stall_in is not None and stall_in <= 0:
                return None  # stalled: failed, and its JobSet deleted
            if stall_in is not None:
                remaining = stall_in if remaining is None else min(remaining, stall_in)
        elif (namespace, name) in self._clocks:  # suspended, or its pods replaced: unarmed until a new report
            seen_uid, seen, _ = self._clocks[(namespace, name)]
            self._clocks[(namespace, name)] = (seen_uid, seen, ProgressClock())
        elastic = progress.is_elastic(jobset, trainer)
        if not suspend and _trainer_started(jobset, trainer) and (self.status_endpoint is None or elastic):
            new = self._observe_trainer(job, new, jobset, trainer)
        if self.pending_progress is not None and st.finished_condition(new) is not None \
                and st.finished_condition(status) is None:
            last = self.pending_progress(namespace, name)  # written with the condition that finishes the job
            if last is not None:
                new = {**new, "trainerStatus": last}
        settle = self._settling(namespace, name, status, new, now)
        if settle is not None:  # only pod counts moved, just after a write: one write for the burst, shortly
            return settle if remaining is None else min(remaining, settle)
        self._write_status(namespace, name, status, new)
        if st.finished_condition(new) is not None:
            return self._expire({**job, "status": new}, now)
        if suspend or (self.status_endpoint is not None and not elastic):  # progress is pushed: nothing to poll
            return remaining
        return progress.RESYNC_SECONDS if remaining is None else min(remaining, progress.RESYNC_SECONDS)

    # -- reads and writes -----------------------------------------------------------------------------------------

    def _read(self, ref: ResourceRef, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object from the watch cache when it serves the kind, else from the API server. A runtime the cache
        has not seen (created a moment ago) is asked for; a TrainJob or JobSet it has not seen is taken as absent
        (the TrainJob's own watch event queues it again; a JobSet create that meets one answers 409)."""
        if self.cache is not None and self.cache.serves(ref):
            found = self.cache.get(ref, namespace, name)
            if found is not None or ref.kind not in RUNTIME_KINDS:
                return found
        return self.api.get(ref, namespace, name)

    def _stored(self, ref: ResourceRef, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """``obj``, what a write returned, kept in the cache so the next pass sees it before its watch event."""
        if self.cache is not None:
            self.cache.store(ref, obj)
        return obj

    # -- steps ----------------------------------------------------------------------------------------------------

    def _snapshot(self, job: dict[str, Any], status: dict[str, Any], now: float) -> dict[str, Any] | None:
        """The runtime snapshot to build the job's JobSet from: the signed one the job's deleted JobSet carried (or
        that an earlier operator version wrote on the job), else a fresh copy of the referenced runtime. An
        unsigned snapshot annotation on the job is replaced by the signed fresh one, with a Warning."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        snapshot = self.signer.verified(job)
        if snapshot is not None:
            return snapshot
        gone = self.cache.last_deleted(JOBSETS, namespace, name) if self.cache is not None else None
        if gone is not None and _owned_by(gone, job):
            snapshot = self.signer.verified(job, gone)
            if snapshot is not None:
                return snapshot
        snapshot = self._snapshot_runtime(job, status, now)
        if snapshot is None or not has_snapshot(job):
            return snapshot
        annotation = {"metadata": {"annotations": self.signer.annotations(job, snapshot)}}
        if self._stored(TRAINJOBS, self.api.patch(TRAINJOBS, namespace, name, annotation)) is None:
            return None  # deleted meanwhile
        self.api.post_event(
            job,
            "Warning",
            "RuntimeSnapshotReplaced",
            "the runtime-snapshot annotation was not written by the operator (it is signed) and was "
            f"replaced by a snapshot of {snapshot['kind']} {snapshot['name']!r}",
        )
        return snapshot


    def _snapshot_runtime(
        self, job: dict[str, Any], status: dict[str, Any], now: float
    ) -> dict[str, Any] | None:
        namespace = job["metadata"]["namespace"]
        ref = (job.get("spec") or {}).get("runtimeRef") or {}
        kind = ref.get("kind") or CLUSTER_TRAINING_RUNTIMES.kind
        group = ref.get("apiGroup") or TRAINER_GROUP
        runtime_ref = RUNTIME_KINDS.get(kind)
        if group != TRAINER_GROUP or runtime_ref is None:
            self._fail(
                job,
                status,
                "InvalidRuntimeRef",
                f"spec.runtimeRef: must reference a {TRAINER_GROUP} ClusterTrainingRuntime or TrainingRuntime, "
                f"got apiGroup={group!r} kind={kind!r}",
                now,
            )
            return None
        runtime = self._read(runtime_ref, namespace if runtime_ref.namespaced else None, ref.get("name", ""))
        if runtime is None:
            where = f" in namespace {namespace!r}" if runtime_ref.namespaced else ""
            known = sorted(
                r["metadata"]["name"]
                for r in self.api.list(runtime_ref, namespace if runtime_ref.namespaced else None)
            )
            self._fail(
                job,
                status,
                "RuntimeNotFound",
                f"spec.runtimeRef.name: {kind} {ref.get('name')!r} not found{where}; "
                f"available: {', '.join(known) or 'none'} (create the runtime, then create the TrainJob again)",
                now,
            )
            return None
        return {
            "kind": kind,
            "name": runtime["metadata"]["name"],
            "resourceVersion": runtime["metadata"].get("resourceVersion"),
            "labels": runtime["metadata"].get("labels") or {},
            "spec": runtime.get("spec") or {},
        }

    def render(self, job: dict[str, Any], snapshot: dict[str, Any]) -> list[dict[str, Any]]:
        """The objects (PodGroup first, then JobSet) the runtime framework renders for ``job``, owned by it."""
        return self._render(job, snapshot)[0]

    def _render(
        self, job: dict[str, Any], snapshot: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], list[str], LaunchValues]:
        """The objects, the extended-resource limits it had to set, and the launch values the job resolved to."""
        meta = job["metadata"]
        model = TrainJob.from_dict(
            {
                "apiVersion": TRAINJOBS.api_version,
                "kind": TRAINJOBS.kind,
                "metadata": {
                    k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)
                },
                "spec": job.get("spec") or {},
            }
        )
        runtime_doc = {
            "apiVersion": TRAINJOBS.api_version,
            "kind": snapshot["kind"],
            "metadata": {"name": snapshot["name"], "labels": snapshot.get("labels") or {}},
            "spec": snapshot["spec"],
        }
        if snapshot["kind"] == "TrainingRuntime":
            runtime_doc["metadata"]["namespace"] = meta["namespace"]
        runtime = resource_from_dict(runtime_doc)
        plan = resolve(model, runtime)
        objects = render_objects(plan)
        changes = limit_extended_resources(objects)
        keep_log_tail_on_error(objects)
        for obj in objects:
            obj_meta = obj.setdefault("metadata", {})
            obj_meta["namespace"] = meta["namespace"]
            obj_meta.setdefault("labels", {})[JOB_NAME_LABEL] = meta["name"]
            obj_meta["ownerReferences"] = [owner_reference(job)]
            if obj["kind"] == JOBSETS.kind:  # created suspended when the job is, so no pod starts early
                obj.setdefault("spec", {})["suspend"] = bool((job.get("spec") or {}).get("suspend"))
        return sorted(objects, key=lambda o: o["kind"] == JOBSETS.kind), changes, resolve_launch_values(plan)

    def _build(
        self, job: dict[str, Any], status: dict[str, Any], snapshot: dict[str, Any], now: float
    ) -> dict[str, Any] | None:
        """Render and create the job's objects; ``None`` when the job cannot run (it is failed then)."""
        try:
            objects, limits_set, launch = self._render(job, snapshot)
        except ValidationError as exc:
            self._fail(job, status, "InvalidTrainJob", f"{exc} (fix the TrainJob and create it again)", now)
            return None
        except Exception as exc:  # a runtime the framework cannot render: retrying cannot help
            log.exception("cannot render TrainJob %s/%s", job["metadata"]["namespace"], job["metadata"]["name"])
            message = f"cannot render the runtime: {type(exc).__name__}: {str(exc)[:300]} (fix the runtime)"
            self._fail(job, status, "InvalidRuntime", message, now)
            return None
        created: dict[str, Any] = {}
        made_jobset = False
        for obj in objects:
            if obj["kind"] == JOBSETS.kind:  # the snapshot and launch values travel with the JobSet's create
                if self.status_endpoint is not None:
                    inject_status_client(obj, self.status_endpoint)
                _inject_stall_dumps(obj, job)
                obj["metadata"].setdefault("annotations", {}).update(self.signer.annotations(job, snapshot))
                obj["metadata"]["annotations"][LAUNCH_ANNOTATION] = json.dumps(launch.to_dict(), sort_keys=True)
            try:
                created = self.api.create(obj)
                made_jobset = made_jobset or obj["kind"] == JOBSETS.kind
                if obj["kind"] == JOBSETS.kind:
                    self._stored(JOBSETS, created)
            except AlreadyExistsError:  # a previous pass got this far, or the cache had not shown it yet
                existing = self.api.get(JOBSETS, obj["metadata"]["namespace"], obj["metadata"]["name"]) \
                    if obj["kind"] == JOBSETS.kind else None
                created = self._stored(JOBSETS, existing) or obj
            except ApiError as exc:
                if exc.status == 404:  # the kind is not served
                    self._fail(job, status, "CRDNotInstalled", _not_installed(obj), now)
                    return None
                if exc.status in (400, 403, 422):  # refused as invalid (or forbidden): retrying cannot help
                    self._fail(job, status, "JobSetRejected", f"{exc} (fix the runtime or the TrainJob)", now)
                    return None
                raise
        if made_jobset:
            for change in limits_set:
                self.api.post_event(job, "Normal", "ExtendedResourceLimitsSet", change)
            self._announce(job, created)
            log.info("created JobSet %s/%s", job["metadata"]["namespace"], job["metadata"]["name"])
        elif not status and _owned_by(created, job) and self._announced.get(
                (job["metadata"]["namespace"], job["metadata"]["name"])) != created["metadata"].get("uid"):
            self._announce(job, created)  # the create met the JobSet a pass that ended before its event made
        return created

    def _admitted_templates(self, job: dict[str, Any], jobset: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The suspended JobSet's ``replicatedJobs`` with the pod template fields a queue sets at admission (labels,
        annotations, node selector, tolerations, scheduling gates: what JobSet lets change while suspended) as the
        TrainJob says them now (Kueue writes them into ``podTemplateOverrides`` before it resumes the job, and takes
        them back out when it suspends it); ``None`` when they are as they were. Everything else stays as stored."""
        snapshot = self.signer.verified(job, jobset)
        if snapshot is None:
            return None
        try:
            objects, _, _ = self._render(job, snapshot)
        except Exception:  # the JobSet was built from this snapshot before; nothing to carry over
            log.exception("cannot render TrainJob %s/%s at resume", job["metadata"]["namespace"], job["metadata"]["name"])
            return None
        (rendered,) = [o for o in objects if o["kind"] == JOBSETS.kind]
        if self.status_endpoint is not None:
            inject_status_client(rendered, self.status_endpoint)
        wanted = {rj["name"]: rj for rj in rendered["spec"].get("replicatedJobs") or []}
        stored = json.loads(json.dumps((jobset.get("spec") or {}).get("replicatedJobs") or []))
        changed = False
        for rj in stored:
            new = wanted.get(rj.get("name"))
            if new is None:
                continue
            have_template = rj["template"]["spec"]["template"]
            want_template = new["template"]["spec"]["template"]
            for key in ("labels", "annotations"):
                want = (want_template.get("metadata") or {}).get(key) or {}
                if ((have_template.get("metadata") or {}).get(key) or {}) != want:
                    have_template.setdefault("metadata", {})[key] = want
                    changed = True
            for key in ("nodeSelector", "tolerations", "schedulingGates"):
                want = (want_template.get("spec") or {}).get(key)
                if (have_template.get("spec") or {}).get(key) != want:
                    if want is None:
                        have_template["spec"].pop(key, None)
                    else:
                        have_template["spec"][key] = want
                    changed = True
        return stored if changed else None

    def _announce(self, job: dict[str, Any], jobset: dict[str, Any]) -> None:
        """The ``JobSetCreated`` event, named after the JobSet's uid: posting it again after a crash (or from the
        replica that took over) finds it there, so a job never has two, and never none."""
        name, uid = job["metadata"]["name"], jobset["metadata"].get("uid")
        self.api.post_event(job, "Normal", "JobSetCreated", f"created JobSet {name}",
                            name=f"{name}.{uid}" if uid else None)
        if uid:
            self._announced[(job["metadata"]["namespace"], name)] = uid

    def _forget(self, namespace: str, name: str) -> None:
        """Drop what this process remembered of a job that finished or went."""
        self._announced.pop((namespace, name), None)
        self._clocks.pop((namespace, name), None)

    def _observe_trainer(
        self, job: dict[str, Any], status: dict[str, Any], jobset: dict[str, Any], trainer: str
    ) -> dict[str, Any]:
        """``status`` with ``trainerStatus`` from the last progress line of node 0's log; an elastic job's resizes
        (printed by its rank 0, on whichever node) become ``Resized`` events."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            pods = trainer_pods(self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"), trainer)
            read = self._report_resizes(job, list(pods.values())) if progress.is_elastic(jobset, trainer) else {}
            pod = pods.get(0)
            if pod is None or not progress.should_read_progress(job, pod):  # job: the status before this pass
                return status
            if self.status_endpoint is not None:  # pushed to the status endpoint, not read from the log
                return status
            text = read.get(pod["metadata"]["name"]) or self._log_tail(namespace, pod)
        except NotFoundError:
            return status
        except TrainJobError as exc:  # progress is best effort: the job's state does not depend on it
            log.warning("cannot read the progress of TrainJob %s/%s: %s", namespace, name, exc)
            return status
        trainer_status = progress.trainer_status_from_log(text)
        if trainer_status is None or trainer_status == status.get("trainerStatus"):
            return status
        return {**status, "trainerStatus": trainer_status}

    def _log_tail(self, namespace: str, pod: dict[str, Any]) -> str:
        return self.api.read_pod_log(namespace, pod["metadata"]["name"], container=_container_name(pod),
                                     timestamps=True, tail_lines=progress.LOG_TAIL_LINES)

    def _report_resizes(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, str]:
        """Post a ``Resized`` event for every resize the running trainer pods logged since the last one reported;
        the log tails read, by pod name."""
        texts: dict[str, str] = {}
        for pod in pods:
            if ((pod.get("status") or {}).get("phase")) != "Running":
                continue
            try:
                texts[pod["metadata"]["name"]] = self._log_tail(job["metadata"]["namespace"], pod)
            except NotFoundError:
                continue
        resizes = progress.new_resizes(job, progress.resizes_from_logs(texts.values()))
        for _, message in resizes:
            self.api.post_event(job, "Normal" if _grew(message) else "Warning", "Resized", message)
        if resizes:
            annotation = {"metadata": {"annotations": {progress.RESIZE_ANNOTATION: resizes[-1][0]}}}
            self._stored(TRAINJOBS, self.api.patch(TRAINJOBS, job["metadata"]["namespace"], job["metadata"]["name"],
                                                   annotation))
        return texts

    def _report_restarts(self, job: dict[str, Any], jobset: dict[str, Any]) -> None:
        """A ``Restarting`` Warning for each restart of the node group JobSet made (``status.restarts``) since the
        last one reported, naming the attempt and, while the failed pods are still there, why; the count reported
        is kept in the job's :data:`RESTARTS_ANNOTATION`, so no condition appears while the job runs."""
        restarts = int((jobset.get("status") or {}).get("restarts") or 0)
        meta = job["metadata"]
        reported = (meta.get("annotations") or {}).get(RESTARTS_ANNOTATION, "0")
        if restarts <= (int(reported) if reported.isdigit() else 0):
            return
        namespace, name = meta["namespace"], meta["name"]
        try:
            pods = self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}")
            cause = root_cause(pods, lambda pod, container: self.api.read_log(namespace, pod, container))
        except TrainJobError as exc:  # the event is best effort: the restart happens either way
            log.warning("cannot read the pods of restarting TrainJob %s/%s: %s", namespace, name, exc)
            cause = None
        limit = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts")
        of = f" of {int(limit) + 1}" if limit is not None else ""
        why = cause or "a Job of the node group failed"
        self.api.post_event(job, "Warning", "Restarting", f"attempt {restarts + 1}{of}: {why}")
        self._stored(TRAINJOBS, self.api.patch(TRAINJOBS, namespace, name,
                                               {"metadata": {"annotations": {RESTARTS_ANNOTATION: str(restarts)}}}))

    def _expire(self, job: dict[str, Any], now: float) -> float | None:
        """Delete a finished job past its TTL; else the seconds until it is due (``None``: it has none)."""
        left = ttl_remaining(job, now)
        if left is None or left > 0:
            return left
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if self.api.delete(TRAINJOBS, namespace, name, propagation="Background"):
            log.info("deleted TrainJob %s/%s: finished more than its ttl-seconds-after-finished ago", namespace, name)
        return None

    def _explain_failure(self, job: dict[str, Any], status: dict[str, Any], now: float) -> dict[str, Any]:
        """Put the failing node, rank and exception in front of the JobSet's generic failure message."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            pods = self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}")
            cause = root_cause(pods, lambda pod, container: self.api.read_log(namespace, pod, container))
        except TrainJobError as exc:
            log.warning("cannot read the pods of failed TrainJob %s/%s: %s", namespace, name, exc)
            return status
        if cause is None:
            return status
        cond = st.find_condition(status, st.FAILED) or {}
        message = f"{cause} ({cond.get('message') or 'the JobSet failed'})"
        return st.set_condition(status, st.FAILED, True, cond.get("reason") or "JobSetFailed", message, now)

    def _fail_past_deadline(
        self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any], now: float
    ) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        message = (
            f"the job ran longer than spec.activeDeadlineSeconds={job['spec']['activeDeadlineSeconds']}s; "
            "its JobSet was deleted (raise the deadline to let it run longer)"
        )
        # Children first: were Failed written first and the delete then refused (a 503), the next pass would find
        # a finished job and leave its JobSet running.
        self._delete_children(namespace, name)
        self._write_status(namespace, name, old, st.failed(new, "DeadlineExceeded", message, now))
        self.api.post_event(job, "Warning", "DeadlineExceeded", message)

    def _watch_progress(self, job: dict[str, Any], old: dict[str, Any], new: dict[str, Any],
                        jobset: dict[str, Any], now: float) -> float | None:
        """The stall watchdog (:mod:`trainjob.backends.stall`) from the progress that reaches the job's status
        (pushed to the status endpoint, or read from node 0's log): seconds until the job would be overdue, ``None``
        when it is not watched (no report yet, ``trainjob/stall-timeout: off``, or its node group just restarted);
        ``0`` after failing a stalled job. A stall restarts the node group when ``trainjob/stall-action`` says
        ``restart`` (the default where the JobSet has ``failurePolicy.maxRestarts``) and restarts are left: the
        pods are evicted, and the Job controller replaces them as it does preempted ones (the built-in runtimes
        ignore a ``DisruptionTarget`` pod). Otherwise the job fails (``Stalled``) and its JobSet is deleted. Either
        way the ``Stalled`` event names the stuck ranks, from the stacks each rank wrote to its log by then
        (:mod:`trainjob.torch.watchdog`)."""
        meta = job["metadata"]
        budget = int(((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts") or 0)
        try:
            policy = stall_policy(meta.get("annotations"), max_restarts=budget)
        except ValidationError as exc:  # checked at submit by trainjob; a job made another way is told here
            self._fail(job, old, "InvalidStallTimeout", f"{exc} (fix the annotation and create the job again)", now)
            return 0.0
        # A report counts when this process sees a new one arrive, by its own clock: the pod's clock (which stamps
        # lastUpdatedTime) may be off by any amount, and a skewed node must not make a healthy job look stuck.
        key, uid = (meta["namespace"], meta["name"]), meta.get("uid", "")
        seen_uid, seen, clock = self._clocks.get(key) or (uid, None, ProgressClock())
        if seen_uid != uid:  # a namesake of a job that went
            seen, clock = None, ProgressClock()
        trainer_status = new.get("trainerStatus") or {}
        if trainer_status.get("lastUpdatedTime") and trainer_status != seen:
            clock.saw([now])
            seen = trainer_status
        self._clocks[key] = (uid, seen, clock)
        overdue = clock.overdue(policy, now)
        if overdue is None:
            limit = policy.limit(clock.longest)
            armed = clock.last is not None and (policy.timeout is not None or clock.longest is not None)
            return clock.last + limit - now + 0.5 if armed and limit is not None and clock.last is not None else None
        silent, limit = overdue
        stuck = f"no progress for {silent:.1f} s (limit {limit:.1f} s: {policy.explain(clock.longest)}): the job is stuck"
        named = self._name_stuck_ranks(meta["namespace"], meta["name"], jobset)
        stuck += f": {named}" if named else " (no rank wrote its stacks to its log)"
        annotations = meta.get("annotations") or {}
        restarted = int(annotations.get(STALL_RESTARTS_ANNOTATION, "0") or 0)
        spent = restarted + int((jobset.get("status") or {}).get("restarts") or 0)
        namespace, name = meta["namespace"], meta["name"]
        if policy.action == "restart" and spent < budget:
            message = (f"{stuck}; restarting its node group (restart {spent + 1} of {budget}), from its last "
                       "checkpoint when the script keeps one")
            # the count first: were the pods evicted and the count then lost, the next stall would restart again
            # past the budget
            self._stored(TRAINJOBS, self.api.patch(
                TRAINJOBS, namespace, name, {"metadata": {"annotations": {STALL_RESTARTS_ANNOTATION: str(restarted + 1)}}}
            ))
            self.api.post_event(job, "Warning", "Stalled", message)
            for pod in self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"):
                if not pod["metadata"].get("deletionTimestamp") and \
                        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    self.api.evict(namespace, pod["metadata"]["name"])
            # unarmed until the new group reports: the last report of the old one does not count
            self._clocks[key] = (uid, trainer_status, ProgressClock())
            log.info("TrainJob %s/%s stalled: node group restarted (%d of %d)", namespace, name, spent + 1, budget)
            return None
        if policy.action == "restart":
            stuck += f"; no restart left ({spent} of {budget} spent)"
        message = f"{stuck}; its JobSet was deleted"
        self._clocks.pop(key, None)
        self._delete_children(namespace, name)
        self._write_status(namespace, name, old, st.failed(new, "Stalled", message, now))
        self.api.post_event(job, "Warning", "Stalled", message)
        return 0.0

    def _name_stuck_ranks(self, namespace: str, name: str, jobset: dict[str, Any]) -> str | None:
        """Which ranks the stalled job waits for, and where they are, from the stacks the ranks wrote to their
        pods' logs (:func:`trainjob.stall_dumps.dumps_in_log`); ``None`` when none did."""
        dumps: dict[int, str] = {}
        try:
            pods = trainer_pods(self.api.list_pods(namespace, f"{JOBSET_NAME_LABEL}={name}"), trainer_name(jobset))
            for pod in pods.values():
                if (pod.get("status") or {}).get("phase") == "Running":
                    dumps.update(dumps_in_log(self.api.read_log(namespace, pod, _container_name(pod), tail_lines=5000)))
        except TrainJobError as exc:  # the stacks are best effort: the stall is acted on either way
            log.warning("cannot read the stacks of stalled TrainJob %s/%s: %s", namespace, name, exc)
        if not dumps:
            return None
        summary = find_stuck_ranks([RankStacks(rank, text) for rank, text in sorted(dumps.items())]).summary
        # A static job's ranks are all known: one that wrote nothing is named first, as the likeliest culprit.
        launch = json.loads(((jobset.get("metadata") or {}).get("annotations") or {}).get(LAUNCH_ANNOTATION) or "{}")
        if launch.get("elastic") or not launch.get("numNodes") or not launch.get("numProcPerNode"):
            return summary
        silent = sorted(set(range(int(launch["numNodes"]) * int(launch["numProcPerNode"]))) - set(dumps))
        if not silent:
            return summary
        which = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {', '.join(map(str, silent))}"
        return (f"{which} wrote no stacks (a rank writes them only when it reports through trainjob.torch.report, "
                f"and not while it holds the GIL); of the others: {summary}")

    def _delete_children(self, namespace: str, name: str) -> None:
        for ref in (JOBSETS, COSCHEDULING_PODGROUPS, VOLCANO_PODGROUPS):
            try:
                self.api.delete(ref, namespace, name)
            except TrainJobError as exc:  # PodGroup CRDs need not be installed
                if ref is JOBSETS:
                    raise
                log.debug("not deleting %s %s/%s: %s", ref.kind, namespace, name, exc)

    def _fail(
        self, job: dict[str, Any], status: dict[str, Any], reason: str, message: str, now: float
    ) -> None:
        meta = job["metadata"]
        self._write_status(meta["namespace"], meta["name"], status, st.failed(status, reason, message, now))
        self.api.post_event(job, "Warning", reason, message)
        log.info("TrainJob %s/%s failed: %s: %s", meta["namespace"], meta["name"], reason, message)

    def _settling(self, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any],
                  now: float) -> float | None:
        """Seconds to wait before writing ``new`` when it differs from ``old`` only in ``jobsStatus`` (pods
        starting or ending one by one, which JobSet reports in bursts) and the job's status was written less than
        :data:`STATUS_SETTLE_SECONDS` ago; ``None``: write now. Conditions are never held back."""
        if new == old or {k: v for k, v in new.items() if k != "jobsStatus"} != \
                {k: v for k, v in old.items() if k != "jobsStatus"}:
            return None
        last = self._written.get((namespace, name))
        if last is None or now - last >= STATUS_SETTLE_SECONDS:
            return None
        return STATUS_SETTLE_SECONDS - (now - last)

    def _write_status(self, namespace: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        if new == old:
            return
        self._written[(namespace, name)] = self.clock()
        if len(self._written) > 50_000:  # forget the oldest half
            for key in sorted(self._written, key=self._written.__getitem__)[:25_000]:
                del self._written[key]
        patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
        for k, v in patch.items():  # an object replaced (trainerStatus): the fields it no longer has go too
            if isinstance(v, dict) and isinstance(old.get(k), dict):
                patch[k] = {**{gone: None for gone in old[k] if gone not in v}, **v}
        patch.update({k: None for k in old if k not in new})  # merge-patch deletes with null
        self._stored(TRAINJOBS, self.api.patch_status(TRAINJOBS, namespace, name, patch))


def _not_installed(obj: dict[str, Any]) -> str:
    api_version, kind = obj["apiVersion"], obj["kind"]
    if api_version == VOLCANO_PODGROUPS.api_version:
        hint = "install Volcano, or use a runtime without podGroupPolicy.volcano"
    elif api_version == COSCHEDULING_PODGROUPS.api_version:
        hint = (
            "install the scheduler-plugins coscheduling PodGroup CRD, or use a runtime without podGroupPolicy"
        )
    elif kind == JOBSETS.kind:
        hint = "install JobSet (https://jobset.sigs.k8s.io/docs/installation/)"
    else:
        hint = f"install the CRD that serves {api_version}"
    return f"the cluster does not serve {kind} ({api_version}): {hint}, then create the TrainJob again"


def _owned_by(child: dict[str, Any], job: dict[str, Any]) -> bool:
    return any(
        ref.get("uid") == job["metadata"]["uid"] for ref in child["metadata"].get("ownerReferences") or []
    )


def _left_by_a_namesake(child: dict[str, Any]) -> bool:
    """Owned by a TrainJob of the same name (so by one that was deleted: ours has another uid)."""
    name = child["metadata"]["name"]
    return any(
        ref.get("kind") == TRAINJOBS.kind and ref.get("name") == name
        for ref in child["metadata"].get("ownerReferences") or []
    )


#: Resources the API server lets a pod overcommit (everything else needs limits equal to requests).
_OVERCOMMITTABLE = {"cpu", "memory", "ephemeral-storage"}


def _containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(replicated job name, container) for every container of the JobSets in ``objects``."""
    out = []
    for obj in objects:
        if obj.get("kind") != JOBSETS.kind:
            continue
        for rj in (obj.get("spec") or {}).get("replicatedJobs") or []:
            pod_spec = (((rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
                out.append((str(rj.get("name")), container))
    return out


def keep_log_tail_on_error(objects: list[dict[str, Any]]) -> None:
    """``terminationMessagePolicy: FallbackToLogsOnError`` where the runtime sets none, so a failed container's
    status keeps the end of its log (the traceback) for the job's failure message."""
    for _, container in _containers(objects):
        container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")


def limit_extended_resources(objects: list[dict[str, Any]]) -> list[str]:
    """Give extended resources requested without a limit (``nvidia.com/gpu: 8``) an equal limit, in place.

    The API server refuses a pod whose non-overcommittable resources lack ``limits`` equal to ``requests``
    ("Limit must be set for non overcommitable resources"); Kubeflow's examples request GPUs only. Returns one
    line per container changed, for an Event."""
    changes = []
    for rj_name, container in _containers(objects):
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        added = {k: v for k, v in requests.items() if k not in _OVERCOMMITTABLE and k not in limits}
        if added:
            container["resources"] = {**resources, "limits": {**limits, **added}}
            listed = ", ".join(f"{k}={v}" for k, v in added.items())
            changes.append(
                f"{rj_name}/{container.get('name')}: set limits {listed} equal to the requests "
                "(Kubernetes needs limits for extended resources)"
            )
    return changes


def _grew(message: str) -> bool | None:
    """Whether ``Resized A -> B nodes ...`` grew the job (``None`` when the numbers cannot be read)."""
    words = message.split()
    try:
        return int(words[3]) > int(words[1])
    except (IndexError, ValueError):
        return None


def _inject_stall_dumps(jobset: dict[str, Any], job: dict[str, Any]) -> None:
    """Tell every container of ``jobset``'s pods when a rank that stops reporting writes its stacks to its log
    (``TRAINJOB_STALL_DUMP``; a variable the container sets itself is kept)."""
    try:
        policy = stall_policy((job.get("metadata") or {}).get("annotations"), max_restarts=1)
    except ValidationError:  # the watchdog fails the job with the reason once it runs
        return
    variable = {"name": STALL_DUMP_ENV, "value": dump_setting(policy)}
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = ((rj.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        for container in pod.get("containers") or []:
            if not any(e.get("name") == STALL_DUMP_ENV for e in container.get("env") or []):
                container["env"] = [*(container.get("env") or []), variable]


def _trainer_started(jobset: dict[str, Any], trainer: str) -> bool:
    """Whether any pod of the trainer replicated job has run (so node 0 may have logged progress)."""
    for entry in (jobset.get("status") or {}).get("replicatedJobsStatus") or []:
        if entry.get("name") == trainer and any(entry.get(k) for k in ("active", "ready", "succeeded", "failed")):
            return True
    return False


def _container_name(pod: dict[str, Any]) -> str:
    """The trainer container of a node pod: ``node``, else the pod's first container."""
    containers = (pod.get("spec") or {}).get("containers") or []
    names = [c.get("name") for c in containers]
    return DEFAULT_TRAINER if DEFAULT_TRAINER in names or not names else str(names[0])


def trainer_name(jobset: dict[str, Any]) -> str:
    """The replicated job that runs the trainer: labelled ``trainjob-ancestor-step: trainer``, else ``node``."""
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        labels = ((rj.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_STEP_LABEL) == "trainer":
            return str(rj["name"])
    return DEFAULT_TRAINER
