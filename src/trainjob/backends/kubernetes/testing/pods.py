"""Run a rendered JobSet's pods as local processes, each in its own network namespace: a tiny kubelet for tests.

Each pod gets what Kubernetes would give it: its own host (a network namespace with a veth into a bridge), its
pod host name (``{jobset}-{job}-{jobIndex}-{completionIndex}``, also set as the UTS host name), ``/etc/hosts``
entries for every pod's ``{hostname}.{subdomain}`` (what the JobSet's headless service resolves), and the container
environment with ``valueFrom`` completion-index references resolved. Requires root::

    with PodNetwork() as network:
        pods = run_jobset(jobset, network, workdir=tmp, extra_env={"PATH": venv_bin + ":/usr/bin:/bin"})
    assert all(pod.returncode == 0 for pod in pods)

Everything created (namespaces, veths, the bridge, ``/etc/netns/<ns>``) is removed on exit, also after errors.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainjob.runtime.plan import COMPLETION_INDEX_FIELD_PATH

_SERIAL = itertools.count()


def netns_unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "pod emulation needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "pod emulation needs the ip (iproute2) and unshare (util-linux) commands"
    probe = f"tjprobe{os.getpid()}"
    created = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if created.returncode != 0:
        return f"ip netns add failed: {created.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class PodSpec:
    """One pod of a JobSet: where it runs and what it starts."""

    hostname: str
    subdomain: str
    completion_index: int
    command: list[str]
    env: dict[str, str]
    working_dir: str | None = None

    @property
    def fqdn(self) -> str:
        return f"{self.hostname}.{self.subdomain}"


@dataclass
class FinishedPod:
    spec: PodSpec
    returncode: int
    log: str


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def container_env(container: dict[str, Any], completion_index: int) -> dict[str, str]:
    """The container's environment as the kubelet resolves it (literal values, the completion-index field)."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == COMPLETION_INDEX_FIELD_PATH:
            env[var["name"]] = str(completion_index)
        else:
            raise ValueError(
                f"env {var['name']}: only literal values and the completion index can be emulated, got {var}"
            )
    return env


def pod_specs(jobset: dict[str, Any]) -> list[PodSpec]:
    """Every pod the JobSet's Jobs would create, with host names as JobSet assigns them."""
    name = jobset["metadata"]["name"]
    subdomain = (jobset["spec"].get("network") or {}).get("subdomain") or name
    pods = []
    for rj in jobset["spec"]["replicatedJobs"]:
        job_spec = rj["template"]["spec"]
        container = job_spec["template"]["spec"]["containers"][0]
        for job_index in range(int(rj.get("replicas", 1))):
            for completion_index in range(int(job_spec.get("parallelism", 1))):
                env = container_env(container, completion_index)
                env["HOSTNAME"] = f"{name}-{rj['name']}-{job_index}-{completion_index}"
                pods.append(
                    PodSpec(
                        hostname=env["HOSTNAME"],
                        subdomain=subdomain,
                        completion_index=completion_index,
                        command=[*(container.get("command") or []), *(container.get("args") or [])],
                        env=env,
                        working_dir=container.get("workingDir"),
                    )
                )
    return pods


@dataclass
class PodNetwork:
    """A bridge plus one network namespace per pod; ``hosts`` is the shared /etc/hosts content."""

    subnet: ipaddress.IPv4Network = field(
        default_factory=lambda: ipaddress.ip_network(f"10.231.{os.getpid() % 250}.0/24")
    )
    tag: str = field(default_factory=lambda: f"tj{os.getpid() % 100000}x{next(_SERIAL)}")
    namespaces: list[str] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)
    _bridge_up: bool = False

    @property
    def bridge(self) -> str:
        return f"{self.tag}b"[:15]

    def __enter__(self) -> PodNetwork:
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self._bridge_up = True
            _run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_pods(self, pods: list[PodSpec]) -> None:
        """Create a namespace per pod and an /etc/hosts in each that resolves every pod's names."""
        hosts = ["127.0.0.1 localhost"]
        for pod in pods:
            netns = f"{self.tag}p{len(self.namespaces)}"
            address = str(self.subnet.network_address + len(self.namespaces) + 2)
            self.namespaces.append(netns)
            self.addresses[pod.hostname] = address
            veth, peer = f"{netns}h"[:15], f"{netns}c"[:15]
            _run("ip", "netns", "add", netns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", netns)
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")
            _run("ip", "-n", netns, "link", "set", peer, "name", "eth0")
            _run("ip", "-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
            _run("ip", "-n", netns, "link", "set", "eth0", "up")
            hosts.append(f"{address} {pod.fqdn} {pod.hostname}")
        for netns in self.namespaces:
            etc = Path("/etc/netns") / netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts) + "\n")

    def close(self) -> None:
        for netns in self.namespaces:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)  # also removes its veth pair
            shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)
        self.namespaces.clear()
        with contextlib.suppress(OSError):  # /etc/netns itself goes when nothing else uses it
            Path("/etc/netns").rmdir()
        if self._bridge_up:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            self._bridge_up = False


def run_jobset(
    jobset: dict[str, Any],
    network: PodNetwork,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
    timeout: float = 180.0,
) -> list[FinishedPod]:
    """Start every pod of ``jobset`` in ``network`` and wait for all of them; a timeout kills them all."""
    pods = pod_specs(jobset)
    network.add_pods(pods)
    procs: list[tuple[PodSpec, subprocess.Popen[bytes], Path]] = []
    try:
        for pod, netns in zip(pods, network.namespaces, strict=True):
            log = workdir / f"{pod.hostname}.log"
            # The pod's own UTS namespace carries its host name, as in a real pod.
            argv = [
                "ip",
                "netns",
                "exec",
                netns,
                "unshare",
                "--uts",
                "--",
                "sh",
                "-c",
                'hostname "$0" && exec "$@"',
                pod.hostname,
                *pod.command,
            ]
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    env={**pod.env, **(extra_env or {})},
                    cwd=pod.working_dir or workdir,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append((pod, proc, log))
        deadline = time.monotonic() + timeout
        for pod, proc, _ in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                tails = "\n".join(
                    f"--- {p.hostname}\n{log.read_text(errors='replace')[-2000:]}" for p, _, log in procs
                )
                raise TimeoutError(
                    f"pod {pod.hostname} still runs after {timeout:g} s; logs:\n{tails}"
                ) from None
    finally:
        for _, proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [FinishedPod(pod, proc.returncode, log.read_text(errors="replace")) for pod, proc, log in procs]
