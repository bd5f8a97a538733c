"""A local job in its image: launch time of container nodes against process nodes and the Kubeflow SDK's backend.

One trivial job (2 nodes x 1 process: a gloo process group and a barrier) three ways, interleaved ``--runs`` times
in one run of this script:

- ``processes``: ``trainjob run -f job.yaml``, the nodes processes of this Python environment;
- ``containers``: ``trainjob run -f job.yaml --containers``, each node a container of ``--image``;
- ``kubeflow``: the Kubeflow SDK's container backend (``kubeflow.trainer``, ``ContainerBackendConfig``) on the
  same engine (Podman, through its API socket, which this script starts) and the same image, where the SDK's Podman
  client installs (``pip install podman``); otherwise the column is left out and the reason printed.

Figures (medians): ``*_to_first_init_s``, from the command (or ``train()``) to the first rank reaching
``init_process_group`` (each rank prints or writes the time), ``*_total_s`` to the job's end, and the containers'
ratios to processes and Kubeflow's to ours. Podman's default ulimits are above this machine's hard limits, so
both container modes run with a ``containers.conf`` holding its limits (``default_ulimits``). The image defaults
to the test cluster's training image (``python -m kubetest.images`` builds it)::

    python benchmarks/container_launch.py --runs 5 --json /tmp/containers.json
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from compare import report

REPO = Path(__file__).resolve().parents[1]
TRIVIAL = textwrap.dedent("""
    import os, sys, time
    import torch.distributed as dist
    with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
        f.write(repr(time.time()))
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
""")


def trivial_function() -> None:
    """The same job as a Kubeflow SDK ``CustomTrainer`` function: it prints the time instead of writing it."""
    import time

    print(f"INIT {time.time()!r}", flush=True)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


def job_yaml(name: str, image: str, workdir: Path, stamps: Path) -> str:
    """The TrainJob: the script and the stamps directory mounted where they are on this machine."""
    return textwrap.dedent(f"""
        apiVersion: trainer.kubeflow.org/v1alpha1
        kind: TrainJob
        metadata: {{name: {name}}}
        spec:
          runtimeRef: {{name: torch-distributed}}
          trainer:
            image: {image}
            numNodes: 2
            numProcPerNode: 1
            command: [torchrun, {workdir}/trivial.py, {stamps}]
          podTemplateOverrides:
          - targetJobs: [{{name: node}}]
            spec:
              volumes: [{{name: work, hostPath: {{path: {workdir}, type: Directory}}}}]
              containers: [{{name: node, volumeMounts: [{{name: work, mountPath: {workdir}}}]}}]
    """)


def time_trainjob(name: str, image: str, workdir: Path, env: dict[str, str], containers: bool) -> tuple[float, float]:
    stamps = workdir / f"stamps-{name}"
    stamps.mkdir()
    manifest = workdir / f"{name}.yaml"
    manifest.write_text(job_yaml(name, image, workdir, stamps))
    argv = [sys.executable, "-m", "trainjob.cli.main", "run", "-f", str(manifest), *(["--containers"] if containers else [])]
    started, wall = time.perf_counter(), time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    total = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    subprocess.run([sys.executable, "-m", "trainjob.cli.main", "delete", name], env=env, capture_output=True)
    return min(float(p.read_text()) for p in stamps.iterdir()) - wall, total


class KubeflowBackend:
    """The Kubeflow SDK's container backend on Podman's API socket (started here, stopped by :meth:`close`)."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        import podman  # noqa: F401  (the SDK's Podman client: say it is missing before starting anything)
        from kubeflow.trainer import ContainerBackendConfig, TrainerClient
        from kubeflow.trainer.backends.container.types import TrainingRuntimeSource

        socket = workdir / "podman.sock"
        self.service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket}"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not socket.exists():
            if time.monotonic() > deadline or self.service.poll() is not None:
                raise RuntimeError("podman system service did not start")
            time.sleep(0.1)
        self.client = TrainerClient(ContainerBackendConfig(
            container_runtime="podman", container_host=f"unix://{socket}",
            runtime_source=TrainingRuntimeSource(sources=[]), pull_policy="Never"))

    def time_job(self, image: str) -> tuple[float, float]:
        from kubeflow.trainer import CustomTrainer

        started, wall = time.perf_counter(), time.time()
        job = self.client.train(trainer=CustomTrainer(func=trivial_function, num_nodes=2, image=image))
        self.client.wait_for_job_status(job, status={"Complete", "Failed"}, timeout=600, polling_interval=1)
        total = time.perf_counter() - started
        logs = list(self.client.get_job_logs(job, follow=True))  # follow=False yields no text with podman-py 5
        self.client.delete_job(job)
        inits = [float(line.split("INIT ", 1)[1]) for line in logs if "INIT " in line]
        if not inits:
            raise RuntimeError(f"the Kubeflow SDK's job printed no INIT line: {logs[-20:]}")
        return min(inits) - wall, total

    def close(self) -> None:
        self.service.terminate()
        self.service.wait(30)


def login_path_image(image: str, env: dict[str, str]) -> str:
    """``image`` with its ``torchrun`` and ``python`` also in ``/usr/local/bin``: the Kubeflow SDK's backend runs
    ``bash -lc``, whose login ``PATH`` (Debian's ``/etc/profile``) drops a virtual environment that the image's
    ``ENV PATH`` names; ``python:3.11-slim`` has them there already. Every mode runs this image, so all run the same."""
    derived = f"localhost/trainjob-bench/login-path:{image.rsplit(':', 1)[-1]}"
    if subprocess.run(["buildah", "inspect", "--type=image", derived], env=env, capture_output=True).returncode == 0:
        return derived
    container = subprocess.run(["buildah", "from", "--pull-never", image], env=env, capture_output=True, text=True,
                               check=True).stdout.strip()
    try:
        subprocess.run(["buildah", "run", container, "--", "sh", "-c",
                        'for f in torchrun python; do ln -sf "$(command -v $f)" /usr/local/bin/$f; done'],
                       env=env, check=True, capture_output=True)
        subprocess.run(["buildah", "commit", "--quiet", container, derived], env=env, check=True, capture_output=True)
    finally:
        subprocess.run(["buildah", "rm", container], env=env, capture_output=True)
    # An earlier build's derived image holds that build's layers (GBs) on this disk: it goes.
    listed = subprocess.run(["buildah", "images", "--format={{.Name}}:{{.Tag}}"], env=env, capture_output=True,
                            text=True).stdout.split()
    for older in listed:
        if older.startswith(derived.rsplit(":", 1)[0] + ":") and older != derived:
            subprocess.run(["buildah", "rmi", older], env=env, capture_output=True)
    return derived


def default_image() -> tuple[str, Path]:
    """The test cluster's training image and a storage config with which Podman finds it."""
    sys.path.insert(0, str(REPO / "tests" / "harness"))
    from kubetest.images import Builder, cache_dir

    builder = Builder(cache_dir(), cache_dir() / "build.log")
    reference = builder.training(builder.base())
    return reference, builder.storage_conf(Path(tempfile.mkdtemp()) / "storage.conf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image", help="image with Python and torch (default: the test cluster's training image)")
    parser.add_argument("--json", type=Path, help="also write the figures here (for benchmarks/compare.py)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.image:
        image = args.image
    else:
        image, storage = default_image()
        env["CONTAINERS_STORAGE_CONF"] = str(storage)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "work"  # what the job mounts: the script and the stamps, not the job's own directory
        workdir.mkdir()
        (workdir / "trivial.py").write_text(TRIVIAL)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        (Path(tmp) / "containers.conf").write_text(
            f'[containers]\ndefault_ulimits = ["nofile={hard}:{hard}", "nproc=4096:4096"]\n')
        env.update(TRAINJOB_HOME=str(Path(tmp) / "home"), CONTAINERS_CONF=str(Path(tmp) / "containers.conf"),
                   TRAINJOB_CONTAINER_ENGINE="podman")
        os.environ.update({k: env[k] for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF") if k in env})
        image = login_path_image(image, env)
        kubeflow: KubeflowBackend | None = None
        skipped = None
        try:
            kubeflow = KubeflowBackend(Path(tmp), env)
        except (ImportError, RuntimeError) as exc:
            skipped = f"the Kubeflow SDK's container backend is left out: {exc}"
            print(skipped, file=sys.stderr)
        figures: dict[str, list[tuple[float, float]]] = {"processes": [], "containers": [], "kubeflow": []}
        try:
            for run in range(args.runs):
                figures["processes"].append(time_trainjob(f"p{run}", image, workdir, env, containers=False))
                figures["containers"].append(time_trainjob(f"c{run}", image, workdir, env, containers=True))
                if kubeflow is not None:
                    figures["kubeflow"].append(kubeflow.time_job(image))
                print(f"run {run + 1}/{args.runs}: " + ", ".join(
                    f"{mode} {values[-1][0]:.2f} s to init, {values[-1][1]:.2f} s in all"
                    for mode, values in figures.items() if values), file=sys.stderr)
        finally:
            if kubeflow is not None:
                kubeflow.close()
    results: dict[str, Any] = {"image": image, "runs": args.runs, "load_average": os.getloadavg()[0]}
    for mode, values in figures.items():
        if values:
            results[f"{mode}_to_first_init_s"] = round(statistics.median(v[0] for v in values), 3)
            results[f"{mode}_total_s"] = round(statistics.median(v[1] for v in values), 3)
    results["containers_to_processes_init_ratio"] = round(
        results["containers_to_first_init_s"] / results["processes_to_first_init_s"], 2)
    if "kubeflow_to_first_init_s" in results:
        results["kubeflow_to_containers_init_ratio"] = round(
            results["kubeflow_to_first_init_s"] / results["containers_to_first_init_s"], 2)
    if skipped:
        results["kubeflow_skipped"] = skipped
    report(results, args.json)


if __name__ == "__main__":
    main()
