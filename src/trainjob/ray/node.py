"""One node of a Ray job: ``python -m trainjob.ray.node DRIVER...``, the command the ``ray-distributed`` runtime
gives every node (:mod:`trainjob.runtime.plugins.ray`).

=========  ==========================================================================================
node       what it does
=========  ==========================================================================================
0          ``ray start --head`` on ``PET_MASTER_PORT``; waits until ``PET_NNODES`` nodes have joined;
           runs ``DRIVER`` with ``RAY_ADDRESS`` set (so ``ray.init()`` and ``TorchTrainer.fit()`` use
           this cluster) and :mod:`trainjob.ray.reporting`'s callback in ``RAY_TRAIN_CALLBACKS``;
           reports Ray Train's metrics while it runs; then stops Ray and exits with the driver's code
1 ..       waits for the head at ``PET_MASTER_ADDR:PET_MASTER_PORT``, ``ray start --address`` it with
           its CPUs and GPUs, and stops Ray and exits 0 once the head is gone (the job is over)
=========  ==========================================================================================

The head's address is the torch runtime's master (``{job}-node-0-0.{job}`` in a JobSet, ``127.0.0.1`` and a free
port locally). ``DRIVER`` is a command (``python train.py ARGS``; ``torchrun train.py`` is read as ``python
train.py``: the driver runs once, and Ray starts the workers). ``TRAINJOB_RAY_NUM_CPUS`` / ``_NUM_GPUS`` (set by
the runtime from ``resourcesPerNode``) are what each node offers Ray; without them Ray counts the machine's.

Nothing of Ray outlives the node: Ray runs under ``ray start --block`` as this process's child, this process is a
child subreaper (what Ray's processes leave behind is re-parented to it), and at the end, or on SIGTERM, every
process below it gets SIGTERM and, after :data:`RAY_STOP_GRACE_SECONDS`, SIGKILL. ``ray stop`` is not used: it stops
every Ray process of the machine, other jobs' included. Ray's token authentication is off unless
``RAY_AUTH_MODE`` says otherwise: the cluster lives on the job's own network.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil

from trainjob.constants import RAY_NUM_CPUS_ENV, RAY_NUM_GPUS_ENV
from trainjob.ports import free_port
from trainjob.ray import REPORTING_CALLBACK, REPORTS_FILE_ENV
from trainjob.ray.reporting import read_reports
from trainjob.ray_storage import driver_script, storage_paths, storage_problem

#: How long node 0 waits for every node to join, and the other nodes for the head (``TRAINJOB_RAY_JOIN_TIMEOUT``).
JOIN_TIMEOUT_SECONDS = 300.0
#: A worker node stops once the head has not answered this many checks in a row, one a second.
HEAD_GONE_CHECKS = 3
#: How long Ray's processes get after SIGTERM before SIGKILL.
RAY_STOP_GRACE_SECONDS = 5.0
REPORT_POLL_SECONDS = 0.5
_PR_SET_CHILD_SUBREAPER = 36


class Stopped(Exception):
    """SIGTERM: the job is being stopped."""


def driver_command(argv: list[str]) -> list[str]:
    """The driver as this node runs it: ``python`` is this Python, ``torchrun X`` is ``python X``.

    >>> driver_command(["torchrun", "--no-python", "./drive.sh"])
    ['./drive.sh']
    """
    if not argv:
        raise SystemExit("trainjob.ray.node: no driver command (e.g. python ray_train.py)")
    head, rest = os.path.basename(argv[0]), argv[1:]
    if head == "torchrun":
        if rest[:1] == ["--no-python"]:
            return rest[1:]
        return [sys.executable, *rest]
    if head in ("python", "python3", os.path.basename(sys.executable)):
        return [sys.executable, *rest]
    return list(argv)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    rank = int(os.environ.get("PET_NODE_RANK", "0"))
    nnodes = int(os.environ.get("PET_NNODES", "1").split(":")[-1])
    host = os.environ.get("PET_MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("PET_MASTER_PORT", "6379"))
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _raise_stopped)
    node = RayNode(rank, nnodes, host, port)
    try:
        return node.run_head(driver_command(args)) if rank == 0 else node.run_worker()
    except Stopped:
        return 128 + signal.SIGTERM
    finally:
        node.stop_ray()


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped


class RayNode:
    """Ray on one node of the job; see the module docstring."""

    def __init__(self, rank: int, nnodes: int, host: str, port: int) -> None:
        self.rank, self.nnodes, self.host, self.port = rank, nnodes, host, port
        self.address = f"{host}:{port}"
        self.ray: subprocess.Popen[bytes] | None = None
        self.ports = {port}
        self.temp_dir = tempfile.mkdtemp(prefix="tjray-")  # short: Ray's socket paths live below it
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.setdefault("RAY_AUTH_MODE", "disabled")
        self.join_timeout = float(os.environ.get("TRAINJOB_RAY_JOIN_TIMEOUT", JOIN_TIMEOUT_SECONDS))

    # node 0

    def run_head(self, driver: list[str]) -> int:
        problem = _storage_problem(driver)
        if problem:
            print(f"trainjob.ray.node: {problem}", file=sys.stderr, flush=True)
            return 2
        self.start_ray(["--head", f"--port={self.port}", "--include-dashboard=false",
                        f"--ray-client-server-port={self.free_port()}"])
        self.wait_for_nodes()
        reports = os.path.join(self.temp_dir, "reports.jsonl")
        callbacks = [c for c in os.environ.get("RAY_TRAIN_CALLBACKS", "").split(",") if c.strip()]
        env = {**self.env, "RAY_ADDRESS": self.address, REPORTS_FILE_ENV: reports,
               "RAY_TRAIN_CALLBACKS": ",".join([*callbacks, REPORTING_CALLBACK])}
        print(f"[trainjob] Ray cluster of {self.nnodes} node(s) at {self.address}; running the driver: "
              f"{' '.join(driver)}", flush=True)
        process = subprocess.Popen(driver, env=env)
        offset, step = 0, 0
        while True:
            try:
                code = process.wait(REPORT_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
            except Stopped:
                process.terminate()
                raise
            records, offset = read_reports(reports, offset)
            for record in records:
                step = _report(record, step)
            if code is not None:
                return code if code >= 0 else 128 - code

    def wait_for_nodes(self) -> None:
        """Until ``nnodes`` Ray nodes are alive (the head included)."""
        deadline = time.monotonic() + self.join_timeout
        while not _reachable(self.host, self.port):  # ray.init would wait for a GCS that never comes
            self._check_ray()
            if time.monotonic() > deadline:
                raise SystemExit(f"trainjob.ray.node: the Ray head did not listen at {self.address} within "
                                 f"{self.join_timeout:.0f}s")
            time.sleep(0.2)
        if self.nnodes <= 1:
            return
        import ray

        ray.init(address=self.address, logging_level="WARNING", log_to_driver=False)
        try:
            while (alive := sum(1 for n in ray.nodes() if n.get("Alive"))) < self.nnodes:
                self._check_ray()
                if time.monotonic() > deadline:
                    raise SystemExit(f"trainjob.ray.node: {alive} of {self.nnodes} Ray nodes joined the head at "
                                     f"{self.address} within {self.join_timeout:.0f}s")
                time.sleep(0.5)
        finally:
            ray.shutdown()

    # nodes 1 ..

    def run_worker(self) -> int:
        deadline = time.monotonic() + self.join_timeout
        while not _reachable(self.host, self.port):
            if time.monotonic() > deadline:
                print(f"trainjob.ray.node: the Ray head at {self.address} did not answer within "
                      f"{self.join_timeout:.0f}s", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.5)
        self.start_ray([f"--address={self.address}"])
        misses = 0
        while misses < HEAD_GONE_CHECKS:
            time.sleep(1.0)
            self._check_ray()
            misses = 0 if _reachable(self.host, self.port) else misses + 1
        print(f"[trainjob] the Ray head at {self.address} is gone: node {self.rank} leaves", flush=True)
        return 0

    # Ray's processes

    def start_ray(self, role: list[str]) -> None:
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", *role, "--block", "--disable-usage-stats",
                f"--temp-dir={self.temp_dir}", f"--dashboard-agent-listen-port={self.free_port()}"]
        if self.host in ("127.0.0.1", "localhost"):
            argv.append("--node-ip-address=127.0.0.1")
        elif self.rank == 0:  # the head is the master: its address is this pod's (Ray would guess a route's)
            with contextlib.suppress(OSError):
                argv.append(f"--node-ip-address={socket.gethostbyname(self.host)}")
        for env, flag in ((RAY_NUM_CPUS_ENV, "--num-cpus"), (RAY_NUM_GPUS_ENV, "--num-gpus")):
            if os.environ.get(env):
                argv.append(f"{flag}={os.environ[env]}")
        self.ray = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL)

    def free_port(self) -> int:
        """A free port that is none of the ports this node already uses (the head's was picked the same way, by
        whoever started the node, and is free again until Ray binds it)."""
        while (port := free_port("")) in self.ports:
            pass
        self.ports.add(port)
        return port

    def _check_ray(self) -> None:
        if self.ray is not None and self.ray.poll() is not None:
            raise SystemExit(f"trainjob.ray.node: Ray on node {self.rank} exited with code {self.ray.returncode}")

    def stop_ray(self) -> None:
        """SIGTERM to every process below this one, SIGKILL to those left after the grace period."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        me = psutil.Process()
        with contextlib.suppress(psutil.Error):
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.terminate()
        deadline = time.monotonic() + RAY_STOP_GRACE_SECONDS
        while time.monotonic() < deadline and _reap_children(me):
            time.sleep(0.1)
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        _reap_children(me)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _reap_children(me: psutil.Process) -> bool:
    """Reap ended children; whether any process is left below this one."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    return any(c.status() != psutil.STATUS_ZOMBIE for c in _safe_children(me))


def _safe_children(me: psutil.Process) -> list[psutil.Process]:
    try:
        return me.children(recursive=True)
    except psutil.Error:
        return []


def _report(record: dict[str, object], step: int) -> int:
    from trainjob.torch.metrics import report

    metrics = record.get("metrics")
    step = int(record.get("step") or step + 1)  # type: ignore[call-overload]
    if isinstance(metrics, dict) and metrics:
        report(metrics, step=step)
    return step


def _storage_problem(driver: list[str]) -> str | None:
    script = driver_script(driver)
    if script is None:
        return None
    return next((p for p in map(storage_problem, storage_paths(script)) if p), None)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
