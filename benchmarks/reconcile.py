"""How fast the operator turns TrainJobs into JobSets, against the Kubernetes API stand-in on loopback.

    python benchmarks/reconcile.py --jobs 1000 --workers 4

1. Baseline: this process renders each job's JobSet with the runtime framework and creates it with one client
   (no operator, no watch, no status): the floor set by the stand-in and the client.
2. Operator: ``trainjob operator`` (a separate process, as in a cluster) finds the same number of TrainJobs already
   created (a restart with a backlog) and reconciles them: runtime snapshot, render, JobSet create, status. Timed
   until every JobSet exists; its peak RSS is sampled.

The stand-in runs in its own process too, without schema admission, so the figures are the operator's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from trainjob.api import TrainJob
from trainjob.backends.kubernetes.config import KubernetesBackendConfig, load_api_client
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.manifests import builtin_runtimes
from trainjob.backends.kubernetes.resources import CLUSTER_TRAINING_RUNTIMES, JOBSETS, TRAINJOBS
from trainjob.runtime import builtin_runtimes as runtime_models
from trainjob.runtime import resolve
from trainjob.runtime.render import render_objects


def job_body(name: str, namespace: str) -> dict:
    return {
        "apiVersion": TRAINJOBS.api_version,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "numProcPerNode": 1, "command": ["torchrun", "train.py"]},
        },
    }


def start_standin() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainjob.backends.kubernetes.testing.server"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "s", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "s", "context": {"cluster": "s", "user": "u"}}],
                "current-context": "s",
            }
        )
    )


def baseline(api: KubeApi, jobs: int) -> float:
    """Seconds for render + create of ``jobs`` JobSets by a plain client (namespace ``baseline``)."""
    runtime = runtime_models()["torch-distributed"]
    start = time.perf_counter()
    for i in range(jobs):
        job = TrainJob.from_dict(job_body(f"job-{i}", "baseline"))
        for obj in render_objects(resolve(job, runtime)):
            api.create(obj)
    return time.perf_counter() - start


def count(api: KubeApi, namespace: str) -> int:
    return len(api.list(JOBSETS, namespace))


def run_operator(kubeconfig: Path, api: KubeApi, jobs: int, workers: int) -> tuple[float, float, int]:
    """Seconds until the operator's first and last JobSet in namespace ``bench`` exist, and its peak RSS."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # What `trainjob operator --kubeconfig ... --workers N` runs, without loading the rest of the CLI.
    program = (
        "from trainjob.backends.kubernetes.config import KubernetesBackendConfig\n"
        "from trainjob.backends.kubernetes.operator import run_operator\n"
        f"run_operator(KubernetesBackendConfig(config_file={str(kubeconfig)!r}), workers={workers})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("BENCH_DEBUG") else subprocess.DEVNULL,
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

    standin, url = start_standin()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            write_kubeconfig(kubeconfig, url)
            api = KubeApi(load_api_client(KubernetesBackendConfig(config_file=str(kubeconfig))))
            for runtime in builtin_runtimes():
                api.create(runtime, CLUSTER_TRAINING_RUNTIMES)

            base = baseline(api, args.jobs)
            for i in range(args.jobs):
                api.create(job_body(f"job-{i}", "bench"), TRAINJOBS)
            first, elapsed, peak = run_operator(kubeconfig, api, args.jobs, args.workers)
            complete = sum(1 for j in api.list(TRAINJOBS, "bench") if "annotations" in j["metadata"])
    finally:
        standin.terminate()
        standin.wait(30)

    print(f"jobs: {args.jobs}, operator workers: {args.workers}")
    print(f"baseline (render + create, one client):  {base:7.2f} s  {args.jobs / base:7.1f} jobs/s")
    steady = (args.jobs - 1) / max(elapsed - first, 1e-9)
    print(f"operator start to first JobSet: {first:7.2f} s")
    print(
        f"operator (snapshot, render, create, status): {elapsed:7.2f} s in all, {steady:7.1f} jobs/s after the"
        f" first  ({args.jobs / base / steady:.1f}x the baseline's time per job)"
    )
    print(f"operator peak RSS: {peak / 2**20:.0f} MiB; jobs with a runtime snapshot: {complete}")


if __name__ == "__main__":
    main()
