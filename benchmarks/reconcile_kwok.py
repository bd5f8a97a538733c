"""``benchmarks/reconcile.py --kwok``: trainjob's operator and Kubeflow Trainer's controller drive the same
TrainJobs to Complete on simulated nodes, one after the other on one control plane.

    python benchmarks/reconcile.py --kwok --json kwok.json                    # 1,000 nodes, the full scale
    python benchmarks/reconcile.py --kwok --fake-nodes 50 --jobs 20 --nodes-per-job 4   # minutes, to try it

The control plane is the tests' (``tests/harness/kubetest``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, JobSet, built from Go modules), with the API clients of kube-controller-manager and kube-scheduler
allowed ``--client-qps`` (their defaults, 20 and 50 queries per second, would make the Job controller's pod
creation the only thing measured). KWOK (``tests/harness/kubetest/kwok.py``) adds ``--fake-nodes`` simulated nodes
and plays their kubelets: a bound pod is Running at once and Succeeded ``--run-seconds`` later. Everything else is
what a real cluster runs: the scheduler binds every pod, the Job controller creates them, JobSet and the
controller under test turn the pods' end into the TrainJob's Complete condition. The TrainJobs name a
TrainingRuntime, a copy of the built-in ``torch-distributed`` whose pods tolerate the simulated nodes' taint.

Before the runs, an indexed Job of as many pods as the largest scenario runs to Complete with no trainer
controller, untimed (``--no-warm-up`` skips it): the first pass of a fresh cluster over that many pods is slower
(141 s to Running where the runs after it took 62 to 71), and it would always be the first controller's.

Scenarios (``--scenarios``), each under both controllers, each controller started fresh before its run and
stopped after it, each run in a namespace of its own that is deleted (and waited for) before the next run:

- ``many``: ``--jobs`` TrainJobs of ``--nodes-per-job`` nodes (1,000 x 8: 8,000 pods);
- ``wide``: one TrainJob of ``--big-job-nodes`` nodes (default ``--fake-nodes``: 1,000 pods).

Figures per run, all from the moment the first TrainJob is created (jobs are created by 4 client threads):

- ``running``: until the last pod was Running (the latest pod ``status.startTime``);
- ``complete``: until the last TrainJob was Complete (the latest ``Complete`` condition's ``lastTransitionTime``);
  both timestamps are whole seconds (taken as the middle of their second: +-0.5 s);
  ``jobs/s`` = jobs / complete, ``pods/s`` = pods / running;
- the phases, printed under the table, the latest of each: the JobSets made (the controller's part), the pods made
  (the Job controller's), Running, the JobSets ``Completed`` (JobSet's), the TrainJobs ``Complete``: where a gap
  between the controllers opens;
- ``req/job``: API requests the controller's ServiceAccount made from the first create until all were Complete,
  from the API server's audit log (watches and lists of its start-up are not in them), per TrainJob;
- ``req/job -ev``: the same without the Events the controller posted (``JobSetCreated``: users read it, so it
  stays and the target counts requests without it); ``writes/job``: its status writes (trainjob's patches,
  Kubeflow's updates of ``trainjobs/status``) per TrainJob;
- ``RSS``: the controller process's peak resident memory (``VmHWM``, its whole life; trainjob's operator is
  started and stopped once before the runs, as on a cluster it has run on before, and that first start's peak is
  printed apart); ``CPU s``: the CPU time
  (user + system) it spent from the first create until all were Complete, ``CPU ms/job`` the same per TrainJob.

With ``--profile DIR`` py-spy samples trainjob's operator (``benchmarks/cpu_profile.py``) from the first create until
all are Complete, into ``DIR/trainjob-<scenario>.txt`` (collapsed stacks), and prints its top frames.
``--logs DIR`` copies the control plane's logs there before the cluster goes; each run's figures carry its
wall-clock start (``started_at``), to find a slow run in them.
``--baseline-src DIR`` also runs the operator of another checkout's ``src`` (a git worktree of the previous
release), first, as controller ``base``: a change measured against its baseline on the same cluster in one run.
``--rounds N`` runs each scenario N times under each controller, swapping their order every other round, and
takes the median of each figure. ``--json PATH`` writes every run's figures, and by ``<scenario>.<controller>``
the medians, and the ratios trainjob / Kubeflow by
``<scenario>.ratio`` (trainjob / base by ``<scenario>.change.ratio``), so that ``benchmarks/compare.py`` holds one
run against another.

JobSet's published throughput, 266 pods/s, is printed as the reference line. Kubeflow's controller runs as its
project publishes it (its API client: 50 queries per second, burst 100), trainjob's operator with ``--workers``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
from cpu_profile import Sampling, top_frames
from kubetest.cluster import TrainJobCluster
from kubetest.controlplane import AUDITED_ACCOUNTS, RELEASES_ENV, ControlPlane, free_port
from kubetest.kubeflow import KubeflowController
from kubetest.kwok import LABEL, TAINT, SimulatedNodes, on_simulated_nodes

from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.manifests import NAME as OPERATOR_NAME
from trainjob.backends.kubernetes.manifests import NAMESPACE as OPERATOR_NAMESPACE
from trainjob.backends.kubernetes.resources import JOBS, JOBSETS, RENDERED_RESOURCES, TRAINJOBS
from trainjob.backends.kubernetes.status import find_condition, parse_timestamp

#: JobSet's published scale figure: pods created and running per second.
JOBSET_PODS_PER_S = 266
RUNTIME = "simulated"


@dataclass
class Scenario:
    name: str
    jobs: int
    nodes_per_job: int

    @property
    def pods(self) -> int:
        return self.jobs * self.nodes_per_job


class Controller(Protocol):
    name: str
    user: str

    def start(self) -> int:
        """Start it and wait until it is ready; its process id."""

    def stop(self) -> None: ...

    def alive(self) -> bool: ...


class TrainJobOperator:
    """``trainjob operator`` with the operator ServiceAccount's token, ready once its health probe answers; with
    ``src``, the trainjob of that folder (another checkout's ``src``), named ``base``."""

    user = AUDITED_ACCOUNTS[0]

    def __init__(self, cluster: TrainJobCluster, workers: int, src: Path | None = None) -> None:
        self.cluster = cluster
        self.workers = workers
        self.src = src
        self.name = "trainjob" if src is None else "base"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.cluster.cp.root / "logs" / f"operator-kwok-{self.name}.log"

    def start(self) -> int:
        port, status_port = free_port(), free_port()
        log = self.log
        env = os.environ if self.src is None else \
            {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.src), os.environ.get("PYTHONPATH", "")])}
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "trainjob.cli.main", "operator",
                 f"--kubeconfig={self.cluster.operator_kubeconfig}", f"--workers={self.workers}",
                 f"--liveness=http://127.0.0.1:{port}/healthz",
                 # as deployed: progress is pushed to the status endpoint, never read from the pods' logs
                 f"--status-url=https://127.0.0.1:{status_port}", f"--status-port={status_port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"trainjob operator exited:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                                                       timeout=2) as answer:
                if answer.status == 200:
                    return self.popen.pid
            time.sleep(0.2)
        raise TimeoutError("trainjob operator not ready after 60 s")

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)  # the operator's clean stop
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Kubeflow:
    """Kubeflow Trainer's controller manager (``kubetest.kubeflow``), with its validating webhooks."""

    name = "kubeflow"
    user = AUDITED_ACCOUNTS[1]

    def __init__(self, cp: ControlPlane, feature_gates: dict[str, bool] | None = None) -> None:
        self.controller = KubeflowController(cp, feature_gates)

    def start(self) -> int:
        self.controller.start()
        assert self.controller.process is not None
        return self.controller.process.popen.pid

    def stop(self) -> None:
        self.controller.stop()

    def alive(self) -> bool:
        return self.controller.alive()


def install(cluster: TrainJobCluster) -> None:
    """``trainjob install`` without the operator Deployment (the benchmarks run ``trainjob operator`` on this host
    with its ServiceAccount's token, and start no real nodes, so no image is built)."""
    cluster.trainjob("install", f"--kubeconfig={cluster.kubeconfig}", "--operator-replicas=0")
    cluster.cp.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_NAME, cluster.operator_kubeconfig)


def wait_admitted(api: KubeApi, body: dict[str, Any], timeout: float = 180) -> None:
    """Until the API server admits a dry-run create of ``body`` (its webhooks answer). The harness waits until the
    host can open a TCP connection to a webhook's Service, which this machine's TLS proxy also accepts before
    kube-proxy's rules are there; a controller measured then spends its first half minute on refused creates."""
    import kubernetes.client

    ref = RENDERED_RESOURCES.get((body["apiVersion"], body["kind"])) or TRAINJOBS
    custom = kubernetes.client.CustomObjectsApi(api.client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            custom.create_namespaced_custom_object(ref.group, ref.version, body["metadata"]["namespace"], ref.plural,
                                                   body, dry_run="All")
            return
        except kubernetes.client.ApiException as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ref.kind} creates still refused after {timeout:g} s: {exc.body}") from exc
            time.sleep(1)


#: A JobSet for :func:`wait_admitted` (JobSet's webhooks).
PROBE_JOBSET = {"apiVersion": JOBSETS.api_version, "kind": JOBSETS.kind,
                "metadata": {"name": "webhook-probe", "namespace": "default"},
                "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"template": {
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]}}}}}]}}


def job_body(name: str, namespace: str, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": RUNTIME, "kind": "TrainingRuntime"},
            "trainer": {"numNodes": nodes, "command": ["torchrun", "train.py"]},
        },
    }


def condition_true(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    condition = find_condition(job.get("status") or {}, type_)
    return condition if condition is not None and condition["status"] == "True" else None


def seconds_after(stamp: str | dict[str, Any], start: float) -> float:
    """Seconds from ``start`` (``time.time()``) to an API timestamp, or a condition's ``lastTransitionTime``.
    The API keeps whole seconds: the middle of that second is the best estimate."""
    if isinstance(stamp, dict):
        stamp = stamp["lastTransitionTime"]
    return parse_timestamp(stamp) + 0.5 - start


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def first_start_rss(operator: TrainJobOperator) -> float:
    """Start and stop the operator once, so the runs measure it as it starts on a cluster it has run on (its
    status endpoint's TLS Secret exists: making it loads ``cryptography``, ~12 MiB, once per cluster); that first
    start's peak RSS in MiB."""
    pid = operator.start()
    try:
        time.sleep(2)
        return peak_rss(pid) / 2**20
    finally:
        operator.stop()


def peak_rss(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def wait_complete(api: KubeApi, namespace: str, scenario: Scenario, controller: Controller, start: float,
                  timeout: float) -> list[dict[str, Any]]:
    """Poll until every TrainJob in ``namespace`` is Complete; fail at once if one fails or the controller exits."""
    every = 1.0 if scenario.jobs <= 100 else 3.0
    last_report = time.monotonic()
    while True:
        jobs = api.list(TRAINJOBS, namespace)
        failed = [j["metadata"]["name"] for j in jobs if condition_true(j, "Failed")]
        if failed:
            raise RuntimeError(f"{len(failed)} TrainJobs failed, e.g. {failed[0]}: "
                               f"{condition_true(next(j for j in jobs if j['metadata']['name'] == failed[0]), 'Failed')}")
        complete = sum(1 for j in jobs if condition_true(j, "Complete"))
        if complete == scenario.jobs:
            return jobs
        if not controller.alive():
            raise RuntimeError(f"{controller.name}'s controller exited")
        elapsed = time.time() - start
        if elapsed > timeout:
            raise TimeoutError(f"{complete}/{scenario.jobs} TrainJobs Complete after {timeout:g} s")
        if time.monotonic() - last_report > 30:
            print(f"  ... {complete}/{scenario.jobs} Complete after {elapsed:.0f} s", flush=True)
            last_report = time.monotonic()
        time.sleep(every)


def wait_watching(cp: ControlPlane, controller: Controller, since: int, timeout: float = 60) -> int:
    """Until the controller watches TrainJobs (its audit log shows the watch), so that the jobs created next meet a
    controller that is up (a health probe may answer before the watches start); the audit log's length then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        requests = cp.audit_requests(controller.user)
        if any(r["verb"] == "watch" and (r.get("objectRef") or {}).get("resource") == "trainjobs"
               for r in requests[since:]):
            return len(requests)
        time.sleep(0.5)
    raise TimeoutError(f"{controller.name}'s controller does not watch TrainJobs after {timeout:g} s")


def delete_namespace(api: KubeApi, namespace: str, timeout: float = 900) -> None:
    import kubernetes.client

    core = kubernetes.client.CoreV1Api(api.client)
    with contextlib.suppress(kubernetes.client.ApiException):
        core.delete_namespace(namespace)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_namespace(namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(1)
    raise TimeoutError(f"namespace {namespace} still there after {timeout:g} s")


def warm_up(cluster: TrainJobCluster, pods: int, timeout: float) -> float:
    """An indexed Job of ``pods`` pods on the simulated nodes, run to Complete with no trainer controller, its
    namespace deleted: the first run on a fresh cluster pays for the API server's, etcd's, the scheduler's and
    KWOK's first pass over that many pods (measured: 141 s to Running where the runs after it took 62 to 71), and
    without it that run is always the first controller's. Its seconds."""
    cp, api = cluster.cp, cluster.api
    namespace = "warm-up"
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    start = time.monotonic()
    api.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "warm-up", "namespace": namespace},
                "spec": {"completions": pods, "parallelism": pods, "completionMode": "Indexed", "backoffLimit": 0,
                         "template": {"spec": {
                             "restartPolicy": "Never", "nodeSelector": dict(LABEL),
                             "tolerations": [{**TAINT, "operator": "Equal"}],
                             "containers": [{"name": "node", "image": "registry.trainjob.test/warm-up:1"}]}}}},
               JOBS)
    deadline = time.monotonic() + timeout
    while not condition_true(next(iter(api.list(JOBS, namespace)), {}), "Complete"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the warm-up Job of {pods} pods not Complete after {timeout:g} s")
        time.sleep(1)
    took = time.monotonic() - start
    delete_namespace(api, namespace)
    return took


def run(cluster: TrainJobCluster, controller: Controller, scenario: Scenario, timeout: float,
        profile: Path | None = None) -> dict[str, Any]:
    """One scenario under one controller; the figures in the module docstring."""
    cp, api = cluster.cp, cluster.api
    namespace = f"{scenario.name}-{controller.name}"
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    cluster.namespaced_runtime(namespace, RUNTIME, on_simulated_nodes)
    result: dict[str, Any] = {"scenario": scenario.name, "controller": controller.name, "jobs": scenario.jobs,
                              "pods": scenario.pods}
    try:
        try:
            measure(cluster, controller, scenario, namespace, timeout, result, profile)
        except Exception as exc:  # a controller that cannot do a scenario is a result, not the end of the benchmark
            result["error"] = f"{type(exc).__name__}: {exc}"
            print(f"  {controller.name} / {scenario.name}: {result['error']}", flush=True)
        delete_namespace(api, namespace)  # while the controller runs, so that its finalizers (if any) go too
    finally:
        controller.stop()
    return result


def measure(cluster: TrainJobCluster, controller: Controller, scenario: Scenario, namespace: str, timeout: float,
            result: dict[str, Any], profile: Path | None = None) -> None:
    """Start ``controller``, create the scenario's TrainJobs in ``namespace``, wait until all are Complete, and put
    the figures into ``result``; with ``profile``, py-spy samples trainjob's operator meanwhile into that folder."""
    cp, api = cluster.cp, cluster.api
    started_at = len(cp.audit_requests(controller.user))
    log = controller.log if isinstance(controller, TrainJobOperator) else None
    log_from = log.stat().st_size if log is not None and log.exists() else 0
    pid = controller.start()
    process = psutil.Process(pid)
    before = wait_watching(cp, controller, started_at)
    wait_admitted(api, job_body("webhook-probe", namespace, scenario.nodes_per_job))  # Kubeflow's webhooks
    cpu_before = cpu_seconds(process)
    profiling = contextlib.nullcontext() if profile is None or not isinstance(controller, TrainJobOperator) else \
        Sampling(pid, profile / f"{controller.name}-{scenario.name}.txt")
    with profiling:
        start = time.time()
        result["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
        bodies = [job_body(f"{scenario.name}-{i}", namespace, scenario.nodes_per_job) for i in range(scenario.jobs)]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda body: api.create(body, TRAINJOBS), bodies))
        result["create_s"] = time.time() - start
        jobs = wait_complete(api, namespace, scenario, controller, start, timeout)
        result["cpu_s"] = cpu_seconds(process) - cpu_before
    if isinstance(profiling, Sampling) and profiling.out.exists():
        print(top_frames(profiling.out), flush=True)
        if isinstance(controller, TrainJobOperator) and controller.log.exists():  # the cluster's folder goes
            (profiling.out.parent / f"{controller.name}-{scenario.name}.log").write_bytes(controller.log.read_bytes())
    result["cpu_ms_per_job"] = 1000 * result["cpu_s"] / scenario.jobs
    result["peak_rss_mib"] = peak_rss(pid) / 2**20
    time.sleep(2)  # the last requests reach the audit log
    requests = cp.audit_requests(controller.user)[before:]
    pods = api.list_pods(namespace, "jobset.sigs.k8s.io/jobset-name")
    started = [seconds_after(p["status"]["startTime"], start) for p in pods
               if (p.get("status") or {}).get("startTime")]
    if len(started) < scenario.pods:
        raise RuntimeError(f"only {len(started)} of {scenario.pods} pods ever ran")
    result["running_s"] = max(started)
    result["complete_s"] = max(seconds_after(condition_true(j, "Complete") or {}, start) for j in jobs)
    jobsets = api.list(JOBSETS, namespace)
    # Where the time went, phase by phase (the latest of each, whole seconds from the first create): the JobSets
    # made (the controller's part), the pods made (the Job controller's), Running (the scheduler's and the
    # nodes'), the JobSets Completed (JobSet's), the TrainJobs Complete (the controller's again).
    result["jobsets_made_s"] = max(seconds_after(js["metadata"]["creationTimestamp"], start) for js in jobsets)
    result["pods_made_s"] = max(seconds_after(p["metadata"]["creationTimestamp"], start) for p in pods)
    # How long after its JobSet's Completed condition each TrainJob's Complete came (whole seconds each: the mean of
    # many is finer); what the controller adds to the JobSet controller's time.
    completed = {js["metadata"]["name"]: condition_true(js, "Completed") for js in jobsets}
    if all(completed.values()):
        result["jobsets_completed_s"] = max(seconds_after(c, start) for c in completed.values())
    lags = [parse_timestamp(condition_true(j, "Complete")["lastTransitionTime"])
            - parse_timestamp(completed[j["metadata"]["name"]]["lastTransitionTime"])
            for j in jobs if completed.get(j["metadata"]["name"])]
    if lags:
        result["finish_lag_mean_s"], result["finish_lag_max_s"] = sum(lags) / len(lags), max(lags)
    result["jobs_per_s"] = scenario.jobs / result["complete_s"]
    result["pods_per_s"] = scenario.pods / result["running_s"]
    result["requests"] = len(requests)
    result["requests_per_job"] = len(requests) / scenario.jobs
    verbs = collections.Counter(f"{r['verb']} {r['objectRef'].get('resource')}" for r in requests
                                if r.get("objectRef"))
    result["requests_per_job_without_events"] = (len(requests) - verbs["create events"]) / scenario.jobs
    result["status_writes_per_job"] = sum(
        1 for r in requests if r["verb"] in ("patch", "update")
        and (r.get("objectRef") or {}).get("resource") == "trainjobs"
        and (r.get("objectRef") or {}).get("subresource") == "status") / scenario.jobs
    result["verbs"] = dict(verbs.most_common())
    if log is not None and log.exists():
        # why a watch of the operator's was opened again during the run (expired version, failed request): the
        # requests it cost are counted above
        with log.open("rb") as f:
            f.seek(log_from)
            lines = f.read().decode("utf-8", "replace").splitlines()
        reopened = [line for line in lines if "listing again" in line or "; again in" in line]
        if reopened:
            result["watches_reopened"] = reopened
            print(f"  {controller.name} / {scenario.name}: watches opened again:\n    " + "\n    ".join(reopened),
                  flush=True)


def table(results: list[dict[str, Any]]) -> str:
    header = (f"{'scenario':<9}{'controller':<11}{'jobs':>6}{'pods':>7}{'create s':>10}{'running s':>11}"
              f"{'complete s':>12}{'jobs/s':>8}{'pods/s':>8}{'req/job':>9}{'-ev':>6}{'writes':>8}{'RSS MiB':>9}"
              f"{'CPU s':>8}{'ms/job':>8}")
    lines = [header, "-" * len(header)]
    for r in results:
        who = r["controller"] + (f" #{r['round']}" if r.get("round", 1) > 1 else "")
        head = f"{r['scenario']:<9}{who:<11}{r['jobs']:>6}{r['pods']:>7}"
        if "error" in r:
            lines.append(f"{head}  {r['error'][:90]}")
            continue
        lines.append(f"{head}{r['create_s']:>10.1f}{r['running_s']:>11.0f}{r['complete_s']:>12.0f}"
                     f"{r['jobs_per_s']:>8.1f}{r['pods_per_s']:>8.1f}{r['requests_per_job']:>9.2f}"
                     f"{r['requests_per_job_without_events']:>6.2f}{r['status_writes_per_job']:>8.2f}"
                     f"{r['peak_rss_mib']:>9.0f}{r['cpu_s']:>8.1f}{r['cpu_ms_per_job']:>8.0f}")
    lines.append(f"{'reference':<9} {'JobSet (published)':<51}{'':>12}{'':>8}{JOBSET_PODS_PER_S:>8}")
    for r in results:
        if "jobsets_made_s" in r:
            who = r["controller"] + (f" #{r['round']}" if r.get("round", 1) > 1 else "")
            lines.append(f"{r['scenario']} / {who}: JobSets made {r['jobsets_made_s']:.0f} s, pods made "
                         f"{r['pods_made_s']:.0f} s, Running {r['running_s']:.0f} s, JobSets Completed "
                         f"{r.get('jobsets_completed_s', float('nan')):.0f} s, Complete {r['complete_s']:.0f} s")
    for r in results:
        if "finish_lag_mean_s" in r:
            lines.append(f"{r['scenario']} / {r['controller']}: Complete {r['finish_lag_mean_s']:.2f} s after the "
                         f"JobSet's Completed on average, {r['finish_lag_max_s']:.0f} s at most")
    rounds = max((r.get("round", 1) for r in results), default=1)
    for name, r in ratios(results).items():
        against = "base" if name.endswith(".change") else "Kubeflow"
        of = f" (medians of {rounds} rounds)" if rounds > 1 else ""
        lines.append(f"{name.removesuffix('.change')}: trainjob / {against}{of}: time to Running {r['running_s']:.2f}x, to Complete "
                     f"{r['complete_s']:.2f}x, CPU per job {r['cpu_ms_per_job']:.2f}x, peak RSS "
                     f"{r['peak_rss_mib']:.2f}x, requests per job {r['requests_per_job']:.2f}x (without the event "
                     f"{r['requests_per_job_without_events']:.2f}x), status writes {r['status_writes_per_job']:.2f}x")
    return "\n".join(lines)


#: The figures held trainjob / Kubeflow (the issue's targets: Complete <= 1.0x, CPU <= 2.0x, RSS <= 1.5x,
#: requests without the event <= 1.0x).
RATIOS = ("running_s", "complete_s", "pods_per_s", "cpu_ms_per_job", "peak_rss_mib", "requests_per_job",
          "requests_per_job_without_events", "status_writes_per_job")


def medians(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each controller's figures per scenario, by ``<scenario>.<controller>``: the median of its finished rounds
    (``--rounds``; one round: that run's), with ``rounds`` saying how many."""
    grouped: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        if "error" not in r:
            grouped[f"{r['scenario']}.{r['controller']}"].append(r)
    out = {}
    for name, runs in grouped.items():
        figures = {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and k != "round"}
        out[name] = {**runs[0], **figures, "rounds": len(runs)}
        out[name].pop("round", None)
    return out


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """trainjob's figure / Kubeflow's by scenario, and / the base operator's by ``<scenario>.change``, where
    both finished (medians of the rounds)."""
    by_scenario: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for r in medians(results).values():
        by_scenario[r["scenario"]][r["controller"]] = r
    out = {}
    for name, runs in by_scenario.items():
        for against, key in (("kubeflow", name), ("base", f"{name}.change")):
            ours, theirs = runs.get("trainjob"), runs.get(against)
            if ours and theirs and "error" not in ours and "error" not in theirs:
                out[key] = {k: ours[k] / max(theirs[k], 1e-9) for k in RATIOS}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--kwok (simulated nodes)")
    group.add_argument("--kwok", action="store_true",
                       help="TrainJobs to Complete on KWOK's simulated nodes, trainjob's operator and Kubeflow's "
                            "controller one after the other (the figures in benchmarks/reconcile_kwok.py)")
    group.add_argument("--fake-nodes", type=int, default=1000, help="simulated nodes (default 1000)")
    group.add_argument("--nodes-per-job", type=int, default=8, help="numNodes of each --jobs TrainJob (default 8)")
    group.add_argument("--big-job-nodes", type=int, default=None,
                       help="numNodes of the one TrainJob of the 'wide' scenario (default: --fake-nodes)")
    group.add_argument("--scenarios", default="many,wide", help="which of many,wide to run (default both)")
    group.add_argument("--controllers", default="trainjob,kubeflow",
                       help="which of trainjob,kubeflow to run (default both, in that order)")
    group.add_argument("--rounds", type=int, default=1,
                       help="run each scenario this many times under each controller, the order of the controllers "
                            "swapped every other round (whichever runs first on a new cluster is slowed by its "
                            "warming up); the ratios are of the medians (default 1)")
    group.add_argument("--run-seconds", type=float, default=2.0,
                       help="how long a simulated pod runs before it exits 0 (default 2)")
    group.add_argument("--client-qps", type=int, default=500,
                       help="API rate limit of kube-controller-manager and kube-scheduler (default 500)")
    group.add_argument("--timeout", type=float, default=1800, help="seconds a run may take (default 1800)")
    group.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                       help="skip the untimed warm-up Job before the runs (without it, the first run pays for the "
                            "fresh cluster's first pass over that many pods)")
    group.add_argument("--baseline-src", type=Path, metavar="DIR",
                       help="also run the operator of another checkout's src folder (e.g. a git worktree of the "
                            "previous release), as controller 'base', first, on the same cluster")
    group.add_argument("--profile", type=Path, metavar="DIR",
                       help="sample trainjob's operator with py-spy during each run, into DIR (collapsed stacks)")
    group.add_argument("--logs", type=Path, metavar="DIR",
                       help="copy the control plane's logs (API server, etcd, controllers, KWOK, both controllers "
                            "under test, the audit log) into DIR before the cluster goes, to read a slow run by; "
                            "each run's figures carry its wall-clock start (started_at)")
    group.add_argument("--kubeflow", choices=("pinned", "current"), default="pinned",
                       help="Kubeflow Trainer and JobSet at the versions the conformance tests pin (v2.1.0 on "
                            "JobSet v0.10.1, the default) or the current releases (scripts/cluster/build.sh --current)")
    group.add_argument("--kubeflow-feature-gates", default="", metavar="GATE=BOOL,...", type=feature_gates,
                       help="Kubeflow's --feature-gates, e.g. TrainJobStatus=true (v2.2 and later): its status "
                            "endpoint and the pods' status client, which trainjob's operator always gives them")


def feature_gates(text: str) -> dict[str, bool]:
    """``TrainJobStatus=true,Other=false`` as a dict.

    >>> feature_gates("TrainJobStatus=true")
    {'TrainJobStatus': True}
    """
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if value.lower() not in ("true", "false") or not name:
            raise argparse.ArgumentTypeError(f"a feature gate is NAME=true or NAME=false, got {item!r}")
        gates[name] = value.lower() == "true"
    return gates


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the KWOK scenarios that ``args`` select; print the table; return what ``--json`` writes."""
    import tempfile

    scenarios = {
        "many": Scenario("many", args.jobs, args.nodes_per_job),
        "wide": Scenario("wide", 1, args.big_job_nodes or args.fake_nodes),
    }
    chosen = [scenarios[name] for name in args.scenarios.split(",")]
    os.environ[RELEASES_ENV] = args.kubeflow
    results: list[dict[str, Any]] = []
    first_start = 0.0
    with tempfile.TemporaryDirectory() as tmp, \
            ControlPlane.start(Path(tmp) / "cluster", client_qps=args.client_qps, nodes=0) as cp:
        cluster = TrainJobCluster(cp, Path(tmp))
        install(cluster)
        wait_admitted(cluster.api, PROBE_JOBSET)
        controllers: dict[str, Controller] = {"trainjob": TrainJobOperator(cluster, args.workers),
                                              "base": TrainJobOperator(cluster, args.workers, args.baseline_src),
                                              "kubeflow": Kubeflow(cp, args.kubeflow_feature_gates)}
        with SimulatedNodes.start(cp, run_seconds=args.run_seconds, log_level="WARN", delete_on_stop=False) as kwok:
            started = time.monotonic()
            kwok.add_nodes(args.fake_nodes, timeout=600)
            print(f"{args.fake_nodes} simulated nodes Ready in {time.monotonic() - started:.0f} s; control plane "
                  f"{cp.components['versions']}; client QPS {args.client_qps}; pods run {args.run_seconds:g} s; "
                  f"operator workers {args.workers}; Kubeflow's feature gates "
                  f"{args.kubeflow_feature_gates or 'as released'}", flush=True)
            try:
                first_start = first_start_rss(controllers["trainjob"])
                print(f"trainjob's operator, first start on this cluster (issues its status endpoint's TLS Secret): "
                      f"peak RSS {first_start:.0f} MiB; the runs below start it again, as on a cluster it ran on "
                      "before", flush=True)
                if args.warm_up:
                    pods = max(scenario.pods for scenario in chosen)
                    print(f"warm-up: a Job of {pods} pods, no trainer controller, Complete in "
                          f"{warm_up(cluster, pods, args.timeout):.0f} s (not counted)", flush=True)
                for scenario in chosen:
                    for round_ in range(args.rounds):
                        order = args.controllers.split(",")
                        if round_ % 2:  # every other round the other controller goes first
                            order.reverse()
                        for name in (["base"] if args.baseline_src else []) + order:
                            print(f"{scenario.name}: {scenario.jobs} TrainJobs x {scenario.nodes_per_job} nodes "
                                  f"under {name}" + (f", round {round_ + 1}" if args.rounds > 1 else ""), flush=True)
                            result = run(cluster, controllers[name], scenario, args.timeout, args.profile)
                            results.append({**result, "round": round_ + 1})
            finally:  # interrupted (Ctrl-C, SIGTERM): no controller outlives the control plane
                for controller in controllers.values():
                    controller.stop()
                if args.logs is not None:
                    shutil.copytree(cp.root / "logs", args.logs, dirs_exist_ok=True)
                    print(f"the control plane's logs: {args.logs}", flush=True)
    print(table(results))
    return {
        "kwok": {"fake_nodes": args.fake_nodes, "run_seconds": args.run_seconds, "client_qps": args.client_qps,
                 "workers": args.workers, "versions": cp.components["versions"],
                 "kubeflow_feature_gates": args.kubeflow_feature_gates,
                 "trainjob_first_start_rss_mib": first_start},
        "reference": {"jobset_published_pods_per_s": JOBSET_PODS_PER_S},
        "runs": results,
        # by name, for benchmarks/compare.py (which passes lists over); the median of the rounds
        **{name: {k: v for k, v in r.items() if k not in ("verbs", "error")} for name, r in medians(results).items()},
        **{f"{name}.ratio": r for name, r in ratios(results).items()},
    }
