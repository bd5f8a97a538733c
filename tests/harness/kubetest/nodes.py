"""The test cluster's nodes: real kubelets, each with a containerd of its own, kube-proxy and CoreDNS.

Every node is what kubeadm would make of a machine, except that the machines are one host:

- **containerd** (Debian's 1.6, runc, the CNI bridge plugin) with its own root, state and socket. Its CRI config
  turns on ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE), writes the node's bridge config from the
  pod CIDR the kubelet sends (``conf_template``), and maps :data:`kubetest.images.REGISTRY_HOST` to the loopback
  registry (``hosts.toml``). Its image store lasts across test sessions (under the image cache, one per node
  name, locked while in use), so the training image is pulled once per machine; a container or sandbox left there
  by a killed session is removed before the kubelet starts.
- **kubelet** (built from ``k8s.io/kubernetes`` at the control plane's version) joined with a node certificate
  (``CN=system:node:<name>``, ``O=system:nodes``), its serving certificate from the cluster CA, webhook
  authentication and authorization, a ``cgroupRoot`` of its own (two kubelets must not share one), its own root
  dir, ports and pod CIDR (``kube-controller-manager --allocate-node-cidrs``).
- The nodes share the host's network namespace (so one **kube-proxy**, iptables mode, serves both, as the DESIGN
  notes allow), each pod on its node's bridge; the host routes between the bridges. **CoreDNS** runs as a Deployment
  behind the ``kube-dns`` Service at :data:`CLUSTER_DNS`.

Clean-up is a node's: pods' sandboxes removed through the CRI, shims killed, mounts under the node's folders
unmounted, cgroups, bridges and kube-proxy's rules removed. :func:`clean_leftovers` does the same for what a killed
session left (names carry the pid of the session that made them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kubetest.images import REGISTRY_HOST, Registry, cache_dir

if TYPE_CHECKING:
    from kubetest.controlplane import ControlPlane

CLUSTER_CIDR = "10.244.0.0/16"
#: Simulated (KWOK) nodes' pod CIDRs are /24s out of this range (``kwok.node_body``): room for 32,768 nodes. A
#: control plane with no real node gives kube-controller-manager this range as its cluster CIDR, so that its node
#: IPAM controller records their CIDRs as taken; outside its range it fails each simulated node's sync and retries
#: it without end (some 60,000 errors in 25 minutes on 1,000 nodes, its CPU beside the controllers measured).
SIMULATED_POD_RANGE = "10.128.0.0/9"
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
#: The cgroup v1 hierarchies (and the cgroup2 mirror) in which each node's ``cgroupRoot`` is made.
CGROUP_FS = Path("/sys/fs/cgroup")
#: Prefix of every name a session gives a host-wide object (bridges, cgroup roots): ``tj<pid>``.
PREFIX = "tj"


def host_ip() -> str:
    """The host's address on its default route: the nodes' InternalIP, where pods reach host processes."""
    route = json.loads(subprocess.run(["ip", "-j", "route", "get", "1.1.1.1"], capture_output=True, text=True,
                                      check=True).stdout)
    return str(route[0]["prefsrc"])


def session_tag(pid: int | None = None) -> str:
    return f"{PREFIX}{pid or os.getpid()}"


def _run(argv: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


# -- cgroups --------------------------------------------------------------------------------------------------------


def _hierarchies() -> list[Path]:
    return [p for p in CGROUP_FS.iterdir() if p.is_dir() and (p / "cgroup.procs").exists()]


def make_cgroup_root(name: str) -> None:
    """``/<name>`` in every hierarchy; cpuset's with its parent's CPUs and memory nodes (empty ones refuse tasks)."""
    for hierarchy in _hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())


def remove_cgroup_root(name: str) -> None:
    """``/<name>`` and everything under it, leaves first; tasks still inside are killed."""
    for hierarchy in _hierarchies():
        root = hierarchy / name
        if not root.exists():
            continue
        for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [root]:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    with contextlib.suppress(OSError):
                        for pid in (path / "cgroup.procs").read_text().split():
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(int(pid), signal.SIGKILL)
                    time.sleep(0.1)


# -- mounts and processes -------------------------------------------------------------------------------------------


def unmount_under(*roots: Path) -> None:
    """Unmount every mount point under ``roots``, deepest first (the kubelet's volumes, the sandboxes' network
    namespaces and shm, containers' root file systems, the kubelet's bind mount of its root dir)."""
    prefixes = [str(r.resolve()) for r in roots if r.exists()]
    if not prefixes:
        return
    for _ in range(5):
        points = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].encode().decode("unicode_escape")
            if any(point == p or point.startswith(p + "/") for p in prefixes):
                points.append(point)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)


def kill_matching(pattern: str) -> None:
    """SIGKILL every process whose command line contains ``pattern`` (a node's shims, by its socket's path)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if pattern in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)


# -- one node -------------------------------------------------------------------------------------------------------


@dataclass
class Node:
    """One kubelet and its containerd. ``dir``: this session's folder for it; ``store``: containerd's image store."""

    name: str
    index: int
    dir: Path
    tag: str
    store: Path
    store_lock: Any = None
    kubelet_port: int = 0
    healthz_port: int = 0

    @property
    def socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def bridge(self) -> str:
        return f"{self.tag}{'abcdefgh'[self.index]}"[-15:]  # an interface name has at most 15 characters

    @property
    def cgroup_root(self) -> str:
        return f"{self.tag}-{self.name}"

    def crictl(self, *args: str, crictl: str, check: bool = True, timeout: float = 600) -> str:
        return _run([crictl, f"--runtime-endpoint=unix://{self.socket}", f"--image-endpoint=unix://{self.socket}",
                     "--timeout=60s", *args], check=check, timeout=timeout).stdout


def _containerd_config(node: Node, pause: str, registry: Registry) -> Path:
    state = node.dir / "containerd"
    (node.dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    template = node.dir / "cni" / "template.json"
    # containerd fills the pod CIDR in from the kubelet (Go template), then writes the bridge config once.
    template.write_text(json.dumps({
        "cniVersion": "0.4.0",
        "name": f"pods-{node.name}",
        "plugins": [
            {"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": "RANGES", "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(node.dir / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }).replace('"RANGES"', '[{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}]'))
    registry_host(node, REGISTRY_HOST, registry.address)
    config = state / "config.toml"
    state.mkdir(parents=True, exist_ok=True)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config.write_text(f"""version = 2
root = "{node.store}"
state = "{state / 'state'}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.socket}.ttrpc"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{node.dir / 'cni' / 'net.d'}"
    conf_template = "{template}"
    max_conf_num = 1
  [{cri}.registry]
    config_path = "{node.dir / 'certs.d'}"
""")
    return config


def _kubelet_config(node: Node, cp: ControlPlane, address: str, serving: tuple[Path, Path],
                    extra: dict[str, Any]) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "imageServiceEndpoint": f"unix://{node.socket}",
        "cgroupDriver": "cgroupfs",  # containerd 1.6 cannot tell the kubelet its driver
        "cgroupRoot": f"/{node.cgroup_root}",
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "failCgroupV1": False,  # this host's cgroups are v1 with a cgroup2 mirror
        "address": address,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(cp.ca.cert_path)}},
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": str(node.dir / "pod-logs"),
        "volumePluginDir": str(node.dir / "volume-plugins"),
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "evictionHard": {"memory.available": "1Mi"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        # Downward-API volumes (the stacks request, labels and annotations) are refreshed at every sync.
        "syncFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
        "maxPods": 60,
        **extra,
    }
    path = node.dir / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Nodes:
    """The cluster's real nodes and what they share (kube-proxy, CoreDNS, the registry, the images)."""

    cp: ControlPlane
    registry: Registry
    images: dict[str, str]
    address: str
    tag: str = field(default_factory=session_tag)
    nodes: dict[str, Node] = field(default_factory=dict)

    @property
    def bins(self) -> dict[str, str]:
        return dict(self.cp.components["binaries"])

    # -- a node's life ----------------------------------------------------------------------------------------

    def start_node(self, name: str, kubelet_config: dict[str, Any] | None = None, wait: bool = True) -> Node:
        """Start node ``name`` (containerd, then the kubelet, which registers the Node) and pre-pull the training
        image; with ``wait``, until the Node is Ready."""
        from kubetest.controlplane import free_port  # noqa: PLC0415

        node = self.nodes.get(name)
        if node is None:
            # the session's tag in every path, so a killed session's processes are found by it (clean_leftovers)
            node = Node(name, len(self.nodes), self.cp.root / "nodes" / f"{self.tag}-{name}", self.tag, Path(),
                        kubelet_port=free_port(), healthz_port=free_port())
            node.dir.mkdir(parents=True, exist_ok=True)
            node.store, node.store_lock = self._image_store(name, node.dir)
            self.nodes[name] = node
        make_cgroup_root(node.cgroup_root)
        self._start_containerd(node)
        # What a killed session left in the image store: its sandboxes and containers.
        node.crictl("rmp", "--all", "--force", crictl=self.bins["crictl"], check=False)
        self._start_kubelet(node, kubelet_config or {})
        if wait:
            self.cp.wait_node_ready(timeout=120.0, name=name)
        return node

    def _image_store(self, name: str, fallback: Path) -> tuple[Path, Any]:
        """containerd's root for node ``name``: the one kept under the image cache unless another session holds it
        (then a fresh one in ``fallback``, which pulls every image again)."""
        store = cache_dir() / "nodes" / name
        store.mkdir(parents=True, exist_ok=True)
        lock = (store.parent / f"{name}.lock").open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return fallback / "containerd-root", None
        return store, lock

    def _start_containerd(self, node: Node) -> None:
        config = _containerd_config(node, self.images["pause"], self.registry)
        with contextlib.suppress(FileNotFoundError):
            node.socket.unlink()
        component = f"containerd-{node.name}"
        self.cp._spawn(component, ["containerd", f"--config={config}"])
        deadline = time.monotonic() + 60
        while not node.socket.exists():
            self.cp.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"containerd of {node.name} made no socket:\n{self.cp.processes[component].tail()}")
            time.sleep(0.1)
        # The socket comes before the CRI plugin has loaded its state (slower after a kill: the sandboxes and
        # containers a lost node left are recovered first): until CRI answers, "server is not initialized yet".
        while True:
            try:
                node.crictl("version", crictl=self.bins["crictl"])
                return
            except RuntimeError:
                self.cp.check_alive()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _start_kubelet(self, node: Node, extra: dict[str, Any]) -> None:
        ca = self.cp.ca
        cert, key = ca.issue(f"kubelet-{node.name}", common_name=f"system:node:{node.name}",
                             organization="system:nodes", client=True)
        from kubetest.controlplane import kubeconfig  # noqa: PLC0415

        kubeconfig_path = kubeconfig(node.dir / "kubelet.kubeconfig", self.cp.url, ca.cert_path,
                                     **{"client-certificate": str(cert), "client-key": str(key)})
        serving = ca.issue(f"kubelet-{node.name}-serving", ips=[self.address, "127.0.0.1"], dns=[node.name])
        config = _kubelet_config(node, self.cp, self.address, serving, extra)
        component = f"kubelet-{node.name}"
        self.cp._spawn(component, [
            self.bins["kubelet"], f"--config={config}", f"--kubeconfig={kubeconfig_path}",
            f"--root-dir={node.dir / 'kubelet'}", f"--cert-dir={node.dir / 'kubelet-pki'}",
            f"--hostname-override={node.name}", f"--node-ip={self.address}", "--v=1",
        ])

    def pull(self, node: Node, image: str) -> None:
        """Pull ``image`` into the node's store, and drop older builds of it (another tag of its repository) and
        what an earlier session's tests pulled from registries of their own (the store outlives the session)."""
        crictl = self.bins["crictl"]
        node.crictl("pull", image, crictl=crictl, timeout=1800)
        repository = image.rsplit(":", 1)[0]
        for listed in json.loads(node.crictl("images", "-o", "json", crictl=crictl)).get("images") or []:
            tags = listed.get("repoTags") or []
            older = all(t.startswith(repository + ":") and t != image for t in tags)
            foreign = not any(t.startswith(REGISTRY_HOST + "/") for t in tags)
            if tags and (older or foreign):
                node.crictl("rmi", listed["id"], crictl=crictl, check=False)

    def stop_node(self, name: str, graceful: bool = True) -> None:
        """Stop node ``name``: the kubelet, then (``graceful``) every pod sandbox through the CRI, then containerd,
        whatever shims and containers remain, mounts, the cgroup root and the bridge."""
        node = self.nodes[name]
        kubelet = self.cp.processes.pop(f"kubelet-{name}", None)
        if kubelet is not None:
            kubelet.stop(grace=10.0 if graceful else 0.0)
        containerd = self.cp.processes.get(f"containerd-{name}")
        if graceful and containerd is not None and containerd.alive():
            node.crictl("rmp", "--all", "--force", crictl=self.bins["crictl"], check=False, timeout=120)
        if containerd is not None:
            containerd.stop(grace=10.0 if graceful else 0.0)
            del self.cp.processes[f"containerd-{name}"]
        kill_matching(str(node.socket))  # the shims: `containerd-shim-runc-v2 ... -address <socket>`
        remove_cgroup_root(node.cgroup_root)  # kills whatever container processes are left in it
        unmount_under(node.dir, node.store)
        _run(["ip", "link", "del", node.bridge], check=False)

    def lose_node(self, name: str) -> None:
        """Node ``name``'s machine is gone: kubelet, containerd and every container SIGKILLed at once (no pod is
        told); the Node and its pods stay in the API server until the node-lifecycle controller acts."""
        self.stop_node(name, graceful=False)

    # -- what the nodes share ---------------------------------------------------------------------------------

    def start_coredns(self) -> None:
        self.cp.apply(coredns_objects(self.images["coredns"]))

    def wait_dns(self, timeout: float = 120.0) -> None:
        """Until every CoreDNS replica is ready and its Service has endpoints."""
        import kubernetes.client

        deadline = time.monotonic() + timeout
        with self.cp.client() as api:
            apps = kubernetes.client.AppsV1Api(api)
            while time.monotonic() < deadline:
                self.cp.check_alive()
                deployment = apps.read_namespaced_deployment("coredns", "kube-system")
                if (deployment.status.ready_replicas or 0) >= deployment.spec.replicas:
                    return
                time.sleep(0.5)
        raise TimeoutError(f"CoreDNS not ready after {timeout:g} s:\n{self.cp.logs()}")

    def stop(self) -> None:
        for name in reversed(list(self.nodes)):
            with contextlib.suppress(Exception):
                self.stop_node(name)
        for node in self.nodes.values():
            if node.store_lock is not None:
                node.store_lock.close()
        _remove_device_plugin_dir()
        remove_stale_runtime_files()

    def check_clean(self) -> list[str]:
        """What the nodes left behind: shims, bridges, cgroup roots, mounts, kube-proxy's chains (empty: none)."""
        left = []
        for node in self.nodes.values():
            if (Path("/sys/class/net") / node.bridge).exists():
                left.append(f"bridge {node.bridge}")
            if any((h / node.cgroup_root).exists() for h in _hierarchies()):
                left.append(f"cgroup /{node.cgroup_root}")
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.cp.root))]
        left += [f"mount {m}" for m in mounts]
        shims = _run(["pgrep", "-f", f"containerd-shim-runc-v2 .*/{self.tag}-"], check=False).stdout.split()
        left += [f"shim pid {pid}" for pid in shims]
        if "KUBE-SERVICES" in _run(["iptables-save", "-t", "nat"], check=False).stdout:
            left.append("kube-proxy's KUBE-SERVICES chain")
        return left


def registry_host(node: Node, host: str, address: str) -> None:
    """Image references at ``host`` are pulled by ``node``'s containerd from the registry at ``address`` (plain
    HTTP on loopback); containerd reads the ``hosts.toml`` at each pull, so a host added later works at once."""
    hosts = node.dir / "certs.d" / host / "hosts.toml"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(f'server = "http://{address}"\n[host."http://{address}"]\n'
                     '  capabilities = ["pull", "resolve"]\n')


def kube_proxy_argv(cp: ControlPlane, hostname: str) -> list[str]:
    """kube-proxy (iptables mode) for this host, as ``system:kube-proxy`` (bound to ``system:node-proxier``)."""
    from kubetest.controlplane import free_port, kubeconfig  # noqa: PLC0415

    cert, key = cp.ca.issue("kube-proxy", common_name="system:kube-proxy", client=True)
    path = kubeconfig(cp.root / "kube-proxy.kubeconfig", cp.url, cp.ca.cert_path,
                      **{"client-certificate": str(cert), "client-key": str(key)})
    config = cp.root / "kube-proxy.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(path)},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": hostname,
        "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        # 0: kube-proxy leaves the host's conntrack sysctls as they are
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
    }))
    return [cp.components["binaries"]["kube-proxy"], f"--config={config}", "--v=1"]


def _remove_device_plugin_dir() -> None:
    """The kubelet's one fixed host path (``/var/lib/kubelet/device-plugins``): removed when no kubelet runs."""
    if _run(["pgrep", "-x", "kubelet"], check=False).returncode == 0:
        return
    with contextlib.suppress(OSError):
        for path in Path("/var/lib/kubelet/device-plugins").iterdir():
            path.unlink()
        Path("/var/lib/kubelet/device-plugins").rmdir()
        Path("/var/lib/kubelet").rmdir()


def clean_kube_proxy_rules(binary: str | None) -> None:
    """kube-proxy's ``--cleanup``, then what it leaves: the KUBE-FIREWALL chains and its empty nft tables."""
    if binary:
        _run([binary, "--cleanup", "--v=0"], check=False)
    for table in ("filter", "nat", "mangle"):
        rules = _run(["iptables-save", "-t", table], check=False).stdout
        for chain in sorted(set(re.findall(r"^:(KUBE-[A-Z0-9-]+)", rules, re.M))):
            for line in re.findall(rf"^-A \S+ .*-j {chain}\b.*$", rules, re.M):
                _run(["iptables", "-t", table, *line.replace("-A", "-D", 1).split()], check=False)
        for chain in sorted(set(re.findall(r"^:(KUBE-[A-Z0-9-]+)", rules, re.M))):
            _run(["iptables", "-t", table, "-F", chain], check=False)
            _run(["iptables", "-t", table, "-X", chain], check=False)
    if shutil.which("nft"):
        for family in ("ip", "ip6"):
            _run(["nft", "delete", "table", family, "kube-proxy"], check=False)


def clean_leftovers() -> None:
    """What a killed test session left on this host: its nodes' shims and containers (by their sockets under a
    cluster folder), cgroup roots and bridges named ``tj<pid>`` of a pid that no longer runs, and kube-proxy's rules
    when no kube-proxy runs."""
    dead: set[str] = set()
    for hierarchy in _hierarchies():
        for path in hierarchy.iterdir():
            match = re.fullmatch(rf"({PREFIX}(\d+))-.+", path.name)
            if path.is_dir() and match and not Path(f"/proc/{match.group(2)}").exists():
                dead.add(match.group(1))
                remove_cgroup_root(path.name)
    for link in Path("/sys/class/net").iterdir():
        match = re.fullmatch(rf"{PREFIX}(\d+)[a-h]", link.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            _run(["ip", "link", "del", link.name], check=False)
    for tag in dead:
        kill_matching(f"/{tag}-")  # kubelets, containerds and shims: their configs and sockets are in the node folder
        for line in Path("/proc/self/mounts").read_text().splitlines():
            if f"/{tag}-" in line.split()[1]:
                subprocess.run(["umount", "-l", line.split()[1]], capture_output=True)
    for store in (cache_dir() / "nodes").glob("*.lock"):
        with store.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use by a live session
            unmount_under(store.with_suffix(""))
    if _run(["pgrep", "-x", "kube-proxy"], check=False).returncode != 0 and \
            "KUBE-SERVICES" in _run(["iptables-save", "-t", "nat"], check=False).stdout:
        clean_kube_proxy_rules(None)
    remove_stale_runtime_files()


#: Where containerd's runc shims put their sockets and runc its containers' state, whatever containerd's own state
#: folder (containerd 1.6: ``/run/containerd/s/<sha256>``; runc's root for the CRI's namespace ``k8s.io``).
SHIM_SOCKETS = Path("/run/containerd/s")
RUNC_STATE = Path("/run/containerd/runc/k8s.io")


def remove_stale_runtime_files() -> list[Path]:
    """Shim sockets no process listens on and runc state of containers whose init process is gone: what shims and
    containers killed with their node leave in ``/run/containerd`` (a live cluster's are left alone). Returns what
    was removed."""
    removed: list[Path] = []
    try:
        bound = {line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:]
                 if len(line.split()) >= 8}
    except OSError:
        return removed
    for sock in SHIM_SOCKETS.iterdir() if SHIM_SOCKETS.is_dir() else []:
        if sock.is_socket() and str(sock) not in bound:
            with contextlib.suppress(OSError):
                sock.unlink()
                removed.append(sock)
    for state in RUNC_STATE.iterdir() if RUNC_STATE.is_dir() else []:
        try:
            data = json.loads((state / "state.json").read_text())
            pid, started = int(data["init_process_pid"]), int(data["init_process_start"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being created, or not runc's
        if _start_ticks(pid) != started:  # gone, or the pid is another process's now
            shutil.rmtree(state, ignore_errors=True)
            removed.append(state)
    return removed


def _start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), ``None`` when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def coredns_objects(image: str) -> list[dict[str, Any]]:
    """CoreDNS as kubeadm installs it: its ServiceAccount and role, the Corefile, two replicas (one per node), and the
    ``kube-dns`` Service at :data:`CLUSTER_DNS`."""
    labels = {"k8s-app": "kube-dns"}
    corefile = f""".:53 {{
    errors
    health {{
       lameduck 2s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
    loop
    reload
    loadbalance
}}
"""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
         "spec": {
             "replicas": 2,
             "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
             "selector": {"matchLabels": labels},
             "template": {"metadata": {"labels": labels}, "spec": {
                 "serviceAccountName": "coredns",
                 "dnsPolicy": "Default",
                 "priorityClassName": "system-cluster-critical",
                 "tolerations": [{"operator": "Exists"}],
                 "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}]}},
                 "containers": [{
                     "name": "coredns", "image": image, "imagePullPolicy": "IfNotPresent",
                     "args": ["-conf", "/etc/coredns/Corefile"],
                     # no CPU request: each 2-CPU node keeps room for two 1-CPU training pods
                     "resources": {"requests": {"memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                     "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                     "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"},
                               {"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"}],
                     "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
                 }],
                 "volumes": [{"name": "config", "configMap": {"name": "coredns",
                                                               "items": [{"key": "Corefile", "path": "Corefile"}]}}],
             }},
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
         "spec": {"selector": labels, "clusterIP": CLUSTER_DNS,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}},
    ]
