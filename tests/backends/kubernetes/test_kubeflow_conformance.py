"""trainjob's operator against Kubeflow Trainer's own controller manager (v2.1.0, built from its Go module), one
after the other on the same control plane and the same inputs.

For every case of the table (:func:`kubetest.conformance.load_cases`) each controller creates its JobSet (and
PodGroup); the two are diffed after removing what differs between any two creations. Every difference left must be
a row of ``docs/kubeflow-compatibility.md``, and every row must still be seen, so a new difference (or a fixed one)
fails here until the document says so. The same holds for the TrainJob ``status`` each controller writes.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubetest.cluster import TrainJobCluster, no_retries, wait_for
from kubetest.conformance import (
    Case,
    Difference,
    diff,
    documented,
    load_cases,
    normalise,
    prepare,
    unexplained,
)
from kubetest.kubeflow import KubeflowController

from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    COSCHEDULING_PODGROUPS,
    JOBSETS,
    RUNTIME_KINDS,
    TRAINJOBS,
    VOLCANO_PODGROUPS,
)
from trainjob.backends.kubernetes.status import find_condition, is_true
from trainjob.errors import BackendError

CONTROLLERS = ("kubeflow", "trainjob")
#: An image the test registry does not have (a typo in a tag, as users make them).
BAD_IMAGE = "registry.trainjob.test/trainjob/trainjob-trian:v1"
#: How long Kubeflow's bad-image job is watched (trainjob's fails well within it).
BAD_IMAGE_WAIT = 60.0
#: Created objects compared for each TrainJob, all named after it.
COMPARED = {"JobSet": JOBSETS, "PodGroup (coscheduling)": COSCHEDULING_PODGROUPS, "PodGroup (volcano)": VOLCANO_PODGROUPS}


@dataclass
class Outcome:
    """What one controller made of one case's job."""

    namespace: str
    created: dict[str, Any] = field(default_factory=dict)  # kind -> object (or None)
    rejected: str | None = None  # the API server's (or an admission webhook's) answer to the create
    status: dict[str, Any] = field(default_factory=dict)


def _create_all(k8s: TrainJobCluster, objects: list[dict[str, Any]]) -> str | None:
    for obj in objects:
        ref = RUNTIME_KINDS.get(obj["kind"], TRAINJOBS)
        if obj["kind"] == "ClusterTrainingRuntime" and k8s.api.get(ref, None, obj["metadata"]["name"]):
            continue  # the same cluster runtime serves both controllers
        deadline = time.monotonic() + 30
        while True:
            try:
                k8s.api.create(obj, ref)
                break
            except BackendError as exc:
                # Kubeflow's webhook checks the runtime in its informer cache, which may not have the runtime
                # created a moment ago yet: that refusal is a race of the harness, not an answer about the job.
                if "must be created before" in str(exc) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                return f"{obj['kind']} {obj['metadata']['name']}: {exc}"
    return None


def _run(k8s: TrainJobCluster, cases: list[Case], controller: str) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for case in cases:
        namespace = f"{controller[:2]}-{case.name}"[:63]
        k8s.cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
        outcomes[case.name] = Outcome(namespace, rejected=_create_all(k8s, prepare(case, namespace)))
    for case in cases:
        outcome = outcomes[case.name]
        if outcome.rejected:
            continue
        (job,) = case.jobs
        name = job["metadata"]["name"]

        def settled(name: str = name, namespace: str = outcome.namespace) -> bool:
            current = k8s.api.get(TRAINJOBS, namespace, name) or {}
            conditions = {c["type"] for c in (current.get("status") or {}).get("conditions") or []}
            return k8s.api.get(JOBSETS, namespace, name) is not None or "Failed" in conditions

        with contextlib.suppress(AssertionError):  # then recorded as no JobSet; the diff says so
            wait_for(settled, 60, f"{controller}: a JobSet or a Failed condition for case {case.name}")
    _settle(k8s, [o.namespace for o in outcomes.values() if not o.rejected])
    for case in cases:
        outcome = outcomes[case.name]
        if outcome.rejected:
            continue
        name = case.jobs[0]["metadata"]["name"]
        for kind, ref in COMPARED.items():
            try:
                obj = k8s.api.get(ref, outcome.namespace, name)
            except BackendError:  # the kind is not served
                obj = None
            outcome.created[kind] = normalise(obj, outcome.namespace)
        status = (k8s.api.get(TRAINJOBS, outcome.namespace, name) or {}).get("status") or {}
        outcome.status = normalise({"spec": status}, outcome.namespace)["spec"]  # type: ignore[index]
    return outcomes


def _settle(k8s: TrainJobCluster, namespaces: list[str], quiet: float = 3.0, timeout: float = 60.0) -> None:
    """Until no TrainJob or JobSet in ``namespaces`` has changed for ``quiet`` seconds and every TrainJob's
    ``jobsStatus`` says what its JobSet's ``replicatedJobsStatus`` says (:func:`_mirrors`): the controller's later
    writes (the JobSet's status, then the TrainJob's) have landed. On a busy machine JobSet's controller can take
    longer than ``quiet`` to count a new JobSet's Jobs; the controller under test is then given the time to follow
    (``timeout`` at most: one that never does is recorded as it is, and the comparison says so)."""

    def state() -> tuple[list[str], bool]:
        jobs = {(ns, o["metadata"]["name"]): o for ns in namespaces for o in k8s.api.list(TRAINJOBS, ns)}
        jobsets = {(ns, o["metadata"]["name"]): o for ns in namespaces for o in k8s.api.list(JOBSETS, ns)}
        versions = sorted(o["metadata"]["resourceVersion"] for o in (*jobs.values(), *jobsets.values()))
        return versions, all(_mirrors(job, jobsets[key]) for key, job in jobs.items() if key in jobsets)

    deadline = time.monotonic() + timeout
    (last, mirrored), since = state(), time.monotonic()
    while time.monotonic() < deadline and (time.monotonic() - since < quiet or not mirrored):
        time.sleep(0.5)
        now, mirrored = state()
        if now != last:
            last, since = now, time.monotonic()


#: The counts a TrainJob's ``jobsStatus`` entry copies from its JobSet's ``replicatedJobsStatus``.
COUNTS = ("active", "ready", "succeeded", "failed", "suspended")


def _mirrors(job: dict[str, Any], jobset: dict[str, Any]) -> bool:
    """Whether ``job``'s ``jobsStatus`` holds ``jobset``'s counts, each replicated job's; an absent ``jobsStatus``
    holds counts that are all zero (trainjob writes none until one is not)."""

    def counts(entries: list[dict[str, Any]] | None) -> dict[str, tuple[int, ...]]:
        return {e["name"]: tuple(int(e.get(k) or 0) for k in COUNTS) for e in entries or []}

    theirs = counts((jobset.get("status") or {}).get("replicatedJobsStatus"))
    ours = counts((job.get("status") or {}).get("jobsStatus"))
    if not ours:
        return not any(any(c) for c in theirs.values())
    return ours == theirs


def _cleanup(k8s: TrainJobCluster, outcomes: dict[str, Outcome]) -> None:
    for outcome in outcomes.values():
        for job in k8s.api.list(TRAINJOBS, outcome.namespace):
            k8s.api.delete(TRAINJOBS, outcome.namespace, job["metadata"]["name"])


@pytest.fixture(scope="module")
def both_controllers(k8s: TrainJobCluster) -> dict[str, dict[str, Any]]:
    """Under trainjob's operator, then under Kubeflow's controller (trainjob's stopped meanwhile), each started and
    stopped once: every case's job (:func:`_run`), then the jobs of :func:`_life`."""
    k8s.cp.install_podgroup_crds()
    cases = load_cases(k8s.cp.manifests("kubeflow", "runtimes"))
    if not k8s.operator.alive():
        k8s.operator.start()
    ours = _run(k8s, cases, "trainjob")
    _cleanup(k8s, ours)
    our_life = _life(k8s, "trainjob")
    k8s.operator.stop()
    kubeflow = KubeflowController(k8s.cp)
    try:
        kubeflow.start()
        theirs = _run(k8s, cases, "kubeflow")
        _cleanup(k8s, theirs)
        their_life = _life(k8s, "kubeflow")
        assert kubeflow.alive(), f"Kubeflow's controller exited:\n{kubeflow.tail()}"
    finally:
        kubeflow.stop()
        k8s.operator.start()
        for runtime in k8s.api.list(CLUSTER_TRAINING_RUNTIMES, None):
            if any(runtime["metadata"]["name"].startswith(f"{c.name}-") for c in cases):
                k8s.api.delete(CLUSTER_TRAINING_RUNTIMES, None, runtime["metadata"]["name"])
    return {"cases": {"kubeflow": theirs, "trainjob": ours}, "life": {"kubeflow": their_life, "trainjob": our_life}}


@pytest.fixture(scope="module")
def side_by_side(both_controllers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Outcome]]:
    """Each case's JobSet (and PodGroup) and status, by controller."""
    return both_controllers["cases"]


def _differences(results: dict[str, dict[str, Outcome]], what: str) -> list[Difference]:
    out: list[Difference] = []
    for case, kf in results["kubeflow"].items():
        tj = results["trainjob"][case]
        if kf.rejected or tj.rejected:
            if kf.rejected != tj.rejected:
                out.append(Difference(case, "create", kf.rejected or "accepted", tj.rejected or "accepted"))
            continue
        if what == "objects":
            for kind in COMPARED:
                a, b = kf.created.get(kind), tj.created.get(kind)
                if (a is None) != (b is None):
                    out.append(Difference(case, kind, "created" if a else "not created", "created" if b else "not created"))
                elif a is not None:
                    out += [Difference(d.case, f"{kind}:{d.path}", d.kubeflow, d.trainjob) for d in diff(case, a, b)]
        else:
            out += diff(case, _comparable_status(kf.status), _comparable_status(tj.status), "status")
    return out


def _comparable_status(status: dict[str, Any]) -> dict[str, Any]:
    """Conditions keyed by type, without their times."""
    status = json.loads(json.dumps(status))
    conditions = status.pop("conditions", None) or []
    status["conditions"] = {
        c["type"]: {k: v for k, v in c.items() if k not in ("lastTransitionTime", "type")} for c in conditions
    }
    return status


def _check_against_doc(differences: list[Difference], section: str) -> None:
    rows = documented(section)
    left = unexplained(differences, rows)
    stale = [r for r in rows if r.seen == 0]
    message = []
    if left:
        message.append(
            f"{len(left)} difference(s) from Kubeflow Trainer not in docs/kubeflow-compatibility.md ({section}); "
            "fix them or add rows:\n" + "\n".join(d.row() for d in left)
        )
    if stale:
        message.append(
            "rows of docs/kubeflow-compatibility.md no longer seen (remove them):\n"
            + "\n".join(f"| {r.case} | `{r.path}` | `{r.kubeflow}` | `{r.trainjob}` |" for r in stale)
        )
    assert not message, "\n\n".join(message)


def test_every_case_ran_under_both_controllers(side_by_side: dict[str, dict[str, Outcome]]) -> None:
    kubeflow = side_by_side["kubeflow"]
    made = [c for c, o in kubeflow.items() if o.created.get("JobSet") is not None]
    # Kubeflow's controller built JobSets for (nearly) every case: the comparison compares something.
    assert len(made) >= len(kubeflow) - 2, {c: (o.rejected, list(o.created)) for c, o in kubeflow.items()}


def test_jobsets_and_podgroups_match_kubeflow(side_by_side: dict[str, dict[str, Outcome]]) -> None:
    _check_against_doc(_differences(side_by_side, "objects"), "JobSets and PodGroups")


def test_suspended_status_matches_kubeflow(side_by_side: dict[str, dict[str, Outcome]]) -> None:
    _check_against_doc(_differences(side_by_side, "status"), "Status of a suspended job")


# -- status through a job's life -----------------------------------------------------------------------------------

SCRIPT = str(Path(__file__).resolve().parent / "ddp_script.py")
#: When each TrainJob's status is recorded, and whether its ``jobsStatus`` is compared then (it is not while pods
#: come and go after a resume).
MILESTONES = {"running": True, "suspended": True, "resumed": False, "complete": True, "failed": True}


def _trainer(nodes: int, *args: str) -> dict[str, Any]:
    return {
        "numNodes": nodes,
        "command": ["torchrun", SCRIPT, *args],
        "resourcesPerNode": {"requests": {"cpu": "1"}},
    }


def _life(k8s: TrainJobCluster, controller: str) -> dict[str, dict[str, Any]]:
    """Three jobs in one namespace: one completes, one fails (rank 1 raises), one runs, is suspended and resumed.
    The status of each is recorded at each milestone, once the controller's writes have settled. A fourth names an
    image the registry does not have: its status is recorded under ``bad-image`` once it failed, or (as Kubeflow's
    controller never fails it) once it has waited :data:`BAD_IMAGE_WAIT` seconds, with its age and its pod's
    waiting reason."""
    namespace = f"{controller[:2]}-lifecycle"
    k8s.cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    runtime = k8s.namespaced_runtime(namespace, "no-retries", no_retries)
    pausable = k8s.namespaced_runtime(namespace, "no-retries-pausable", _pausable)
    jobs = {
        "done": _trainer(2, "--steps", "5"),
        "broken": _trainer(2, "--fail-rank", "1"),
        "pausing": _trainer(1, "--steps", "600", "--step-seconds", "0.5"),
        "bad-image": {"numNodes": 1, "image": BAD_IMAGE, "command": ["python", "-c", "pass"],
                      "resourcesPerNode": {"requests": {"cpu": "100m"}}},
    }
    for name, trainer in jobs.items():

        def created(name: str = name, trainer: dict[str, Any] = trainer) -> bool:
            try:
                k8s.create_job(name, namespace, runtime=pausable if name == "pausing" else runtime,
                               runtime_kind="TrainingRuntime", trainer=trainer)
            except BackendError as exc:  # Kubeflow's webhook answers from its cache, which may lag the runtime
                if "must be created before" not in str(exc):
                    raise
                return False
            return True

        wait_for(created, 30, f"{controller}: TrainJob {name} to be accepted")
    seen: dict[str, dict[str, Any]] = {}

    def record(milestone: str, job: str) -> None:
        _settle(k8s, [namespace])
        status = (k8s.job(job, namespace).get("status")) or {}
        seen[milestone] = normalise({"spec": status}, namespace)["spec"]  # type: ignore[index]

    def ready_pods() -> int:
        return sum(
            1
            for p in k8s.pods("pausing", namespace)
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
        )

    def jobset_counts(job: str) -> list[tuple[int, int]]:
        """(active, suspended) Jobs of each replicated job, as the job's JobSet counts them."""
        status = (k8s.api.get(JOBSETS, namespace, job) or {}).get("status") or {}
        return [(e.get("active") or 0, e.get("suspended") or 0) for e in status.get("replicatedJobsStatus") or []]

    try:
        wait_for(lambda: ready_pods() == 1, 300, f"{controller}: the pausing job's pod to be ready")
        wait_for(lambda: [j.get("ready") for j in (k8s.job("pausing", namespace).get("status") or {}).get(
            "jobsStatus") or []] == [1], 60, f"{controller}: the pausing job's status to count its ready pod")
        record("running", "pausing")
        k8s.api.patch(TRAINJOBS, namespace, "pausing", {"spec": {"suspend": True}})
        k8s.wait_for_condition("pausing", "Suspended", namespace=namespace, timeout=60)
        wait_for(lambda: not k8s.pods("pausing", namespace), 60, f"{controller}: the suspended job's pod to go")
        # JobSet counts its Job suspended and no longer active (the Job controller first counts the pod gone): the
        # state both controllers' statuses are recorded in, however long the two controllers upstream take.
        wait_for(lambda: jobset_counts("pausing") == [(0, 1)], 60,
                 f"{controller}: the suspended job's JobSet to count its Job suspended and none active")
        record("suspended", "pausing")
        k8s.api.patch(TRAINJOBS, namespace, "pausing", {"spec": {"suspend": False}})
        # Kubeflow leaves Suspended False after a resume; trainjob removes it (see the document's rows).
        wait_for(lambda: not is_true(k8s.job("pausing", namespace).get("status") or {}, "Suspended"), 60,
                 f"{controller}: the pausing job to be resumed")
        record("resumed", "pausing")
        k8s.wait_for_condition("done", "Complete", namespace=namespace, timeout=180)
        record("complete", "done")
        k8s.wait_for_condition("broken", "Failed", namespace=namespace, timeout=180)
        record("failed", "broken")
        seen["bad-image"] = _bad_image(k8s, namespace, controller)
    finally:
        for name in jobs:
            k8s.api.delete(TRAINJOBS, namespace, name)
    return seen


def _pausable(spec: dict[str, Any]) -> None:
    """:func:`no_retries`, and a pod that exits 1 is not the Job's failure: torchrun exits 1 on the SIGTERM of a
    suspension, and the Job controller, under load, may count that pod against its podFailurePolicy (FailJob on
    exit code 1) before it sees the Job suspended, failing the job instead of suspending it, under either controller."""
    no_retries(spec)
    for rj in spec["template"]["spec"]["replicatedJobs"]:
        policy = rj["template"]["spec"].setdefault("podFailurePolicy", {"rules": []})
        policy["rules"].insert(0, {"action": "Ignore",
                                   "onExitCodes": {"containerName": "node", "operator": "In", "values": [1]}})


def _bad_image(k8s: TrainJobCluster, namespace: str, controller: str) -> dict[str, Any]:
    """The bad-image job once Failed (trainjob's), or once :data:`BAD_IMAGE_WAIT` seconds old (Kubeflow's): its
    status, the seconds from its creation to then, its pods' waiting reasons and its events."""
    import datetime

    def age() -> float:
        created = k8s.job("bad-image", namespace)["metadata"]["creationTimestamp"]
        return (datetime.datetime.now(datetime.UTC) - datetime.datetime.fromisoformat(created)).total_seconds()

    def failed() -> bool:
        return is_true(k8s.job("bad-image", namespace).get("status") or {}, "Failed")

    if controller == "trainjob":
        wait_for(failed, 180, "trainjob: the bad-image job to fail")
    else:
        wait_for(lambda: failed() or age() > BAD_IMAGE_WAIT, BAD_IMAGE_WAIT + 60, "kubeflow: the bad-image job")
    failed_at = find_condition(k8s.job("bad-image", namespace).get("status") or {}, "Failed")
    waiting = [((c.get("state") or {}).get("waiting") or {}).get("reason")
               for pod in k8s.pods("bad-image", namespace) for c in (pod.get("status") or {}).get("containerStatuses") or []]
    created = datetime.datetime.fromisoformat(k8s.job("bad-image", namespace)["metadata"]["creationTimestamp"])
    seconds = (datetime.datetime.fromisoformat(failed_at["lastTransitionTime"]) - created).total_seconds() \
        if failed_at else age()
    events = [(e["type"], e["reason"]) for e in k8s.api.list_events(namespace, "bad-image")]
    return {"status": k8s.job("bad-image", namespace).get("status") or {}, "seconds": seconds, "waiting": waiting,
            "events": events}


@pytest.fixture(scope="module")
def lifecycle(both_controllers: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`_life`'s statuses, by controller."""
    return both_controllers["life"]


def test_a_job_whose_image_cannot_be_pulled_fails_naming_it_where_kubeflows_waits(
    lifecycle: dict[str, dict[str, dict[str, Any]]],
) -> None:
    """trainjob fails it within a minute, naming the image, the node and the registry's answer; Kubeflow's
    controller leaves it without a condition while its pod waits in ImagePullBackOff."""
    ours, theirs = lifecycle["trainjob"]["bad-image"], lifecycle["kubeflow"]["bad-image"]
    failed = find_condition(ours["status"], "Failed")
    assert failed is not None and failed["reason"] == "PodCannotStart", ours
    assert f"(image {BAD_IMAGE})" in failed["message"] and " on node trainjob-node" in failed["message"], failed
    assert "not found" in failed["message"], failed  # the registry's answer, as the kubelet was told it
    assert ("Warning", "PodCannotStart") in ours["events"], ours["events"]
    assert find_condition(theirs["status"], "Failed") is None, theirs
    assert set(theirs["waiting"]) <= {"ErrImagePull", "ImagePullBackOff"} and theirs["waiting"], theirs
    print(f"bad image: trainjob Failed after {ours['seconds']:.0f} s: {failed['message']}\n"
          f"Kubeflow after {theirs['seconds']:.0f} s: conditions {theirs['status'].get('conditions')}, "
          f"pods waiting {theirs['waiting']}, events {theirs['events']}")


def test_status_through_a_jobs_life_matches_kubeflow(lifecycle: dict[str, dict[str, dict[str, Any]]]) -> None:
    differences = []
    for milestone, with_jobs in MILESTONES.items():
        kf, tj = (_comparable_status(lifecycle[c][milestone]) for c in CONTROLLERS)
        if not with_jobs:
            kf.pop("jobsStatus", None)
            tj.pop("jobsStatus", None)
        differences += diff(milestone, kf, tj, "status")
    _check_against_doc(differences, "Status through a job's life")
