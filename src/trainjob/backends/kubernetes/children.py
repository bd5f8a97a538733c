"""A TrainJob's children, the JobSet (and PodGroup) it runs as: rendered from its runtime snapshot, created owned
by the job, kept suspended or resumed as the job says, deleted when the job fails.

The runtime the job references is copied, signed, into the JobSet's annotations in the same create
(:mod:`.snapshot`), so editing the runtime later never changes the job, not even when someone deletes its JobSet
and it is built again. Before the create every container gets ``terminationMessagePolicy:
FallbackToLogsOnError`` (for :mod:`.rootcause`), limits equal to its extended-resource requests (the API server
needs them), the stall-dump setting (:mod:`trainjob.backends.stall`) and, with a status endpoint, its client
(:mod:`.status_server`). Of an existing JobSet only ``spec.suspend`` is changed, and on resume the pod template
fields a queue such as Kueue sets at admission::

    children = Children(api, signer, CachedReads(api, cache), writer, events)
    jobset, again_in = children.ensure(job, status, now)   # (None, again_in): this pass ends here
    delete_children(api, "ml", "mnist")

A job whose children cannot be made (unknown runtime, invalid spec, CRD not installed, rejected) is failed with
the reason and what to change.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from trainjob.api import TrainJob, resource_from_dict
from trainjob.backends.kubernetes.cache import CachedReads
from trainjob.backends.kubernetes.disruptions import Disruptions, disruption_hazards
from trainjob.backends.kubernetes.initializer_pods import (
    DEFAULTS_CONFIGMAP,
    initializer_image,
    use_trainjob_initializers,
)
from trainjob.backends.kubernetes.job_events import JobEvents
from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.resources import (
    API_GROUP,
    CLUSTER_TRAINING_RUNTIMES,
    CONFIGMAPS,
    COSCHEDULING_PODGROUPS,
    JOBSETS,
    OPERATOR_NAMESPACE,
    RUNTIME_KINDS,
    TRAINJOB_NAME_LABEL,
    TRAINJOBS,
    VOLCANO_PODGROUPS,
)
from trainjob.backends.kubernetes.snapshot import SnapshotSigner, has_snapshot
from trainjob.backends.kubernetes.status_server import (
    CA_ANNOTATION,
    NamespaceCA,
    StatusEndpoint,
    inject_status_client,
)
from trainjob.backends.kubernetes.status_writer import StatusWriter
from trainjob.backends.kubernetes.workspace import add_workspace_claim
from trainjob.backends.stall import dump_setting, stall_policy
from trainjob.constants import LAUNCH_ANNOTATION, STALL_DUMP_ENV
from trainjob.errors import AlreadyExistsError, TrainJobError, ValidationError
from trainjob.runtime import resolve
from trainjob.runtime.launch import LaunchValues, resolve_launch_values
from trainjob.runtime.render import render_objects

log = logging.getLogger("trainjob.operator")

#: Resources the API server lets a pod overcommit (everything else needs limits equal to requests).
_OVERCOMMITTABLE = {"cpu", "memory", "ephemeral-storage"}


class Children:
    """Makes and keeps a TrainJob's JobSet and PodGroup."""

    def __init__(self, api: KubeApi, signer: SnapshotSigner, reads: CachedReads, writer: StatusWriter,
                 events: JobEvents, status_endpoint: StatusEndpoint | None = None) -> None:
        self.api = api
        self.signer = signer
        self.reads = reads
        self.writer = writer
        self.events = events
        self.status_endpoint = status_endpoint
        self.namespace_ca = None if status_endpoint is None else NamespaceCA(
            api, status_endpoint.ca_pem, status_endpoint.ca_owner)
        #: The image Kubeflow's initializer images run as (:mod:`.initializer_pods`); ``None``: left as named.
        self.initializer_image = initializer_image()
        #: marks the pods a suspension stops, so that no exit of theirs fails the job (:mod:`.disruptions`)
        self.disruptions = Disruptions(api)

    def _initializer_env(self) -> dict[str, str]:
        """The data of ConfigMap :data:`~.initializer_pods.DEFAULTS_CONFIGMAP` (none: no settings)."""
        try:
            found = self.api.get(CONFIGMAPS, OPERATOR_NAMESPACE, DEFAULTS_CONFIGMAP)
        except ApiError as exc:
            log.warning("cannot read ConfigMap %s/%s: %s", OPERATOR_NAMESPACE, DEFAULTS_CONFIGMAP, exc)
            return {}
        return {str(k): str(v) for k, v in ((found or {}).get("data") or {}).items()}

    def ensure(self, job: dict[str, Any], status: dict[str, Any],
               now: float) -> tuple[dict[str, Any] | None, float | None]:
        """The job's JobSet, created when missing and suspended or resumed as the job is; ``(None, again_in)``
        when the pass ends here (the job failed, or a JobSet of the same name must go first)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        jobset = self.reads.read(JOBSETS, namespace, name)
        if jobset is not None and not owned_by(jobset, job):
            if left_by_a_namesake(jobset):
                return None, 1.0  # a deleted TrainJob of the same name: the API server's GC removes its JobSet
            message = (f"a JobSet {name!r} that this TrainJob did not create exists in namespace {namespace!r}; "
                       "delete it or give the TrainJob another name")
            self.writer.fail(job, status, "JobSetConflict", message, now)
            return None, None
        if jobset is not None:
            self.events.announce_if_missed(job, status, jobset)
            return self._suspended_as_the_job(job, jobset, now), None
        if status.get("jobsStatus"):  # it existed: someone else deleted it
            self.api.post_event(job, "Warning", "JobSetRecreated",
                                f"JobSet {name!r} was deleted by someone else; creating it again (training restarts, "
                                "from its last checkpoint when the script keeps one)")
        snapshot = self.snapshot(job, status, now)
        jobset = self.build(job, status, snapshot, now) if snapshot is not None else None
        if jobset is None:
            return None, None
        if not owned_by(jobset, job):  # the create met one the cache had not shown yet
            return None, 1.0 if left_by_a_namesake(jobset) else 0.0
        return jobset, None

    def _suspended_as_the_job(self, job: dict[str, Any], jobset: dict[str, Any], now: float) -> dict[str, Any]:
        """Mirror ``spec.suspend`` to the JobSet; a resumed one also gets the templates its admission chose. The
        pods a suspension stops are marked ``DisruptionTarget`` first, and once more after (a pod made meanwhile),
        so that no exit code of theirs fails the job (:mod:`.disruptions`)."""
        suspend = bool((job.get("spec") or {}).get("suspend"))
        if bool((jobset.get("spec") or {}).get("suspend")) == suspend:
            return jobset
        if suspend:
            self.disruptions.before_suspend(job, now)
        change: dict[str, Any] = {"suspend": suspend}
        if not suspend:  # resumed: admitted (Kueue) with the node selectors and tolerations it chose
            templates = self.admitted_templates(job, jobset)
            if templates is not None:
                change["replicatedJobs"] = templates
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        stored = self.reads.stored(JOBSETS, self.api.patch(JOBSETS, namespace, name, {"spec": change})) or jobset
        if suspend:
            self.disruptions.before_suspend(job, now)
        return stored

    def snapshot(self, job: dict[str, Any], status: dict[str, Any], now: float) -> dict[str, Any] | None:
        """The runtime snapshot to build the job's JobSet from: the signed one the job's deleted JobSet carried (or
        one signed on the job itself), else a fresh copy of the referenced runtime. An unsigned snapshot
        annotation on the job is replaced by the signed fresh one, with a Warning."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        snapshot = self.signer.verified(job)  # compat: a snapshot signed on the job; can go once no TrainJob has one
        if snapshot is not None:
            return snapshot
        gone = self.reads.read_deleted(JOBSETS, namespace, name)
        if gone is not None and owned_by(gone, job):
            snapshot = self.signer.verified(job, gone)
            if snapshot is not None:
                return snapshot
        snapshot = self._snapshot_runtime(job, status, now)
        if snapshot is None or not has_snapshot(job):
            return snapshot
        annotation = {"metadata": {"annotations": self.signer.annotations(job, snapshot)}}
        if self.reads.stored(TRAINJOBS, self.api.patch(TRAINJOBS, namespace, name, annotation)) is None:
            return None  # deleted meanwhile
        self.api.post_event(job, "Warning", "RuntimeSnapshotReplaced",
                            "the runtime-snapshot annotation was not written by the operator (it is signed) and was "
                            f"replaced by a snapshot of {snapshot['kind']} {snapshot['name']!r}")
        return snapshot

    def _snapshot_runtime(self, job: dict[str, Any], status: dict[str, Any], now: float) -> dict[str, Any] | None:
        namespace = job["metadata"]["namespace"]
        ref = (job.get("spec") or {}).get("runtimeRef") or {}
        kind = ref.get("kind") or CLUSTER_TRAINING_RUNTIMES.kind
        group = ref.get("apiGroup") or API_GROUP
        runtime_ref = RUNTIME_KINDS.get(kind)
        if group != API_GROUP or runtime_ref is None:
            self.writer.fail(job, status, "InvalidRuntimeRef",
                             f"spec.runtimeRef: must reference a {API_GROUP} ClusterTrainingRuntime or "
                             f"TrainingRuntime, got apiGroup={group!r} kind={kind!r}", now)
            return None
        where_ns = namespace if runtime_ref.namespaced else None
        runtime = self.reads.read(runtime_ref, where_ns, ref.get("name", ""))
        if runtime is None:
            where = f" in namespace {namespace!r}" if runtime_ref.namespaced else ""
            known = sorted(r["metadata"]["name"] for r in self.api.list(runtime_ref, where_ns))
            self.writer.fail(job, status, "RuntimeNotFound",
                             f"spec.runtimeRef.name: {kind} {ref.get('name')!r} not found{where}; "
                             f"available: {', '.join(known) or 'none'} (create the runtime, then create the "
                             "TrainJob again)", now)
            return None
        return {
            "kind": kind,
            "name": runtime["metadata"]["name"],
            "resourceVersion": runtime["metadata"].get("resourceVersion"),
            "labels": runtime["metadata"].get("labels") or {},
            "spec": runtime.get("spec") or {},
        }

    def build(self, job: dict[str, Any], status: dict[str, Any], snapshot: dict[str, Any],
              now: float) -> dict[str, Any] | None:
        """Render and create the job's objects; the JobSet, or ``None`` when the job cannot run (it is failed
        then)."""
        try:
            objects, limits_set, launch = render(job, snapshot, self.initializer_image, self._initializer_env)
        except ValidationError as exc:
            self.writer.fail(job, status, "InvalidTrainJob", f"{exc} (fix the TrainJob and create it again)", now)
            return None
        except Exception as exc:  # a runtime the framework cannot render: retrying cannot help
            log.exception("cannot render TrainJob %s/%s", job["metadata"]["namespace"], job["metadata"]["name"])
            message = f"cannot render the runtime: {type(exc).__name__}: {str(exc)[:300]} (fix the runtime)"
            self.writer.fail(job, status, "InvalidRuntime", message, now)
            return None
        created: dict[str, Any] = {}
        made_jobset = False
        for obj in objects:
            if obj["kind"] == JOBSETS.kind:  # the snapshot and launch values travel with the JobSet's create
                if self.status_endpoint is not None and self.namespace_ca is not None:
                    self.namespace_ca.ensure(obj["metadata"]["namespace"])
                    inject_status_client(obj, self.status_endpoint)
                _inject_stall_dumps(obj, job, status_client=self.status_endpoint is not None)
                obj["metadata"].setdefault("annotations", {}).update(self.signer.annotations(job, snapshot))
                obj["metadata"]["annotations"][LAUNCH_ANNOTATION] = json.dumps(launch.to_dict(), sort_keys=True)
            try:
                created = self.api.create(obj)
                made_jobset = made_jobset or obj["kind"] == JOBSETS.kind
                if obj["kind"] == JOBSETS.kind:
                    self.reads.stored(JOBSETS, created)
            except AlreadyExistsError:  # a previous pass got this far, or the cache had not shown it yet
                existing = self.api.get(JOBSETS, obj["metadata"]["namespace"], obj["metadata"]["name"]) \
                    if obj["kind"] == JOBSETS.kind else None
                created = self.reads.stored(JOBSETS, existing) or obj
            except ApiError as exc:
                if exc.status == 404:  # the kind is not served
                    self.writer.fail(job, status, "CRDNotInstalled", _not_installed(obj), now)
                    return None
                if exc.status in (400, 403, 422):  # refused as invalid (or forbidden): retrying cannot help
                    self.writer.fail(job, status, "JobSetRejected", f"{exc} (fix the runtime or the TrainJob)", now)
                    return None
                raise
        if made_jobset:
            self.writer.jobset_created(job["metadata"]["namespace"], job["metadata"]["name"])
            for change in limits_set:
                self.api.post_event(job, "Normal", "ExtendedResourceLimitsSet", change)
            for warning in disruption_hazards(created):
                self.api.post_event(job, "Warning", "DisruptionFailsJob", warning)
            self.events.announce(job, created)
            log.info("created JobSet %s/%s", job["metadata"]["namespace"], job["metadata"]["name"])
        elif owned_by(created, job):
            self.events.announce_if_missed(job, status, created)  # the create met a JobSet an ended pass made
        return created

    def admitted_templates(self, job: dict[str, Any], jobset: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The suspended JobSet's ``replicatedJobs`` with the pod template fields a queue sets at admission (labels,
        annotations, node selector, tolerations, scheduling gates: what JobSet lets change while suspended) as the
        TrainJob says them now (Kueue writes them into ``podTemplateOverrides`` before it resumes the job, and takes
        them back out when it suspends it); ``None`` when they are as they were. Everything else stays as stored."""
        snapshot = self.signer.verified(job, jobset)
        if snapshot is None:
            return None
        try:
            objects, _, _ = render(job, snapshot, self.initializer_image)
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
                legacy_ca = ((have_template.get("metadata") or {}).get(key) or {}).get(CA_ANNOTATION)
                if legacy_ca is not None:  # the pods of a JobSet made by an earlier version read the CA from it
                    want = {**want, CA_ANNOTATION: legacy_ca}
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


def render(job: dict[str, Any], snapshot: dict[str, Any], initializer_image: str | None = None,
           initializer_env: Callable[[], dict[str, str]] | None = None,
           ) -> tuple[list[dict[str, Any]], list[str], LaunchValues]:
    """The objects the runtime framework renders for ``job`` from ``snapshot`` (PodGroup first, then JobSet), owned
    by the job; the extended-resource limits it had to set; the launch values the job resolved to.
    ``initializer_image``: Kubeflow's initializer images run as trainjob's, from it; ``initializer_env``: what
    gives the cluster's settings for every initializer, asked only for a job that has one (:mod:`.initializer_pods`)."""
    meta = job["metadata"]
    model = TrainJob.from_dict({
        "apiVersion": TRAINJOBS.api_version,
        "kind": TRAINJOBS.kind,
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k)},
        "spec": job.get("spec") or {},
    })
    runtime_doc = {
        "apiVersion": TRAINJOBS.api_version,
        "kind": snapshot["kind"],
        "metadata": {"name": snapshot["name"], "labels": snapshot.get("labels") or {}},
        "spec": snapshot["spec"],
    }
    if snapshot["kind"] == "TrainingRuntime":
        runtime_doc["metadata"]["namespace"] = meta["namespace"]
    plan = resolve(model, resource_from_dict(runtime_doc))
    objects = render_objects(plan)
    changes = limit_extended_resources(objects)
    keep_log_tail_on_error(objects)
    for obj in list(objects):
        if obj["kind"] == JOBSETS.kind:
            use_trainjob_initializers(obj, initializer_image, initializer_env)
            claim = add_workspace_claim(obj, meta.get("annotations"))
            if claim is not None:
                objects.insert(0, claim)
    for obj in objects:
        obj_meta = obj.setdefault("metadata", {})
        obj_meta["namespace"] = meta["namespace"]
        obj_meta.setdefault("labels", {})[TRAINJOB_NAME_LABEL] = meta["name"]
        obj_meta["ownerReferences"] = [owner_reference(job)]
        if obj["kind"] == JOBSETS.kind:  # created suspended when the job is, so no pod starts early
            obj.setdefault("spec", {})["suspend"] = bool((job.get("spec") or {}).get("suspend"))
    return sorted(objects, key=lambda o: o["kind"] == JOBSETS.kind), changes, resolve_launch_values(plan)


def delete_children(api: KubeApi, namespace: str, name: str) -> None:
    """Delete the job's JobSet and PodGroup (a PodGroup kind the cluster does not serve is passed over)."""
    for ref in (JOBSETS, COSCHEDULING_PODGROUPS, VOLCANO_PODGROUPS):
        try:
            api.delete(ref, namespace, name)
        except TrainJobError as exc:  # PodGroup CRDs need not be installed
            if ref is JOBSETS:
                raise
            log.debug("not deleting %s %s/%s: %s", ref.kind, namespace, name, exc)


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The controller reference that makes deleting ``job`` delete the object that carries it."""
    meta = job["metadata"]
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": TRAINJOBS.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_by(child: dict[str, Any], job: dict[str, Any]) -> bool:
    return any(ref.get("uid") == job["metadata"]["uid"] for ref in child["metadata"].get("ownerReferences") or [])


def left_by_a_namesake(child: dict[str, Any]) -> bool:
    """Owned by a TrainJob of the same name (so by one that was deleted: ours has another uid)."""
    name = child["metadata"]["name"]
    return any(ref.get("kind") == TRAINJOBS.kind and ref.get("name") == name
               for ref in child["metadata"].get("ownerReferences") or [])


def _not_installed(obj: dict[str, Any]) -> str:
    api_version, kind = obj["apiVersion"], obj["kind"]
    if api_version == VOLCANO_PODGROUPS.api_version:
        hint = "install Volcano, or use a runtime without podGroupPolicy.volcano"
    elif api_version == COSCHEDULING_PODGROUPS.api_version:
        hint = "install the scheduler-plugins coscheduling PodGroup CRD, or use a runtime without podGroupPolicy"
    elif kind == JOBSETS.kind:
        hint = "install JobSet (https://jobset.sigs.k8s.io/docs/installation/)"
    else:
        hint = f"install the CRD that serves {api_version}"
    return f"the cluster does not serve {kind} ({api_version}): {hint}, then create the TrainJob again"


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


def _inject_stall_dumps(jobset: dict[str, Any], job: dict[str, Any], status_client: bool) -> None:
    """Tell every container of ``jobset``'s pods when a rank that stops reporting writes its stacks to its log
    (``TRAINJOB_STALL_DUMP``; a variable the container sets itself is kept). Pods with the status client
    (``status_client``: ``TRAINJOB_COLLECTIVES_URL`` set) take ``auto`` without it, so they are not given it."""
    try:
        policy = stall_policy((job.get("metadata") or {}).get("annotations"), max_restarts=1)
    except ValidationError:  # the stall watch fails the job with the reason once it runs
        return
    setting = dump_setting(policy)
    if setting == "auto" and status_client:
        return
    variable = {"name": STALL_DUMP_ENV, "value": setting}
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod = ((rj.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        for container in pod.get("containers") or []:
            if not any(e.get("name") == STALL_DUMP_ENV for e in container.get("env") or []):
                container["env"] = [*(container.get("env") or []), variable]
