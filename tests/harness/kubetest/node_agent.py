"""The node agent: the one stand-in of the test cluster, for the kubelet and the container runtime.

There is no container engine on these machines, so this process plays the node: it registers a Node (with its
CPU/memory capacity, a Lease heartbeat and a Ready condition) as ``system:node:<name>``, so the real API server's
Node authorizer and NodeRestriction admission apply to it; it runs every pod the real scheduler binds to it, and
it reports pod phase, readiness, container exit codes and termination messages back. What it does per pod:

- one network namespace per pod (a veth into the agent's bridge, a route to the other nodes' pods through it), with ``/etc/hosts``
  resolving ``{hostname}.{subdomain}`` of every pod in the namespace, and the pod's UTS host name. Pods on other
  agents' nodes are reached through the host, which forwards between the agents' bridges (each bridge forwards;
  the host's ``ip_forward`` is left alone); their names come from the files the agents share in ``--hosts-dir``
  (each writes its own pods' there), in place of the cluster's DNS;
- each container runs as local processes with its ``command``/``args`` and environment (``$(VAR)``, downward API
  such as ``batch.kubernetes.io/job-completion-index``, config maps, secrets), in a private mount namespace where
  emptyDir / hostPath / configMap / secret / projected / PVC volumes are bind-mounted at their ``mountPath``, a
  mount point under ``/run`` (the service account token's) is made in the container's own layer over ``/run``, and
  ``/dev/termination-log`` is the container's own file, and so is its temporary folder (``TMPDIR``, a tmpfs); the image is not run (an Event says so); downward-API files
  of labels and annotations are written again when those change;
- ``restartPolicy`` Never / OnFailure / Always, init containers, deletion with the grace period (SIGTERM, then
  SIGKILL; a finished or deleted pod loses every process left in its network namespace, as a container's cgroup
  would), ``terminationMessagePolicy: FallbackToLogsOnError``;
- container logs in the CRI format, served on the kubelet's ``/containerLogs`` endpoint (TLS, client certificates
  from the cluster CA) so ``kubectl logs`` and the API server's log proxy work.

Run by :class:`kubetest.controlplane.ControlPlane`: ``python -m kubetest.node_agent --kubeconfig ... --node-name n``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetest import podspec
from kubetest.kubelet_server import LogServer, write_cri_line

#: The Node annotation with the address the pods reach the host at.
POD_GATEWAY_ANNOTATION = "trainjob.dev/pod-gateway"
#: A test may set this Node annotation to a JSON object of resources (``{"cpu": "3"}``) that replace those of
#: :meth:`NodeAgent.capacity` in the Node's capacity and allocatable; the agent applies a change at its next beat
#: (5 s) and the default again when the annotation goes.
CAPACITY_ANNOTATION = "trainjob.dev/capacity"
log = logging.getLogger("node-agent")

POLL_SECONDS = 0.25
#: Each container's TMPDIR: a tmpfs mounted there in the container's own mount namespace (the host's is untouched).
CONTAINER_TMP = "/var/tmp"
#: Every agent's pod subnet lies in this range (:func:`free_subnet`); pods reach it through their node's bridge.
POD_RANGE = ipaddress.ip_network("10.192.0.0/11")
LEASE_SECONDS = 40
FALLBACK_LOG_BYTES, FALLBACK_LOG_LINES = 2048, 80  # what the kubelet keeps for FallbackToLogsOnError


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: dict[str, dict[str, Any]], kind: str, value: bool, stamp: str, reason: str | None = None
) -> None:
    """A pod condition; its transition time moves only when its status does."""
    old = conditions.get(kind) or {}
    text = "True" if value else "False"
    moved = old.get("status") != text
    conditions[kind] = {
        "type": kind,
        "status": text,
        "lastTransitionTime": stamp if moved else old.get("lastTransitionTime"),
        "lastProbeTime": None,
    }
    if reason:
        conditions[kind]["reason"] = reason


def _under_run(path: Path) -> bool:
    """Whether ``path`` (existing or not) lies under /run, through /var/run or not."""
    return Path(os.path.realpath(path)).is_relative_to("/run")


def agent_tag(pid: int) -> str:
    """The name of the bridge of the agent whose process is ``pid``, and the start of its pods' network
    namespaces' names (``{tag}p{n}``)."""
    return f"tjk{pid % 100000}"


def kill_netns_processes(namespaces: list[str]) -> bool:
    """SIGKILL every process in the network namespaces ``namespaces`` until none is left; ``False`` when some
    survive 5 s of it."""
    for _ in range(50):
        pids = [int(pid) for netns in namespaces
                for pid in subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
                if pid.isdigit()]
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return False


def remove_netns(netns: str) -> None:
    """Delete a pod's network namespace (its veth goes with it) and its /etc/netns files."""
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    shutil.rmtree(Path("/etc/netns") / netns, ignore_errors=True)


def free_subnet(pid: int) -> ipaddress.IPv4Network:
    """The pod subnet of the agent whose process is ``pid``: a /24 of :data:`POD_RANGE` picked from its pid, moved on
    past any that an address of this machine (another agent's bridge) is already in."""
    taken = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout.split()
    addresses = [ipaddress.ip_interface(word).ip for word in taken if "/" in word and word[0].isdigit()]
    for step in range(250):
        subnet = ipaddress.ip_network(f"10.{192 + pid % 32}.{(pid + step) % 250}.0/24")
        if not any(address in subnet for address in addresses):
            return subnet
    raise RuntimeError("no free pod subnet on this machine")


def _nameservers_in(network: ipaddress.IPv4Network) -> list[str]:
    """The DNS servers of this machine (``/etc/resolv.conf``) that lie in ``network``."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(words[1]) in network:
                    found.append(words[1])
    return found


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class ContainerRun:
    name: str
    popen: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    message_path: Path | None = None
    started_at: str = ""
    restarts: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    terminated: dict[str, Any] | None = None


@dataclass
class PodRun:
    """One pod on this node: its namespace, address, directories and containers."""

    pod: dict[str, Any]
    netns: str
    address: str
    directory: Path
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    init_done: bool = False
    phase: str = "Pending"
    stopping: bool = False
    cleaned: bool = False
    created_dirs: list[Path] = field(default_factory=list)
    config_error: str | None = None

    @property
    def key(self) -> str:
        return self.pod["metadata"]["uid"]


class NodeAgent:
    def __init__(self, kubeconfig: str, node_name: str, root: Path, path_env: str, log_server: LogServer,
                 hosts_dir: Path | None = None) -> None:
        import kubernetes.client
        import kubernetes.config

        self.client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.coordination = kubernetes.client.CoordinationV1Api(self.client)
        self.node_name = node_name
        self.root = root
        self.path_env = path_env
        self.log_server = log_server
        self.pods: dict[str, PodRun] = {}
        self.lock = threading.RLock()
        self.stop_event = threading.Event()
        tag = agent_tag(os.getpid())
        self.bridge = tag[:15]
        self.subnet = free_subnet(os.getpid())
        self.free_addresses = [str(a) for a in list(self.subnet.hosts())[1:]]
        self.netns_prefix = f"{tag}p"
        self.serial = 0
        self.created_termination_log = False
        #: directories this agent created on the host for pods' mounts, and how many running pods use each
        self.made_dirs: dict[Path, int] = {}
        #: where every agent of the cluster writes its pods' host names (``{node}.json``), and what was last read
        self.hosts_dir = hosts_dir
        self.others_seen: tuple[tuple[str, int], ...] = ()

    # -- node ----------------------------------------------------------------------------------------------------

    def capacity(self) -> dict[str, str]:
        # Processes are not confined to their requests here, so the node declares a generous share of this
        # machine: enough for the tests' jobs to schedule side by side.
        cpus = max(8, 4 * (os.cpu_count() or 1))
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return {"cpu": str(cpus), "memory": str(memory), "pods": "110", "ephemeral-storage": "100Gi"}

    def register(self) -> None:
        capacity = self.capacity()
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "trainjob.dev/node-agent": "true"},
                # where the pods reach this machine (the bridge's address): a server on the host, such as the
                # operator's status endpoint, is at this address for them
                "annotations": {POD_GATEWAY_ANNOTATION: str(self.subnet.network_address + 1)},
            },
        }
        with contextlib.suppress(Exception):
            self.core.create_node(node)
        self._patch_node_status(capacity)

    def _patch_node_status(self, capacity: dict[str, str]) -> None:
        stamp = now()
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node_name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_server.port}},
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.34.4",
                "kubeProxyVersion": "", "containerRuntimeVersion": "trainjob-node-agent://0.1",
                "bootID": "", "kernelVersion": os.uname().release, "machineID": "", "osImage": "local processes",
                "systemUUID": "",
            },
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "node agent is posting ready status",
                 "lastHeartbeatTime": stamp, "lastTransitionTime": stamp},
                *[
                    {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": "", "lastHeartbeatTime": stamp,
                     "lastTransitionTime": stamp}
                    for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                                 ("PIDPressure", "SufficientPID"))
                ],
            ],
        }
        self.core.patch_node_status(self.node_name, {"status": status})

    def capacity_override(self) -> dict[str, str]:
        """The resources the Node's ``trainjob.dev/capacity`` annotation sets; none when it is absent or bad."""
        node = self.core.read_node(self.node_name)
        raw = (node.metadata.annotations or {}).get(CAPACITY_ANNOTATION)
        try:
            override = json.loads(raw) if raw else {}
        except ValueError:
            log.warning("ignoring %s: %r is not JSON", CAPACITY_ANNOTATION, raw)
            return {}
        return {str(k): str(v) for k, v in override.items()} if isinstance(override, dict) else {}

    def heartbeat(self) -> None:
        default = self.capacity()
        capacity = default
        last_status = 0.0
        while not self.stop_event.wait(0 if last_status == 0 else 5):
            try:
                self._renew_lease()
                wanted = {**default, **self.capacity_override()}
                if wanted != capacity or time.monotonic() - last_status > 20:
                    capacity = wanted
                    self._patch_node_status(capacity)
                    last_status = time.monotonic()
            except Exception as exc:  # the API server may be restarting; try again next beat
                log.warning("heartbeat failed: %s", exc)

    def _renew_lease(self) -> None:
        from kubernetes.client.exceptions import ApiException

        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": stamp},
        }
        try:
            self.coordination.patch_namespaced_lease(self.node_name, "kube-node-lease", {"spec": body["spec"]})
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", body)

    # -- network --------------------------------------------------------------------------------------------------

    def setup_network(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.subnet.network_address + 1}/{self.subnet.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        # pods of other nodes are behind other bridges: forward what comes in on this one (gone with the bridge)
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/forwarding").write_text("1")
        devices = Path("/dev/termination-log")
        if not devices.exists():  # the mount point of every container's own termination-message file
            devices.touch()
            self.created_termination_log = True

    def teardown_network(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        if self.hosts_dir is not None:
            with contextlib.suppress(OSError):
                (self.hosts_dir / f"{self.node_name}.json").unlink()
        if self.created_termination_log:
            with contextlib.suppress(OSError):
                Path("/dev/termination-log").unlink()
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()

    def _add_pod_network(self, run: PodRun) -> None:
        veth, peer = f"{run.netns}h"[:15], f"{run.netns}c"[:15]
        _run("ip", "netns", "add", run.netns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", run.netns)
        _run("ip", "link", "set", veth, "master", self.bridge)
        _run("ip", "link", "set", veth, "up")
        _run("ip", "-n", run.netns, "link", "set", "lo", "up")
        _run("ip", "-n", run.netns, "link", "set", peer, "name", "eth0")
        _run("ip", "-n", run.netns, "addr", "add", f"{run.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _run("ip", "-n", run.netns, "link", "set", "eth0", "up")
        # Other nodes' pods through the host, and nothing else: with no default route, what a pod tries to reach
        # outside the cluster (this machine's DNS server included, should it lie in the range) fails at once
        # instead of hanging, so a resolver falls back to /etc/hosts without waiting.
        _run("ip", "-n", run.netns, "route", "add", str(POD_RANGE), "via", str(self.subnet.network_address + 1))
        for server in _nameservers_in(POD_RANGE):
            _run("ip", "-n", run.netns, "route", "add", "unreachable", f"{server}/32")
        (Path("/etc/netns") / run.netns).mkdir(parents=True, exist_ok=True)
        (Path("/etc/netns") / run.netns / "hosts").touch()

    def _kill_pod_processes(self, run: PodRun) -> None:
        """SIGKILL every process left in the pod, as the container runtime does with a container's cgroup: the
        processes a container started in sessions of their own (torchrun's workers) escape its process group, but
        not the pod's network namespace."""
        if not kill_netns_processes([run.netns]):
            log.warning("processes of pod netns %s survive SIGKILL", run.netns)

    def _remove_pod_network(self, run: PodRun) -> None:
        self._kill_pod_processes(run)
        remove_netns(run.netns)
        self.free_addresses.append(run.address)

    def refresh_hosts(self) -> None:
        """Rewrite every pod's /etc/hosts in place (the file is bind-mounted into running pods): the pods of its
        namespace on this node and, from the other agents' files, on theirs; this node's are published first."""
        with self.lock:
            runs = [r for r in self.pods.values() if not r.cleaned]
            entries = [(r.pod["metadata"]["namespace"], r.address, " ".join(podspec.pod_host_names(r.pod)))
                       for r in runs]
            others = self._publish_hosts(entries)
            for run in runs:
                namespace = run.pod["metadata"]["namespace"]
                lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
                for other, (other_ns, address, names) in zip(runs, entries, strict=True):
                    if other is run or other_ns == namespace:
                        lines.append(f"{address} {names}")
                lines += [f"{address} {names}" for other_ns, address, names in others if other_ns == namespace]
                path = Path("/etc/netns") / run.netns / "hosts"
                with contextlib.suppress(OSError), path.open("r+") as f:
                    f.write("\n".join(lines) + "\n")
                    f.truncate()

    def _publish_hosts(self, entries: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        """Write this node's pods' names into the shared hosts directory; the other nodes' entries as they are now."""
        if self.hosts_dir is None:
            return []
        self.hosts_dir.mkdir(parents=True, exist_ok=True)
        mine = self.hosts_dir / f"{self.node_name}.json"
        staged = mine.with_name(f".{mine.name}.{os.getpid()}")
        staged.write_text(json.dumps(entries))
        staged.replace(mine)
        others: list[tuple[str, str, str]] = []
        seen = []
        for path in sorted(self.hosts_dir.glob("*.json")):
            if path == mine:
                continue
            with contextlib.suppress(OSError, ValueError):
                seen.append((path.name, path.stat().st_mtime_ns))
                others += [tuple(entry) for entry in json.loads(path.read_text())]
        self.others_seen = tuple(seen)
        return others

    def _others_changed(self) -> bool:
        """Whether another node's published names changed since this node's pods' hosts were last written."""
        if self.hosts_dir is None or not self.pods:
            return False
        seen = []
        for path in sorted(self.hosts_dir.glob("*.json")):
            if path.name != f"{self.node_name}.json":
                with contextlib.suppress(OSError):
                    seen.append((path.name, path.stat().st_mtime_ns))
        return tuple(seen) != self.others_seen

    # -- the API --------------------------------------------------------------------------------------------------

    def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "ConfigMap":
                return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
            import base64

            data = self.core.read_namespaced_secret(name, namespace).data or {}
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_pods(self) -> list[dict[str, Any]]:
        answer = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        return list(json.loads(answer.data).get("items", []))

    def event(self, pod: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        stamp = now()
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": event_type, "reason": reason, "message": message[:1024],
            "source": {"component": "kubelet", "host": self.node_name},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        with contextlib.suppress(Exception):
            self.core.create_namespaced_event(meta["namespace"], body)

    # -- pods -----------------------------------------------------------------------------------------------------

    def sync(self) -> None:
        pods = self.list_pods()
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self.lock:
                run = self.pods.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if run is None:
                    self._finalize_deletion(pod)
                elif not run.stopping:
                    run.stopping = True
                    grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
                    threading.Thread(target=self._stop_pod, args=(run, min(int(grace), 10), True), daemon=True).start()
                continue
            if run is None and (pod.get("status") or {}).get("phase") in (None, "Pending"):
                self._start_pod(pod)
            elif run is not None:
                changed = any(run.pod["metadata"].get(k) != pod["metadata"].get(k) for k in ("labels", "annotations"))
                run.pod["metadata"] = pod["metadata"]
                if changed and not run.cleaned:
                    self._refresh_downward_api(run)
        with self.lock:
            gone = [r for uid, r in self.pods.items() if uid not in seen and not r.stopping]
        for run in gone:  # deleted at once (grace period 0) by someone else
            run.stopping = True
            threading.Thread(target=self._stop_pod, args=(run, 0, False), daemon=True).start()
        for run in list(self.pods.values()):
            if not run.stopping:
                self._advance(run)
        if self._others_changed():
            self.refresh_hosts()

    def _start_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with self.lock:
            self.serial += 1
            address = self.free_addresses.pop(0)
            run = PodRun(
                pod=pod,
                netns=f"{self.netns_prefix}{self.serial}",
                address=address,
                directory=self.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}",
            )
            self.pods[run.key] = run
        run.directory.mkdir(parents=True, exist_ok=True)
        self._add_pod_network(run)
        self.refresh_hosts()
        images = sorted({c.get("image", "") for c in pod["spec"].get("containers", []) if c.get("image")})
        self.event(pod, "Normal", "ImageNotRun",
                   f"images are not run on node {self.node_name} (no container runtime): {', '.join(images)}; "
                   "containers run as local processes")
        self._write_status(run)

    def _volume_sources(self, run: PodRun) -> dict[str, tuple[str, Path]]:
        """Volume name -> ("bind", host path) or ("tmpfs", size-limited dir) for every pod volume."""
        pod = run.pod
        namespace = pod["metadata"]["namespace"]
        sources: dict[str, tuple[str, Path]] = {}
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            own = run.directory / "volumes" / name
            if "emptyDir" in volume:
                own.mkdir(parents=True, exist_ok=True)
                medium = (volume["emptyDir"] or {}).get("medium")
                sources[name] = ("tmpfs" if medium == "Memory" else "bind", own)
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    path.mkdir(parents=True, exist_ok=True)
                sources[name] = ("bind", path)
            elif "configMap" in volume or "secret" in volume:
                kind, ref = ("ConfigMap", volume["configMap"]) if "configMap" in volume else ("Secret", volume["secret"])
                data = self.lookup(kind, namespace, ref.get("name") or ref.get("secretName"))
                if data is None and not ref.get("optional"):
                    raise podspec.PodConfigError(f"volume {name}: {kind.lower()} not found")
                self._write_files(own, data or {}, ref.get("items"))
                sources[name] = ("bind", own)
            elif "projected" in volume:
                self._write_projected(run, own, volume["projected"])
                sources[name] = ("bind", own)
            elif "persistentVolumeClaim" in volume:
                sources[name] = ("bind", self._claim_path(namespace, volume["persistentVolumeClaim"]["claimName"]))
            else:
                raise podspec.PodConfigError(f"volume {name}: unsupported source {sorted(set(volume) - {'name'})}")
        return sources

    def _claim_path(self, namespace: str, claim: str) -> Path:
        """The bound PersistentVolume's hostPath/local path, else a directory per claim under the node root."""
        with contextlib.suppress(Exception):
            pvc = self.core.read_namespaced_persistent_volume_claim(claim, namespace)
            if pvc.spec.volume_name:
                pv = self.core.read_persistent_volume(pvc.spec.volume_name)
                source = pv.spec.host_path or pv.spec.local
                if source is not None:
                    Path(source.path).mkdir(parents=True, exist_ok=True)
                    return Path(source.path)
        path = self.root / "volumes" / namespace / claim
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def _write_files(directory: Path, data: dict[str, str], items: list[dict[str, Any]] | None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        chosen = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        for key, rel in chosen.items():
            if key in data:
                target = directory / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[key])

    def _write_projected(self, run: PodRun, directory: Path, projected: dict[str, Any]) -> None:
        pod = run.pod
        namespace = pod["metadata"]["namespace"]
        directory.mkdir(parents=True, exist_ok=True)
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                spec = source["serviceAccountToken"]
                request = {
                    "spec": {
                        "audiences": [spec["audience"]] if spec.get("audience") else None,
                        "expirationSeconds": spec.get("expirationSeconds", 3607),
                        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                           "uid": pod["metadata"]["uid"]},
                    }
                }
                token = self.core.create_namespaced_service_account_token(
                    pod["spec"].get("serviceAccountName", "default"), namespace, request
                ).status.token
                (directory / spec.get("path", "token")).write_text(token)
            elif "configMap" in source or "secret" in source:
                kind, ref = ("ConfigMap", source["configMap"]) if "configMap" in source else ("Secret", source["secret"])
                data = self.lookup(kind, namespace, ref["name"])
                if data is None and not ref.get("optional"):
                    raise podspec.PodConfigError(f"projected {kind.lower()} {ref['name']!r} not found")
                self._write_files(directory, data or {}, ref.get("items"))
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    if "fieldRef" in item:
                        (directory / item["path"]).write_text(podspec.field_value(pod, item["fieldRef"]["fieldPath"]))

    def _refresh_downward_api(self, run: PodRun) -> None:
        """Write the pod's downward-API files again after its labels or annotations changed, as the kubelet does
        (each file replaced whole, so a reader never sees half of it)."""
        for volume in run.pod["spec"].get("volumes") or []:
            for source in (volume.get("projected") or {}).get("sources") or []:
                for item in (source.get("downwardAPI") or {}).get("items") or []:
                    if "fieldRef" not in item:
                        continue
                    path = run.directory / "volumes" / volume["name"] / item["path"]
                    value = podspec.field_value(run.pod, item["fieldRef"]["fieldPath"])
                    with contextlib.suppress(OSError):
                        if path.read_text() != value:
                            staged = path.with_name(f".{path.name}.new")
                            staged.write_text(value)
                            staged.replace(path)

    def _launch(self, run: PodRun, container: dict[str, Any], sources: dict[str, tuple[str, Path]]) -> ContainerRun:
        pod = run.pod
        state = run.containers.setdefault(container["name"], ContainerRun(container["name"]))
        cdir = run.directory / container["name"]
        cdir.mkdir(parents=True, exist_ok=True)
        # A container's temporary files are its own (its image's /tmp): TMPDIR is a tmpfs of the container's mount
        # namespace, gone with its last process, so torchrun's torchelastic_* folders do not pile up on the host.
        # /tmp itself stays the host's (the tests' scripts and host paths live there); the path is short, as
        # sockets under it must be (Ray's, 107 bytes at most).
        env = {"HOSTNAME": podspec.pod_hostname(pod), "PATH": self.path_env, "HOME": "/root", "TMPDIR": CONTAINER_TMP}
        env.update(podspec.container_env(pod, container, self.lookup))
        argv = podspec.container_argv(container, env)
        state.log_path = cdir / f"{state.restarts}.log"
        state.message_path = cdir / f"{state.restarts}.termination-log"
        state.message_path.write_text("")
        script = [f"hostname {shlex.quote(podspec.pod_hostname(pod))}",
                  f"mount -t tmpfs -o mode=1777 container-tmp {CONTAINER_TMP}"]
        mounts = container.get("volumeMounts") or []
        if any(_under_run(Path(m["mountPath"])) for m in mounts):
            # /run is per boot and per container: the container gets its own layer over the host's /run, so the
            # mount points Kubernetes adds to every pod (/var/run/secrets/...) never appear on the host
            upper, work = cdir / "run-upper", cdir / "run-work"
            upper.mkdir(exist_ok=True)
            work.mkdir(exist_ok=True)
            script.append(f"mount -t overlay pod-run -o lowerdir=/run,upperdir={shlex.quote(str(upper))},"
                          f"workdir={shlex.quote(str(work))} /run")
        for mount in mounts:
            kind, source = sources[mount["name"]]
            target = Path(mount["mountPath"])
            if _under_run(target):
                script.append(f"mkdir -p {shlex.quote(str(target))}")
            else:
                self._make_host_dir(run, target)
            if mount.get("subPath"):
                source = source / mount["subPath"]
                source.mkdir(parents=True, exist_ok=True)
            if kind == "tmpfs":
                script.append(f"mount -t tmpfs tmpfs {shlex.quote(str(target))}")
            else:
                script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
            if mount.get("readOnly"):
                script.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
        message_target = container.get("terminationMessagePath") or "/dev/termination-log"
        if Path(message_target).exists():
            script.append(f"mount --bind {shlex.quote(str(state.message_path))} {shlex.quote(message_target)}")
        workdir = container.get("workingDir")
        if workdir:
            self._make_host_dir(run, Path(workdir))
        script.append(f"cd {shlex.quote(workdir or str(cdir))}")
        script.append('exec "$@"')
        popen = subprocess.Popen(
            ["ip", "netns", "exec", run.netns, "unshare", "--uts", "--mount", "--propagation", "private", "--",
             "sh", "-c", " && ".join(script), container["name"], *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        state.popen = popen
        state.started_at = now()
        state.terminated = None
        self.log_server.register(pod, container["name"], state.log_path, state.restarts)
        for stream, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            threading.Thread(target=self._pump, args=(pipe, stream, state.log_path), daemon=True).start()
        return state

    @staticmethod
    def _pump(pipe: Any, stream: str, path: Path) -> None:
        with path.open("ab") as out:
            for line in iter(pipe.readline, b""):
                write_cri_line(out, stream, line)
        pipe.close()

    def _advance(self, run: PodRun) -> None:
        """Start what is due, notice exits, restart per restartPolicy, and report the pod's status."""
        spec = run.pod["spec"]
        policy = spec.get("restartPolicy", "Always")
        changed = False
        try:
            if not run.containers and run.config_error is None:
                run.sources = self._volume_sources(run)  # type: ignore[attr-defined]
                changed = True
            if not run.init_done and run.config_error is None:
                for init in spec.get("initContainers") or []:
                    state = run.containers.get(init["name"])
                    if state is None:
                        self._launch(run, init, run.sources)  # type: ignore[attr-defined]
                        self._write_status(run)
                        return
                    if state.terminated is None and not self._reap(state, run, init):
                        return
                    if state.terminated and state.terminated["exitCode"] != 0:
                        if policy == "Never":
                            run.phase = "Failed"
                            self._finish(run)
                            return
                        state.restarts += 1
                        self._launch(run, init, run.sources)  # type: ignore[attr-defined]
                        return
                run.init_done = True
                for container in spec["containers"]:
                    self._launch(run, container, run.sources)  # type: ignore[attr-defined]
                run.phase = "Running"
                changed = True
        except podspec.PodConfigError as exc:
            run.config_error = str(exc)
            self.event(run.pod, "Warning", "Failed", f"Error: {exc}")
            self._write_status(run)
            return
        if not run.init_done:
            return
        for container in spec["containers"]:
            state = run.containers[container["name"]]
            if state.terminated is None and self._reap(state, run, container):
                changed = True
                code = state.terminated["exitCode"]  # type: ignore[index]
                if policy == "Always" or (policy == "OnFailure" and code != 0):
                    state.last_state = {"terminated": state.terminated}
                    state.restarts += 1
                    self._launch(run, container, run.sources)  # type: ignore[attr-defined]
        states = [run.containers[c["name"]].terminated for c in spec["containers"]]
        if all(s is not None for s in states):
            run.phase = "Succeeded" if all(s["exitCode"] == 0 for s in states) else "Failed"  # type: ignore[index]
            self._finish(run)
            return
        if changed:
            self._write_status(run)

    def _reap(self, state: ContainerRun, run: PodRun, container: dict[str, Any]) -> bool:
        """Whether the container's process has exited (its terminated state is then recorded)."""
        if state.popen is None or state.popen.poll() is None:
            return False
        code = state.popen.returncode
        if state.log_path is not None:
            self.log_server.finish(state.log_path)
        exit_code = 128 - code if code < 0 else code
        message = state.message_path.read_text(errors="replace") if state.message_path else ""
        if not message.strip() and exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = self._log_tail(state.log_path)
        state.terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": state.started_at,
            "finishedAt": now(),
            "containerID": f"trainjob://{run.key}/{state.name}/{state.restarts}",
        }
        if code < 0:
            state.terminated["signal"] = -code
        if message.strip():
            state.terminated["message"] = message[-4096:]
        return True

    @staticmethod
    def _log_tail(path: Path | None) -> str:
        if path is None or not path.exists():
            return ""
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            raw = f.read().decode(errors="replace").splitlines()
        lines = [line.split(" ", 3)[3] if line.count(" ") >= 3 else line for line in raw]
        text = "\n".join(lines[-FALLBACK_LOG_LINES:])
        return text[-FALLBACK_LOG_BYTES:]

    def _finish(self, run: PodRun) -> None:
        # cleaned up first: whoever sees the pod's terminal phase finds its mount points and network gone already
        self._cleanup(run)
        self._write_status(run)

    def _stop_pod(self, run: PodRun, grace: int, delete: bool) -> None:
        """Deletion: SIGTERM every container, SIGKILL after ``grace`` seconds, clean up, remove the pod object."""
        running = [s for s in run.containers.values() if s.popen is not None and s.popen.poll() is None]
        for state in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(state.popen.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + grace
        for state in running:
            try:
                state.popen.wait(max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(state.popen.pid, signal.SIGKILL)  # type: ignore[union-attr]
                state.popen.wait()  # type: ignore[union-attr]
        if delete:
            # As the kubelet does: a deleted pod reaches a terminal phase (Failed, unless every container
            # succeeded) before its object goes, so a Job that replaces only failed pods (podReplacementPolicy
            # Failed, the default with a podFailurePolicy) sees it end and starts another.
            for container in (run.pod.get("spec") or {}).get("containers") or []:
                state = run.containers.get(container["name"])
                if state is not None and state.terminated is None:
                    self._reap(state, run, container)
            ends = [s.terminated for s in run.containers.values()]
            succeeded = bool(ends) and all(end is not None and end["exitCode"] == 0 for end in ends)
            run.phase = "Succeeded" if succeeded else "Failed"
            try:
                self._write_status(run)
            except Exception as exc:  # the object may be going already; deletion goes on regardless
                log.debug("pod %s: no terminal status before deletion: %s", run.pod["metadata"]["name"], exc)
        self._cleanup(run)
        if delete:
            self._finalize_deletion(run.pod)
        with self.lock:
            self.pods.pop(run.key, None)

    def _finalize_deletion(self, pod: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body={"preconditions": {"uid": meta["uid"]}, "gracePeriodSeconds": 0},
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("cannot delete pod %s/%s: %s", meta["namespace"], meta["name"], exc.reason)

    def _cleanup(self, run: PodRun) -> None:
        if run.cleaned:
            return
        for state in run.containers.values():  # processes a container left behind go with it
            if state.popen is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(state.popen.pid, signal.SIGKILL)
        run.cleaned = True
        self._remove_pod_network(run)
        self._release_host_dirs(run.created_dirs)
        run.created_dirs.clear()
        self.refresh_hosts()

    def _make_host_dir(self, run: PodRun, path: Path) -> None:
        """Create a mount point (or working directory) outside /run on the host, counting the pods that use it: it
        goes when the last of them does, not when the first that created it does. A directory the host already had
        is left as it is."""
        with self.lock:
            if path.exists() and path not in self.made_dirs:
                return
            chain = [p for p in [path, *path.parents] if not p.exists() or p in self.made_dirs]
            path.mkdir(parents=True, exist_ok=True)
            for directory in chain:
                self.made_dirs[directory] = self.made_dirs.get(directory, 0) + 1
            run.created_dirs.extend(chain)

    def _release_host_dirs(self, dirs: list[Path]) -> None:
        with self.lock:
            for directory in dirs:
                self.made_dirs[directory] = self.made_dirs.get(directory, 1) - 1
            gone = [d for d in set(dirs) if self.made_dirs.get(d, 0) <= 0]
            for directory in sorted(gone, key=lambda p: len(p.parts), reverse=True):
                self.made_dirs.pop(directory, None)
                with contextlib.suppress(OSError):
                    directory.rmdir()

    def _write_status(self, run: PodRun) -> None:
        from kubernetes.client.exceptions import ApiException

        pod = run.pod
        spec = pod["spec"]
        stamp = now()

        def container_status(container: dict[str, Any]) -> dict[str, Any]:
            state = run.containers.get(container["name"])
            status: dict[str, Any] = {
                "name": container["name"], "image": container.get("image", ""), "imageID": "",
                "restartCount": state.restarts if state else 0, "ready": False, "started": False,
            }
            if state is None or state.popen is None:
                reason = "CreateContainerConfigError" if run.config_error else "ContainerCreating"
                status["state"] = {"waiting": {"reason": reason, **({"message": run.config_error} if run.config_error else {})}}
            elif state.terminated is not None:
                status["state"] = {"terminated": state.terminated}
                status["containerID"] = state.terminated["containerID"]
            else:
                status["state"] = {"running": {"startedAt": state.started_at}}
                status["ready"] = status["started"] = True
                status["containerID"] = f"trainjob://{run.key}/{state.name}/{state.restarts}"
            if state is not None and state.last_state:
                status["lastState"] = state.last_state
            return status

        containers = [container_status(c) for c in spec["containers"]]
        ready = run.phase == "Running" and all(c["ready"] for c in containers)
        for _ in range(5):
            try:
                current = json.loads(self.core.read_namespaced_pod(
                    pod["metadata"]["name"], pod["metadata"]["namespace"], _preload_content=False).data)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            if current["metadata"]["uid"] != run.key:
                return
            status = current.get("status") or {}
            conditions = {c["type"]: c for c in status.get("conditions") or []}

            finished = run.phase in ("Succeeded", "Failed")
            why = None if ready else ("PodCompleted" if finished else "ContainersNotReady")
            set_condition(conditions, "PodReadyToStartContainers", not run.cleaned or finished, stamp)
            set_condition(conditions, "Initialized", run.init_done or not spec.get("initContainers"), stamp)
            set_condition(conditions, "ContainersReady", ready, stamp, why)
            set_condition(conditions, "Ready", ready, stamp, why)
            status.update({
                "phase": run.phase, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                "podIP": run.address, "podIPs": [{"ip": run.address}],
                "startTime": status.get("startTime") or stamp, "conditions": list(conditions.values()),
                "containerStatuses": containers,
            })
            if spec.get("initContainers"):
                status["initContainerStatuses"] = [container_status(c) for c in spec["initContainers"]]
            current["status"] = status
            try:
                self.core.replace_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], current)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
        log.warning("pod %s: status conflicts persisted", pod["metadata"]["name"])

    # -- main loop ------------------------------------------------------------------------------------------------

    def run(self) -> None:
        self.setup_network()
        self.register()
        threading.Thread(target=self.heartbeat, name="heartbeat", daemon=True).start()
        try:
            while not self.stop_event.is_set():
                try:
                    self.sync()
                except Exception as exc:
                    log.warning("sync failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
                self.stop_event.wait(POLL_SECONDS)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        with self.lock:
            runs = list(self.pods.values())
        for run in runs:
            for state in run.containers.values():
                if state.popen is not None and state.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(state.popen.pid, signal.SIGKILL)
                    state.popen.wait()
            self._cleanup(run)
        self.teardown_network()
        self.log_server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--serving-cert", required=True)
    parser.add_argument("--serving-key", required=True)
    parser.add_argument("--client-ca", required=True)
    parser.add_argument("--hosts-dir", type=Path, help="shared by the cluster's agents: each pod's name and address")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.root.mkdir(parents=True, exist_ok=True)
    server = LogServer(args.serving_cert, args.serving_key, args.client_ca)
    agent = NodeAgent(args.kubeconfig, args.node_name, args.root,
                      os.environ.get("TRAINJOB_NODE_PATH", "/usr/local/bin:/usr/bin:/bin"), server, args.hosts_dir)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop_event.set())
    agent.run()


if __name__ == "__main__":
    main()
