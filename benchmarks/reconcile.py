"""How fast the operator turns TrainJobs into JobSets, on a real control plane (etcd, kube-apiserver, controllers,
JobSet; ``scripts/cluster/build.sh``), against plain creates through the same API server in the same run.

    python benchmarks/reconcile.py --jobs 1000 --workers 4

1. Baseline: this process renders each job's JobSet with the runtime framework and creates it with one client
   (no operator, no watch, no status): the floor set by the API server, admission (JobSet's webhooks) and etcd.
2. Operator: ``trainjob operator`` (a separate process, with its ServiceAccount's token, as in a cluster) finds the
   same number of TrainJobs already created (a restart with a backlog) and reconciles them: signed runtime
   snapshot, render, JobSet create, status. Timed until every JobSet exists; its peak RSS is sampled, and the API
   requests it made are counted from the API server's audit log.

3. With ``--compare-kubeflow``: Kubeflow Trainer's controller manager (v2.1.0, built from its Go module, with its
   ServiceAccount and ClusterRole, ``tests/harness/kubetest/kubeflow.py``) on the same backlog in another namespace
   of the same API server, after trainjob's jobs are deleted (both controllers claim every TrainJob). Timed from
   its process start; its requests come from the same audit log.

Jobs are created suspended, so the JobSet and Job controllers work but no pod starts. Needs root and Go, as the
Kubernetes tests do.

    python benchmarks/reconcile.py --jobs 1000 --compare-kubeflow

4. With ``--kwok``: TrainJobs run to Complete on simulated nodes (KWOK), 1,000 TrainJobs x 8 nodes and one
   TrainJob x 1,000 nodes, under trainjob's operator and under Kubeflow's controller; see
   ``benchmarks/reconcile_kwok.py`` for what is measured and how.

    python benchmarks/reconcile.py --kwok --json kwok.json
    python benchmarks/reconcile.py --kwok --fake-nodes 50 --jobs 20 --nodes-per-job 4
    python benchmarks/reconcile.py --kwok --kubeflow current --kubeflow-feature-gates TrainJobStatus=true

``--json PATH`` writes the figures of any mode to PATH.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

import reconcile_kwok  # noqa: E402  (beside this file)
from kubetest.cluster import TrainJobCluster  # noqa: E402
from kubetest.controlplane import AUDITED_ACCOUNTS, ControlPlane, free_port  # noqa: E402
from kubetest.kubeflow import KubeflowController  # noqa: E402

from trainjob.api import TrainJob  # noqa: E402
from trainjob.backends.kubernetes.kubeapi import KubeApi  # noqa: E402
from trainjob.backends.kubernetes.resources import JOBSETS, TRAINJOBS  # noqa: E402
from trainjob.runtime import builtin_runtimes as runtime_models  # noqa: E402
from trainjob.runtime import resolve  # noqa: E402
from trainjob.runtime.render import render_objects  # noqa: E402


def job_body(name: str, namespace: str) -> dict:
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "suspend": True,
            "trainer": {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", "train.py"]},
        },
    }


def baseline(api: KubeApi, jobs: int) -> float:
    """Seconds for render + create of ``jobs`` JobSets by a plain client (namespace ``baseline``)."""
    runtime = runtime_models()["torch-distributed"]
    start = time.perf_counter()
    for i in range(jobs):
        job = TrainJob.from_dict(job_body(f"job-{i}", "baseline"))
        for obj in render_objects(resolve(job, runtime)):
            obj["metadata"]["namespace"] = "baseline"
            obj.setdefault("spec", {})["suspend"] = True
            api.create(obj)
    return time.perf_counter() - start


def count(api: KubeApi, namespace: str) -> int:
    return len(api.list(JOBSETS, namespace))


def timed(api: KubeApi, namespace: str, jobs: int, pid: int, alive: Callable[[], bool]) -> tuple[float, float, int]:
    """Seconds until the first and the last of ``jobs`` JobSets in ``namespace`` exist, and the peak RSS of
    process ``pid`` meanwhile (sampled every 50 ms)."""
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        process = psutil.Process(pid)
        while not done.is_set():
            try:
                peak = max(peak, process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    first = None
    try:
        while (created := count(api, namespace)) < jobs:
            if not alive():
                raise RuntimeError("the controller exited")
            if created and first is None:
                first = time.perf_counter() - start
            time.sleep(0.05 if first is None else 0.5)
        elapsed = time.perf_counter() - start
    finally:
        done.set()
    return first or elapsed, elapsed, peak


def run_operator(kubeconfig: Path, api: KubeApi, jobs: int, workers: int) -> tuple[float, float, int]:
    """trainjob's operator (started now) on the backlog in namespace ``bench``."""
    status_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainjob.cli.main", "operator", f"--kubeconfig={kubeconfig}", f"--workers={workers}",
         f"--status-url=https://127.0.0.1:{status_port}", f"--status-port={status_port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return timed(api, "bench", jobs, proc.pid, lambda: proc.poll() is None)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_kubeflow(cp: ControlPlane, api: KubeApi, jobs: int) -> tuple[float, float, int]:
    """Kubeflow Trainer's controller manager (started now) on the backlog in namespace ``bench-kubeflow``."""
    controller = KubeflowController(cp)
    started = time.perf_counter()
    controller.start()
    try:
        assert controller.process is not None
        first, elapsed, peak = timed(api, "bench-kubeflow", jobs, controller.process.popen.pid, controller.alive)
        ready = time.perf_counter() - started - elapsed  # its start until ready, which timed() did not see
        return first + ready, elapsed + ready, peak
    finally:
        controller.stop()


def empty(api: KubeApi, namespace: str) -> None:
    """Delete every TrainJob in ``namespace`` (their JobSets go with them) and wait until they are gone, so the
    next controller has only its own backlog."""
    custom_objects(api).delete_collection_namespaced_custom_object(
        TRAINJOBS.group, TRAINJOBS.version, namespace, TRAINJOBS.plural
    )
    while api.list(TRAINJOBS, namespace):
        time.sleep(0.5)


def report(name: str, jobs: int, base: float, result: tuple[float, float, int], requests: list[dict]) -> dict:
    first, elapsed, peak = result
    steady = (jobs - 1) / max(elapsed - first, 1e-9)
    verbs = collections.Counter(f"{r['verb']} {r['objectRef'].get('resource')}" for r in requests if r.get("objectRef"))
    print(f"{name}: start to first JobSet {first:6.2f} s; all {jobs} in {elapsed:6.2f} s; {steady:6.1f} jobs/s after"
          f" the first ({jobs / base / steady:.1f}x the baseline's time per job); peak RSS {peak / 2**20:.0f} MiB;"
          f" {len(requests)} API requests ({len(requests) / jobs:.1f} per job)")
    print("  " + ", ".join(f"{k}: {v}" for k, v in verbs.most_common()))
    return {"first": first, "elapsed": elapsed, "jobs_per_s": steady, "rss": peak, "requests": len(requests) / jobs}


def custom_objects(api: KubeApi) -> Any:
    import kubernetes.client

    return kubernetes.client.CustomObjectsApi(api.client)


def main() -> None:
    # SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C, so the control plane's processes are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--compare-kubeflow", action="store_true",
                        help="also run Kubeflow Trainer's controller manager on the same backlog, same API server")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    reconcile_kwok.add_arguments(parser)
    args = parser.parse_args()
    figures = reconcile_kwok.main(args) if args.kwok else backlog(args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def backlog(args: argparse.Namespace) -> dict[str, Any]:
    """Modes 1-3: the suspended backlog, turned into JobSets."""
    operator_user, kubeflow_user = AUDITED_ACCOUNTS
    figures: dict[str, Any] = {"jobs": args.jobs, "workers": args.workers}

    with tempfile.TemporaryDirectory() as tmp, ControlPlane.start(Path(tmp) / "cluster", nodes=0) as cp:
        cluster = TrainJobCluster(cp, Path(tmp))
        reconcile_kwok.install(cluster)
        api: KubeApi = cluster.api
        reconcile_kwok.wait_admitted(api, reconcile_kwok.PROBE_JOBSET)
        namespaces = ("baseline", "bench", "bench-kubeflow")
        cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces])
        base = baseline(api, args.jobs)
        print(f"jobs: {args.jobs}, operator workers: {args.workers}; control plane: {cp.components['versions']}")
        print(f"baseline (render + create, one client): {base:6.2f} s, {args.jobs / base:6.1f} jobs/s, 1 request per job")
        figures["baseline"] = {"elapsed": base, "jobs_per_s": args.jobs / base}

        for i in range(args.jobs):
            api.create(job_body(f"job-{i}", "bench"), TRAINJOBS)
        before = len(cp.audit_requests(operator_user))
        result = run_operator(cluster.operator_kubeconfig, api, args.jobs, args.workers)
        time.sleep(2)  # let the last status writes land in the audit log
        ours = report("trainjob operator", args.jobs, base, result, cp.audit_requests(operator_user)[before:])
        figures["trainjob"] = ours

        if args.compare_kubeflow:
            empty(api, "bench")
            for i in range(args.jobs):
                api.create(job_body(f"job-{i}", "bench-kubeflow"), TRAINJOBS)
            before = len(cp.audit_requests(kubeflow_user))
            result = run_kubeflow(cp, api, args.jobs)
            time.sleep(2)
            theirs = report("Kubeflow Trainer controller", args.jobs, base, result,
                            cp.audit_requests(kubeflow_user)[before:])
            figures["kubeflow"] = theirs
            print(
                f"trainjob / Kubeflow: jobs/s {ours['jobs_per_s'] / theirs['jobs_per_s']:.2f}x, "
                f"time to all JobSets {ours['elapsed'] / theirs['elapsed']:.2f}x, "
                f"API requests per job {ours['requests'] / theirs['requests']:.2f}x, "
                f"peak RSS {ours['rss'] / theirs['rss']:.2f}x"
            )
    return figures


if __name__ == "__main__":
    main()
