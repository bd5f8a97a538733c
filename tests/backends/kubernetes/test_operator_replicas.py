"""Operator replicas and the operator's metrics: ``trainjob operator`` processes on the test control plane.

Two replicas started with ``--leader-elect`` share the ``trainjob-system/trainjob-operator`` Lease: the leader
reconciles and the standby writes nothing. If the leader is SIGKILLed partway through a backlog of TrainJobs,
the standby takes the lease once it has expired (not before) and finishes the backlog. Every TrainJob then has
exactly one JobSet and one ``JobSetCreated`` event, and no status it had before the kill is lost or rewritten.

One replica's ``/metrics``, scraped over HTTP, counts what the operator did. The API requests, reconcile
passes and jobs by state are checked against the objects on the API server and the operator's own log.

Each replica watches only the test's namespace (``--namespace``), so jobs other tests left behind add nothing
to the backlog or to the counts. The session's operator is stopped meanwhile and started again afterwards.
"""

from __future__ import annotations

import collections
import datetime
import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubetest.cluster import OperatorProcess, TrainJobCluster, wait_for
from kubetest.controlplane import free_port
from prometheus_client.parser import text_string_to_metric_families

from trainjob.backends.kubernetes.manifests import LEASE_NAME, METRICS_PORT
from trainjob.backends.kubernetes.manifests import NAME as OPERATOR_NAME
from trainjob.backends.kubernetes.manifests import NAMESPACE as OPERATOR_NAMESPACE
from trainjob.backends.kubernetes.resources import JOBSETS, TRAINJOBS
from trainjob.backends.kubernetes.status import find_condition

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

ONE_NODE = {"numNodes": 1, "numProcPerNode": 1, "command": ["torchrun", "train.py"]}
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5
#: How much later than the lease duration the standby may lead on a busy two-core machine: its tries come
#: every retry period with up to 120 % jitter, each a read and a write of the Lease.
TAKEOVER_MARGIN = 6.0
#: ... and how much later again its first JobSet may appear: the operator starts and lists the TrainJobs first.
FIRST_JOBSET_MARGIN = 10.0
BACKLOG = 40
CREATED = re.compile(r"created JobSet (?P<namespace>[^/\s]+)/(?P<name>\S+)$", re.MULTILINE)


# -- helpers -------------------------------------------------------------------------------------------------


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_or_none(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:  # not serving yet
        return None


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= have)


def replica(k8s: TrainJobCluster, log: Path, metrics_port: int, *args: str) -> OperatorProcess:
    return k8s.operator_process(log, f"--metrics-port={metrics_port}", *args)


def read_lease(k8s: TrainJobCluster) -> dict[str, Any] | None:
    import kubernetes.client

    try:
        response = kubernetes.client.CoordinationV1Api(k8s.api.client).read_namespaced_lease(
            LEASE_NAME, OPERATOR_NAMESPACE, _preload_content=False)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(json.loads(response.data))


def delete_lease(k8s: TrainJobCluster) -> None:
    import kubernetes.client

    try:
        kubernetes.client.CoordinationV1Api(k8s.api.client).delete_namespaced_lease(
            LEASE_NAME, OPERATOR_NAMESPACE)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def micro_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)


def log_of(proc: OperatorProcess) -> str:
    return proc.log.read_text(errors="replace") if proc.log.exists() else ""


def operator_lines(log: str) -> str:
    """The operator's own lines of a log (``-v`` adds the API client's, with response bodies)."""
    return "\n".join(line for line in log.splitlines() if " trainjob.operator: " in line)


def created_jobsets(log: str, namespace: str) -> list[str]:
    """The jobs an operator's log says it created a JobSet for, in ``namespace``, in order."""
    return [m["name"] for m in CREATED.finditer(log) if m["namespace"] == namespace]


def identity(log: str) -> str | None:
    """The identity a replica leads as, from its log."""
    found = re.search(r"leading as (\S+)", log)
    return found[1] if found else None


def trainjob_events(k8s: TrainJobCluster, namespace: str, name: str) -> list[tuple[str, str]]:
    """The operator's events about TrainJob ``name`` (not JobSet's, which carry the same name)."""
    return [(e["type"], e["reason"]) for e in k8s.api.list_events(namespace, name)
            if e["involvedObject"]["kind"] == TRAINJOBS.kind]


def conditions(job: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {c["type"]: (c["status"], c.get("lastTransitionTime"))
            for c in (job.get("status") or {}).get("conditions") or []}


def delete_namespace(k8s: TrainJobCluster, namespace: str) -> None:
    """The jobs go with it (their JobSets by owner reference), so later tests' operator has less to list."""
    k8s.api.core.delete_namespace(namespace)


# -- the Deployment --------------------------------------------------------------------------------------------


def test_the_operator_deployment_runs_two_replicas_of_its_image_and_one_leads(k8s: TrainJobCluster) -> None:
    """As ``trainjob install --image`` deploys it: both pods run the image built from deploy/Dockerfile on the
    cluster's nodes and are ready; the one holding the Lease has pointed the operator Service at itself (the pods'
    reports reach it); each serves Prometheus metrics on its pod's address, saying which one leads."""
    k8s.operator.start()
    listing = k8s.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide").stdout
    pods = k8s.operator.pods()
    assert len(pods) == 2, listing
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {k8s.cp.operator_image}, listing
    assert all(p["status"]["phase"] == "Running" and p["spec"].get("nodeName") for p in pods), listing
    ready = {p["metadata"]["name"] for p in pods
             if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])}
    assert len(ready) == 2, listing
    leader = k8s.operator.leader()
    leader_ip = next(p["status"]["podIP"] for p in pods if p["metadata"]["name"] == leader)
    serving = k8s.operator.serving()
    assert serving == [(leader, [leader_ip])], "the operator Service must send the pods' reports to the leader alone"
    leading = {p["metadata"]["name"]: total(scrape(METRICS_PORT, p["status"]["podIP"]), "trainjob_operator_leader")
               for p in pods}
    assert leading == {name: (1.0 if name == leader else 0.0) for name in leading}, leading
    print(listing)


# -- leader election -----------------------------------------------------------------------------------------


def test_two_replicas_one_leads_and_the_other_takes_over_after_a_sigkill(
    k8s: TrainJobCluster, namespace: str, tmp_path: Path
) -> None:
    election = ("--leader-elect", f"--lease-duration={LEASE_DURATION:g}",
                f"--renew-deadline={RENEW_DEADLINE:g}", f"--retry-period={RETRY_PERIOD:g}",
                f"--namespace={namespace}")
    ports = [free_port(), free_port()]
    replicas = [replica(k8s, tmp_path / f"replica-{i}.log", port, *election) for i, port in enumerate(ports)]
    k8s.operator.stop()
    try:
        delete_lease(k8s)
        for proc in replicas:
            proc.start()

        def logs() -> str:
            return "\n".join(f"--- replica {i}'s log:\n{operator_lines(log_of(proc))[-4000:]}"
                             for i, proc in enumerate(replicas))

        def roles() -> tuple[int, int] | None:
            """(leader, standby) once one leads and the other has seen the lease held."""
            assert all(proc.alive() for proc in replicas), logs()
            gauges = [scrape_or_none(port) for port in ports]
            if None in gauges:
                return None
            leading = [i for i, got in enumerate(gauges) if total(got or {}, "trainjob_operator_leader")]
            if len(leading) != 1:
                return None
            leader, standby = leading[0], 1 - leading[0]
            waiting = "waiting for it to expire" in log_of(replicas[standby])
            return (leader, standby) if waiting else None

        leader, standby = wait_for(roles, 60, "one replica to lead and the other to wait", every=0.1)
        lead_id = identity(log_of(replicas[leader]))
        lease = read_lease(k8s)
        assert lease is not None and lead_id is not None, (lease, logs())
        assert lease["spec"]["holderIdentity"] == lead_id, (lease, logs())
        transitions = int(lease["spec"].get("leaseTransitions") or 0)

        # The backlog, created by four threads while the leader works on it; the leader dies after its first
        # JobSet.
        names = [f"job-{i:02d}" for i in range(BACKLOG)]
        with ThreadPoolExecutor(4) as pool:
            creating = [pool.submit(k8s.create_job, name, namespace, suspend=True, trainer=ONE_NODE)
                        for name in names]
            wait_for(lambda: k8s.api.list(JOBSETS, namespace), 60, "the leader's first JobSet", every=0.02)
            replicas[leader].kill()
            killed = time.monotonic()
            standby_log_at_kill = log_of(replicas[standby])
            for future in creating:
                future.result()
        assert replicas[leader].popen is not None and replicas[leader].popen.returncode == -9
        time.sleep(0.5)  # what the dead leader's requests did has landed; the standby cannot lead yet
        at_kill = {js["metadata"]["name"]: js["metadata"]["uid"] for js in k8s.api.list(JOBSETS, namespace)}
        status_at_kill = {job["metadata"]["name"]: conditions(job)
                          for job in k8s.api.list(TRAINJOBS, namespace)}
        dead_lease = read_lease(k8s)
        assert dead_lease is not None and dead_lease["spec"]["holderIdentity"] == lead_id, dead_lease
        assert 0 < len(at_kill) < BACKLOG, f"the leader was killed after {len(at_kill)} of {BACKLOG} JobSets"
        assert "acquired lease" not in standby_log_at_kill, operator_lines(standby_log_at_kill)
        assert created_jobsets(standby_log_at_kill, namespace) == [], operator_lines(standby_log_at_kill)

        # The standby takes over: not before the lease expired, and soon after.
        wait_for(lambda: total(scrape(ports[standby]), "trainjob_operator_leader") == 1,
                 LEASE_DURATION + TAKEOVER_MARGIN + 5, "the standby to lead", every=0.05)
        leading_after = time.monotonic() - killed
        wait_for(lambda: len(k8s.api.list(JOBSETS, namespace)) > len(at_kill),
                 LEASE_DURATION + FIRST_JOBSET_MARGIN + 5, "the standby's first JobSet", every=0.05)
        first_jobset_after = time.monotonic() - killed
        print(f"\ntakeover: the standby led {leading_after:.2f} s after the SIGKILL, its first JobSet came "
              f"{first_jobset_after:.2f} s after it ({len(at_kill)} of {BACKLOG} JobSets existed at the "
              f"kill; lease duration {LEASE_DURATION:g} s)")
        assert leading_after <= LEASE_DURATION + TAKEOVER_MARGIN, logs()
        assert first_jobset_after <= LEASE_DURATION + FIRST_JOBSET_MARGIN, logs()
        new_lease = read_lease(k8s)
        standby_id = identity(log_of(replicas[standby]))
        assert new_lease is not None and standby_id is not None and standby_id != lead_id
        assert new_lease["spec"]["holderIdentity"] == standby_id, new_lease
        assert int(new_lease["spec"]["leaseTransitions"]) == transitions + 1, new_lease
        # The follower's own clock decides, and it must have seen the last renewal unchanged for the whole
        # duration.
        unrenewed = (micro_time(new_lease["spec"]["acquireTime"])
                     - micro_time(dead_lease["spec"]["renewTime"])).total_seconds()
        assert unrenewed >= LEASE_DURATION, (f"taken over {unrenewed:.3f} s after the last renewal",
                                             dead_lease, new_lease)

        # The backlog is finished: one JobSet, one JobSetCreated event, Suspended for every job.
        def finished() -> bool:
            jobs = k8s.api.list(TRAINJOBS, namespace)
            return len(jobs) == BACKLOG and all(
                find_condition(job.get("status") or {}, "Suspended") for job in jobs)

        wait_for(finished, 60, "every TrainJob to be Suspended", every=0.5)
        jobs = {job["metadata"]["name"]: job for job in k8s.api.list(TRAINJOBS, namespace)}
        jobsets = {js["metadata"]["name"]: js for js in k8s.api.list(JOBSETS, namespace)}
        assert sorted(jobsets) == sorted(jobs) == names
        for name, js in jobsets.items():
            owners = [(o["kind"], o["uid"]) for o in js["metadata"]["ownerReferences"] if o.get("controller")]
            assert owners == [("TrainJob", jobs[name]["metadata"]["uid"])], (name, owners)
            assert js["spec"]["suspend"] is True, name
        replaced = {name: uid for name, uid in at_kill.items() if jobsets[name]["metadata"]["uid"] != uid}
        assert not replaced, f"JobSets made again after the takeover: {replaced}"

        went_back = {}
        for name, job in jobs.items():
            now = conditions(job)
            before = status_at_kill.get(name, {})
            lost = {type_: cond for type_, cond in before.items() if now.get(type_) != cond}
            if lost or now.get("Suspended", ("", None))[0] != "True" or "Failed" in now:
                went_back[name] = (before, now)
        assert not went_back, went_back

        # Who made what: the dead leader only JobSets that existed at the kill, the standby all the others,
        # once.
        leader_made = created_jobsets(log_of(replicas[leader]), namespace)
        standby_made = created_jobsets(log_of(replicas[standby]), namespace)
        twice = [name for name, n in collections.Counter(leader_made + standby_made).items() if n > 1]
        assert not twice, f"JobSets created twice: {twice}\n{logs()}"
        assert set(leader_made) <= set(at_kill), (leader_made, sorted(at_kill))
        assert sorted(standby_made) == sorted(set(names) - set(at_kill)), (standby_made, sorted(at_kill))

        # Each job's JobSet was announced once, whichever replica made it.
        events = {name: trainjob_events(k8s, namespace, name) for name in names}
        wrong = {name: got for name, got in events.items() if got != [("Normal", "JobSetCreated")]}
        assert not wrong, (f"{len(wrong)} of {BACKLOG} jobs lack exactly one JobSetCreated event (JobSets at "
                           f"the kill: {sorted(at_kill)}; logged as created by the leader: {leader_made}): "
                           f"{wrong}\n{logs()}")
    finally:
        try:
            for proc in replicas:
                proc.stop()
            delete_lease(k8s)
            delete_namespace(k8s, namespace)
        finally:
            k8s.operator.start()
    assert not any(proc.alive() for proc in replicas)


# -- metrics -------------------------------------------------------------------------------------------------


def settled(port: int, quiet: float = 1.5, timeout: float = 30.0) -> Samples:
    """A scrape after the reconcile and request counters stopped moving for ``quiet`` seconds."""

    def moving(samples: Samples) -> tuple[float, float]:
        return (total(samples, "trainjob_operator_reconciles_total"),
                total(samples, "trainjob_operator_api_requests_total"))

    deadline = time.monotonic() + timeout
    last = scrape(port)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        samples = scrape(port)
        if moving(samples) == moving(last):
            return samples
        last = samples
    raise AssertionError(f"the operator kept reconciling for {timeout:g} s: {moving(last)}")


def test_metrics_count_what_the_operator_did(k8s: TrainJobCluster, namespace: str, tmp_path: Path) -> None:
    suspended = [f"job-{i}" for i in range(5)]
    port = free_port()
    proc = replica(k8s, tmp_path / "operator.log", port, f"--namespace={namespace}")
    k8s.operator.stop()
    try:
        proc.start()
        wait_for(lambda: scrape_or_none(port), 60, "the operator's /metrics", every=0.2)
        for name in suspended:
            k8s.create_job(name, namespace, suspend=True, trainer=ONE_NODE)
        k8s.create_job("invalid", namespace, trainer=ONE_NODE | {"numProcPerNode": "gpu"})
        for name in suspended:
            k8s.wait_for_condition(name, "Suspended", namespace=namespace, timeout=60)
        k8s.wait_for_condition("invalid", "Failed", namespace=namespace, timeout=60)
        samples = settled(port)
        log = log_of(proc)
        # What the operator made, as the API server has it.
        jobsets = sorted(js["metadata"]["name"] for js in k8s.api.list(JOBSETS, namespace))
        events = {name: trainjob_events(k8s, namespace, name) for name in [*suspended, "invalid"]}
        failed = find_condition(k8s.job("invalid", namespace)["status"], "Failed")
        pod_counts = {name: (k8s.job(name, namespace)["status"].get("jobsStatus") or [{}])[0].get("suspended")
                      for name in suspended}
    finally:
        try:
            proc.stop()
            delete_namespace(k8s, namespace)
        finally:
            k8s.operator.start()
    assert not proc.alive()
    assert jobsets == suspended
    assert events == {**{name: [("Normal", "JobSetCreated")] for name in suspended},
                      "invalid": [("Warning", "InvalidTrainJob")]}, events
    assert failed is not None and failed["reason"] == "InvalidTrainJob", failed

    def metric(name: str, **labels: str) -> float:
        return total(samples, name, **labels)

    # Every object it created is one POST answered 201 (the key and TLS Secrets existed already).
    created = len(jobsets) + sum(len(e) for e in events.values())
    assert created == 2 * len(suspended) + 1
    # At least those.
    assert metric("trainjob_operator_api_requests_total", verb="POST", code="201") >= created
    # Every job's status was written at least once (a later pass may write jobsStatus again).
    assert metric("trainjob_operator_api_requests_total", verb="PATCH", code="200") >= len(suspended) + 1

    reconciles = metric("trainjob_operator_reconciles_total", kind="TrainJob")
    assert reconciles >= len(suspended) + 1
    failures = len(re.findall(r"reconciling \(.*\) failed \(attempt", log))
    errors = metric("trainjob_operator_reconciles_total", kind="TrainJob", result="error")
    assert errors == failures, operator_lines(log)[-4000:]
    # Suspended and failed jobs need no pass later, except to write pod counts that moved within a second of the
    # status write before (the operator lets such a burst settle; how many such passes depends on when JobSet's
    # updates arrive): every count got written in the end, and every pass is one of the three results.
    assert pod_counts == dict.fromkeys(suspended, 1), pod_counts
    assert reconciles == sum(metric("trainjob_operator_reconciles_total", kind="TrainJob", result=result)
                             for result in ("success", "error", "requeue_after"))
    assert metric("trainjob_operator_reconcile_duration_seconds_count", kind="TrainJob") == reconciles
    assert metric("trainjob_operator_reconcile_duration_seconds_sum", kind="TrainJob") > 0
    assert metric("trainjob_operator_queue_wait_seconds_count", kind="TrainJob") == reconciles

    states = {state: metric("trainjob_operator_jobs", state=state)
              for state in ("Created", "Running", "Suspended", "Complete", "Failed")}
    assert states == {"Created": 0, "Running": 0, "Suspended": len(suspended), "Complete": 0, "Failed": 1}
    assert ("trainjob_operator_leader", frozenset()) in samples
    assert metric("trainjob_operator_leader") == 0


# -- upgrades ------------------------------------------------------------------------------------------------

UPGRADE_SCRIPT = str(Path(__file__).resolve().parent / "ddp_script.py")


def test_rolling_the_operator_to_a_new_image_keeps_every_job(k8s: TrainJobCluster, namespace: str) -> None:
    """``kubectl set image`` on the operator Deployment while two jobs run and report progress, one waits suspended:
    the rollout completes (each replica replaced once ready), no job is lost or made twice, no status goes backwards,
    and the jobs finish under the new image's leader."""
    from kubetest.images import Builder, cache_dir, local_reference

    old = k8s.cp.operator_image
    new = f"{old}-next"  # a release: the same build with a label of its own (so another digest), a new tag
    builder = Builder(cache_dir(), k8s.cp.root / "logs" / "images.log")
    container = builder.buildah("from", "--pull-never", "--quiet",
                                local_reference(old)).strip()
    local = "localhost/trainjob-test/trainjob-operator-next:latest"
    try:
        builder.buildah("config", "--label", "org.opencontainers.image.version=next", container)
        builder.buildah("commit", "--quiet", container, local)
        builder.push(local, k8s.cp.registry, new.split("/", 1)[1])
    finally:
        builder.buildah("rm", container)
        builder.buildah("rmi", local)
    trainer = {"numNodes": 1, "command": ["torchrun", UPGRADE_SCRIPT, "--steps", "60", "--step-seconds", "0.5",
                                          "--progress"],
               "resourcesPerNode": {"requests": {"cpu": "500m"}}}
    for name in ("up-a", "up-b"):
        k8s.create_job(name, namespace, trainer=trainer)
    k8s.create_job("up-waiting", namespace, suspend=True, trainer=trainer)
    wait_for(lambda: all(k8s.job(n, namespace).get("status", {}).get("trainerStatus") for n in ("up-a", "up-b")),
             120, "both jobs to report progress")
    uids = {n: k8s.jobset(n, namespace)["metadata"]["uid"] for n in ("up-a", "up-b", "up-waiting")}
    before = k8s.kubectl("get", "trainjobs,jobsets", "-n", namespace).stdout

    samples: list[dict[str, tuple[int, frozenset[str]]]] = []
    rolled = False

    def sample() -> None:
        while not rolled:
            seen = {}
            for job in k8s.api.list(TRAINJOBS, namespace):
                status = job.get("status") or {}
                seen[job["metadata"]["name"]] = (
                    (status.get("trainerStatus") or {}).get("progressPercentage") or 0,
                    frozenset(c["type"] for c in status.get("conditions") or [] if c["status"] == "True"))
            samples.append(seen)
            time.sleep(0.5)

    with ThreadPoolExecutor(1) as pool:
        sampler = pool.submit(sample)
        try:
            k8s.kubectl("set", "image", "-n", OPERATOR_NAMESPACE, f"deployment/{OPERATOR_NAME}", f"operator={new}")
            k8s.kubectl("rollout", "status", "-n", OPERATOR_NAMESPACE, f"deployment/{OPERATOR_NAME}",
                        "--timeout=240s", timeout=260)
            k8s.operator.start()  # until the new pods' leader is ready
            wait_for(lambda: not [p for p in k8s.operator.pods() if p["metadata"].get("deletionTimestamp")], 60,
                     "the old pods to go")
            pods = k8s.operator.pods()
            assert {p["spec"]["containers"][0]["image"] for p in pods} == {new}, k8s.operator.describe()
            for name in ("up-a", "up-b"):
                k8s.wait_for_condition(name, "Complete", namespace=namespace, timeout=240)
        finally:
            rolled = True
            sampler.result()
            k8s.kubectl("set", "image", "-n", OPERATOR_NAMESPACE, f"deployment/{OPERATOR_NAME}", f"operator={old}")
            k8s.kubectl("rollout", "status", "-n", OPERATOR_NAMESPACE, f"deployment/{OPERATOR_NAME}",
                        "--timeout=240s", timeout=260)
            k8s.operator.start()
    after = k8s.kubectl("get", "trainjobs,jobsets", "-n", namespace).stdout
    assert {n: (k8s.jobset(n, namespace) or {}).get("metadata", {}).get("uid") for n in uids} == uids, (before, after)
    for name in uids:
        created = [e for e in k8s.api.list_events(namespace, name) if e["reason"] == "JobSetCreated"]
        assert len(created) == 1 and created[0].get("count", 1) == 1, (name, created)
    assert "Suspended" in (samples[-1]["up-waiting"][1]), samples[-1]
    for name in ("up-a", "up-b"):
        progress = [s[name][0] for s in samples if name in s]
        assert progress == sorted(progress), f"{name}'s progress went backwards: {progress}"
        finished = [i for i, s in enumerate(samples) if "Complete" in s.get(name, (0, frozenset()))[1]]
        assert not finished or all("Complete" in s[name][1] for s in samples[finished[0]:]), name
    print(f"before the rollout:\n{before}\nafter:\n{after}")
