"""How fast the operator turns TrainJobs into JobSets, on a real control plane (etcd, kube-apiserver, controllers,
JobSet; ``scripts/cluster/build.sh``), against plain creates through the same API server in the same run.

    python benchmarks/reconcile.py --jobs 1000 --workers 4

1. Baseline: this process renders each job's JobSet with the runtime framework and creates it with one client
   (no operator, no watch, no status): the floor set by the API server, admission (JobSet's webhooks) and etcd.
2. Operator: ``trainjob operator`` (a separate process, with its ServiceAccount's token, as in a cluster) finds the
   same number of TrainJobs already created (a restart with a backlog) and reconciles them: signed runtime
   snapshot, render, JobSet create, status. Timed until every JobSet exists; its peak RSS is sampled, and the API
   requests it made are counted from the API server's audit log.

Jobs are created suspended, so the JobSet and Job controllers work but no pod starts. Needs root and Go, as the
Kubernetes tests do.
"""

from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from kubetest.cluster import TrainJobCluster  # noqa: E402
from kubetest.controlplane import ControlPlane  # noqa: E402

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


def run_operator(kubeconfig: Path, api: KubeApi, jobs: int, workers: int) -> tuple[float, float, int]:
    """Seconds until the operator's first and last JobSet in namespace ``bench`` exist, and its peak RSS."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainjob.cli.main", "operator", f"--kubeconfig={kubeconfig}", f"--workers={workers}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        process = psutil.Process(proc.pid)
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
        while (created := count(api, "bench")) < jobs:
            if proc.poll() is not None:
                raise RuntimeError(f"the operator exited with {proc.returncode}")
            if created and first is None:
                first = time.perf_counter() - start
            time.sleep(0.05 if first is None else 0.5)
        elapsed = time.perf_counter() - start
    finally:
        done.set()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return first or elapsed, elapsed, peak


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, ControlPlane.start(Path(tmp) / "cluster") as cp:
        cluster = TrainJobCluster(cp, Path(tmp))
        cluster.install()
        api: KubeApi = cluster.api
        cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in ("baseline", "bench")])
        base = baseline(api, args.jobs)
        for i in range(args.jobs):
            api.create(job_body(f"job-{i}", "bench"), TRAINJOBS)
        before = len(cp.audit_requests())
        first, elapsed, peak = run_operator(cluster.operator_kubeconfig, api, args.jobs, args.workers)
        time.sleep(2)  # let the last status writes land in the audit log
        requests = cp.audit_requests()[before:]
        complete = sum(1 for j in api.list(TRAINJOBS, "bench") if "annotations" in j["metadata"])
    verbs = collections.Counter(f"{r['verb']} {r['objectRef'].get('resource')}" for r in requests if r.get("objectRef"))

    print(f"jobs: {args.jobs}, operator workers: {args.workers}")
    print(f"baseline (render + create, one client):  {base:7.2f} s  {args.jobs / base:7.1f} jobs/s")
    print(f"operator / baseline time per job: see below; control plane: {cp.components['versions']}")
    steady = (args.jobs - 1) / max(elapsed - first, 1e-9)
    print(f"operator start to first JobSet: {first:7.2f} s")
    print(
        f"operator (snapshot, render, create, status): {elapsed:7.2f} s in all, {steady:7.1f} jobs/s after the"
        f" first  ({args.jobs / base / steady:.1f}x the baseline's time per job)"
    )
    print(f"operator peak RSS: {peak / 2**20:.0f} MiB; jobs with a runtime snapshot: {complete}")
    print(f"operator API requests: {len(requests)} ({len(requests) / args.jobs:.1f} per job; the baseline makes 1)")
    print("  " + ", ".join(f"{k}: {v}" for k, v in verbs.most_common()))


if __name__ == "__main__":
    main()
