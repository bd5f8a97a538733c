"""A real Kubernetes cluster on this machine, from upstream binaries built by ``scripts/cluster/build.sh``.

The control plane: etcd, kube-apiserver (TLS, ``--authorization-mode=Node,RBAC``, service-account tokens,
NodeRestriction), kube-controller-manager (Job controller, garbage collector, service accounts, node lifecycle, node
IPAM; every controller with its own service-account credentials), kube-scheduler and the JobSet controller manager
(as its ServiceAccount with JobSet's own RBAC). The nodes (:mod:`kubetest.nodes`): two real kubelets, each with a
containerd of its own, kube-proxy and CoreDNS; pods run from images built here and pulled from a registry on
loopback (:mod:`kubetest.images`)::

    with ControlPlane.start(tmp / "cluster") as cp:
        api = cp.admin_client()                       # kubernetes.client.ApiClient as system:masters
        kubeconfig = cp.service_account_kubeconfig("trainjob-system", "trainjob-operator")

Every process is started in its own session and killed on ``stop()``; logs are under ``root/logs``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubetest.images import Registry, build_images, cache_dir
from kubetest.nodes import (
    CLUSTER_CIDR,
    SIMULATED_POD_RANGE,
    Nodes,
    clean_kube_proxy_rules,
    clean_leftovers,
    host_ip,
    kube_proxy_argv,
)
from kubetest.pki import CertificateAuthority, service_account_key
from trainjob.ports import free_port

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "scripts" / "cluster" / "build.sh"
#: The cluster's nodes: the first one is where single-node tests place their pods, the second is the one a test may
#: lose and bring back.
NODE_NAME = "trainjob-node"
SECOND_NODE = "trainjob-node-b"
JOBSET_NAMESPACE = "jobset-system"
JOBSET_ACCOUNT = "jobset-controller-manager"
JOBSET_WEBHOOK_SERVICE = "jobset-webhook-service"
KUBEFLOW_NAMESPACE = "kubeflow-system"
KUBEFLOW_ACCOUNT = "kubeflow-trainer-controller-manager"
SERVICE_CIDR = "10.96.0.0/24"
#: Service accounts whose every request the API server writes to the audit log (``audit_requests``): trainjob's
#: operator and Kubeflow Trainer's controller manager (``kubetest.kubeflow``).
AUDITED_ACCOUNTS = [
    "system:serviceaccount:trainjob-system:trainjob-operator",
    f"system:serviceaccount:{KUBEFLOW_NAMESPACE}:{KUBEFLOW_ACCOUNT}",
]
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": AUDITED_ACCOUNTS}, {"level": "None"}],
}


def scheduler_config(kubeconfig_path: Path, client_qps: int | None = None) -> dict[str, Any]:
    """kube-scheduler with two profiles: the default one, and one answering to ``schedulerName: volcano``.

    Volcano's scheduler cannot be built here (``volcano.sh/volcano`` is not on the Go module proxy), so pods of
    Volcano runtimes (the seeds' runtimes are Volcano ones) are placed by the upstream scheduler, without gang
    semantics; their PodGroups are still created against Volcano's real CRD. ``client_qps``: its API client's
    rate limit (burst twice that), instead of the default 50 queries per second."""
    connection: dict[str, Any] = {"kubeconfig": str(kubeconfig_path)}
    if client_qps is not None:
        connection.update(qps=client_qps, burst=2 * client_qps)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler"}, {"schedulerName": "volcano"}],
    }


#: ``current``: the cluster runs the current JobSet and Kubeflow Trainer releases (``build.sh --current``) instead of
#: the pinned ones the conformance tests compare with; what ``benchmarks/reconcile.py --kubeflow current`` sets.
RELEASES_ENV = "TRAINJOB_CLUSTER_RELEASES"


def build_components() -> dict[str, Any]:
    """Run ``scripts/cluster/build.sh`` (seconds when its cache is warm) and return its manifest."""
    releases = os.environ.get(RELEASES_ENV, "")
    if releases not in ("", "pinned", "current"):
        raise ValueError(f"${RELEASES_ENV}={releases!r}; expected 'pinned' (the default) or 'current'")
    done = subprocess.run(["bash", str(BUILD_SCRIPT), *(["--current"] if releases == "current" else [])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/cluster/build.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())


def kubeconfig(path: Path, server: str, ca: Path, **user: str) -> Path:
    """A kubeconfig for ``server`` with one user (``token=`` or ``client-certificate=``/``client-key=``)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user", "namespace": "default"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    #: What it was started with, so it can be started again the same way (:meth:`ControlPlane.restart`).
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


@dataclass
class ControlPlane:
    root: Path
    components: dict[str, Any]
    ca: CertificateAuthority
    url: str = ""
    processes: dict[str, Process] = field(default_factory=dict)
    admin_kubeconfig: Path = Path()
    #: The rate limit of kube-controller-manager's and kube-scheduler's API clients (burst twice that); None keeps
    #: their defaults (20 and 50 queries per second), too few for thousands of pods (``benchmarks/reconcile.py``).
    client_qps: int | None = None
    #: (component, Unix time) of every ``start_again``: a restarted kube-apiserver refuses requests for a moment,
    #: until its RBAC caches have loaded.
    restarts: list[tuple[str, float]] = field(default_factory=list)
    #: The real nodes (None until they start, or with ``nodes=0``), and the images their pods run.
    nodes: Any = None
    images: dict[str, str] = field(default_factory=dict)
    registry: Any = None
    #: The host's address: the nodes' InternalIP and where pods reach processes on the host.
    host_address: str = ""
    #: kube-controller-manager's ``--cluster-cidr``: the real nodes' pod CIDRs come out of it; without real nodes
    #: (``nodes=0``), the simulated nodes' range (:data:`kubetest.nodes.SIMULATED_POD_RANGE`).
    cluster_cidr: str = CLUSTER_CIDR

    # -- life cycle -------------------------------------------------------------------------------------------------

    @classmethod
    def start(cls, root: Path, client_qps: int | None = None, nodes: int = 2) -> ControlPlane:
        """The control plane, then ``nodes`` real nodes (at most 2; 0 for tests and benchmarks of the control plane
        alone, such as KWOK's)."""
        components = build_components()
        root.mkdir(parents=True, exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
        cp = cls(root, components, CertificateAuthority.create(root / "pki"), client_qps=client_qps,
                 cluster_cidr=CLUSTER_CIDR if nodes else SIMULATED_POD_RANGE)
        cp.host_address = host_ip()
        try:
            cp._start_all()
            if nodes:
                cp._start_nodes([NODE_NAME, SECOND_NODE][:nodes])
        except BaseException:
            cp.stop()
            raise
        return cp

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every component, newest first; the nodes first, with their pods, then the control plane."""
        if self.nodes is not None:
            self.nodes.stop()
        for process in reversed(list(self.processes.values())):
            process.stop(grace=5.0)
        if "kube-proxy" in self.processes:
            clean_kube_proxy_rules(self.components["binaries"].get("kube-proxy"))
        self.processes.clear()
        if self.registry is not None:
            self.registry.stop()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        log = self.root / "logs" / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=self.root,
            )
        process = Process(name, popen, log, list(argv), env)
        self.processes[name] = process
        return process

    def kill(self, name: str) -> None:
        """SIGKILL component ``name`` (its whole process group), as a crash would; it stays down."""
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait()

    def start_again(self, name: str) -> Process:
        """Start component ``name`` again with the arguments it first had: the same ports, data and certificates."""
        old = self.processes[name]
        assert not old.alive(), f"{name} still runs"
        self.restarts.append((name, time.time()))
        return self._spawn(name, old.argv, old.env)

    def _start_all(self) -> None:
        bins = self.components["binaries"]
        pki = self.ca.directory
        sa_key, sa_pub = service_account_key(pki)
        serving_cert, serving_key = self.ca.issue(
            "apiserver",
            ips=["127.0.0.1", "10.96.0.1", self.host_address],
            dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        )
        kubelet_client = self.ca.issue("apiserver-kubelet-client", organization="system:masters", client=True)

        audit_policy = self.root / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        self._spawn(
            "etcd",
            [
                bins["etcd"],
                "--name=test",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=test=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self.url = f"https://127.0.0.1:{api_port}"
        self._spawn(
            "kube-apiserver",
            [
                bins["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                # pods reach it through the kubernetes Service, at the host's address
                "--bind-address=0.0.0.0",
                f"--advertise-address={self.host_address}",
                f"--secure-port={api_port}",
                f"--cert-dir={self.root / 'apiserver'}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={self.ca.cert_path}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--kubelet-client-certificate={kubelet_client[0]}",
                f"--kubelet-client-key={kubelet_client[1]}",
                f"--kubelet-certificate-authority={self.ca.cert_path}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--v=1",
            ],
        )
        admin_cert = self.ca.issue("admin", organization="system:masters", client=True)
        self.admin_kubeconfig = kubeconfig(
            self.root / "admin.kubeconfig", self.url, self.ca.cert_path,
            **{"client-certificate": str(admin_cert[0]), "client-key": str(admin_cert[1])},
        )
        self.wait_ready()
        # Services' cluster IPs work on this host from the start: the controllers run here serve their webhooks
        # through Services, as in a cluster, and the API server reaches them through kube-proxy's rules.
        clean_leftovers()
        self._spawn("kube-proxy", kube_proxy_argv(self, NODE_NAME))

        kcm = self._component_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                bins["kube-controller-manager"],
                f"--kubeconfig={kcm}",
                f"--authentication-kubeconfig={kcm}",
                f"--authorization-kubeconfig={kcm}",
                "--authentication-skip-lookup",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.root / 'kcm'}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={self.ca.cert_path}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*,-bootstrapsigner,-tokencleaner",
                # every node's pod CIDR, which its containerd writes into the node's bridge config
                "--allocate-node-cidrs=true",
                f"--cluster-cidr={self.cluster_cidr}",
                "--node-cidr-mask-size=24",
                "--concurrent-job-syncs=10",
                # A node whose heartbeats stop is NotReady after 25 s (50 s by default), so a test of a lost node
                # takes seconds, not minutes; a longer silence of the only node (the API server restarted) is a
                # full disruption, in which the controller evicts nothing.
                "--node-monitor-grace-period=25s",
                *([f"--kube-api-qps={self.client_qps}", f"--kube-api-burst={2 * self.client_qps}"]
                  if self.client_qps is not None else []),
                "--v=1",
            ],
        )
        sched = self._component_kubeconfig("kube-scheduler", "system:kube-scheduler")
        sched_config = self.root / "kube-scheduler.yaml"
        sched_config.write_text(yaml.safe_dump(scheduler_config(sched, self.client_qps)))
        self._spawn(
            "kube-scheduler",
            [
                bins["kube-scheduler"],
                f"--config={sched_config}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                "--authentication-skip-lookup",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.root / 'scheduler'}",
                "--v=1",
            ],
        )
        self._start_jobset()

    def _component_kubeconfig(self, name: str, user: str, organization: str | None = None) -> Path:
        cert, key = self.ca.issue(name, common_name=user, organization=organization, client=True)
        return kubeconfig(
            self.root / f"{name}.kubeconfig", self.url, self.ca.cert_path,
            **{"client-certificate": str(cert), "client-key": str(key)},
        )

    @property
    def audit_log(self) -> Path:
        return self.root / "logs" / "audit.log"

    def audit_requests(self, user: str = AUDITED_ACCOUNTS[0]) -> list[dict[str, Any]]:
        """Every request ``user`` made (one audit event each, at ResponseComplete), oldest first."""
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        seen: dict[str, dict[str, Any]] = {}
        for event in events:  # a watch is logged when it starts; other requests when they complete
            if event.get("user", {}).get("username") == user and event.get("stage") in (
                "ResponseStarted",
                "ResponseComplete",
            ):
                seen.setdefault(event["auditID"], event)
        return list(seen.values())

    # -- readiness ----------------------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert_path))
        pki = self.ca.directory
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        return context

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until ``/readyz`` answers ``ok``; a component that exits meanwhile fails at once with its log."""
        deadline = time.monotonic() + timeout
        context = self._ssl_context()
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=5) as answer:
                    if answer.read().strip() == b"ok":
                        return
            except OSError as exc:
                last = str(exc)
            time.sleep(0.3)
        raise TimeoutError(f"kube-apiserver not ready after {timeout:g} s ({last}):\n{self.logs()}")

    def check_alive(self) -> None:
        dead = [p for p in self.processes.values() if not p.alive()]
        if dead:
            raise RuntimeError(
                "; ".join(f"{p.name} exited with {p.popen.returncode}" for p in dead) + "\n" + self.logs()
            )

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in self.processes.values())

    # -- clients --------------------------------------------------------------------------------------------------

    def client(self, kubeconfig_path: Path | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` for ``kubeconfig_path`` (the admin's by default)."""
        import kubernetes.config

        return kubernetes.config.new_client_from_config(config_file=str(kubeconfig_path or self.admin_kubeconfig))

    def apply(self, objects: list[dict[str, Any]]) -> None:
        """Create (or leave as they are) ``objects`` as the admin, in order; custom kinds included."""
        from kubernetes.dynamic import DynamicClient
        from kubernetes.dynamic.exceptions import ConflictError, ResourceNotFoundError

        with self.client() as api:
            # its discovery cache in this cluster's folder (by default a file in the system's /tmp, left there)
            dynamic = DynamicClient(api, cache_file=str(self.root / "discovery-cache.json"))
            for obj in objects:
                try:
                    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                except ResourceNotFoundError:  # a CRD created a moment ago
                    dynamic.resources.invalidate_cache()
                    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                namespace = obj["metadata"].get("namespace") if resource.namespaced else None
                with contextlib.suppress(ConflictError):
                    resource.create(body=obj, namespace=namespace)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path | None = None) -> Path:
        """A kubeconfig with a fresh token of ServiceAccount ``namespace/name`` (created if missing)."""
        import kubernetes.client

        self.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
            ]
        )
        with self.client() as api:
            request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"expirationSeconds": 86400}}
            token = kubernetes.client.CoreV1Api(api).create_namespaced_service_account_token(
                name, namespace, request
            ).status.token
        return kubeconfig(
            path or self.root / f"sa-{namespace}-{name}.kubeconfig", self.url, self.ca.cert_path, token=token
        )

    # -- JobSet ---------------------------------------------------------------------------------------------------

    def manifests(self, *parts: str) -> Path:
        return Path(self.components["manifests"], *parts)

    def _start_jobset(self) -> None:
        crds = [yaml.safe_load(p.read_text()) for p in sorted(self.manifests("jobset").glob("jobset.x-k8s.io_*.yaml"))]
        role = yaml.safe_load(self.manifests("jobset", "rbac-role.yaml").read_text())
        role["metadata"] = {"name": "jobset-manager-role"}
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "jobset-manager-rolebinding"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": JOBSET_ACCOUNT, "namespace": JOBSET_NAMESPACE}],
        }
        self.apply([*crds, role, binding])
        self.wait_for_crds([c["metadata"]["name"] for c in crds])
        account = self.service_account_kubeconfig(JOBSET_NAMESPACE, JOBSET_ACCOUNT)

        cert_dir = self.root / "jobset-certs"
        webhook_port, probe_port = free_port(), free_port()
        self.webhook_service(JOBSET_NAMESPACE, JOBSET_WEBHOOK_SERVICE, webhook_port, cert_dir)
        config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook_port, "host": self.host_address, "certDir": str(cert_dir)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        }
        config_path = self.root / "jobset-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        self._spawn(
            "jobset",
            [
                self.components["binaries"]["jobset"],
                f"--kubeconfig={account}",
                f"--config={config_path}",
                "--zap-log-level=info",
            ],
        )
        webhooks = list(yaml.safe_load_all(self.manifests("jobset", "webhooks.yaml").read_text()))
        for config_obj in webhooks:
            config_obj["metadata"]["name"] = f"jobset-{config_obj['metadata']['name']}"
            for hook in config_obj["webhooks"]:
                hook["clientConfig"] = self.webhook_client_config(JOBSET_NAMESPACE, JOBSET_WEBHOOK_SERVICE,
                                                                  hook["clientConfig"]["service"]["path"])
        self._wait_http(f"http://127.0.0.1:{probe_port}/readyz", "jobset", timeout=90)
        self.wait_for_service_route(JOBSET_NAMESPACE, JOBSET_WEBHOOK_SERVICE)
        self.apply(webhooks)

    def webhook_service(self, namespace: str, name: str, port: int, cert_dir: Path) -> None:
        """Service ``namespace/name`` (port 443) for a controller that serves its webhooks on this host at ``port``:
        no selector, one EndpointSlice with the host's address, as for a server outside the cluster (both updated
        when the controller starts again on another port). Writes the server's certificate for the Service's DNS
        names into ``cert_dir`` (``tls.crt``, ``tls.key``)."""
        import kubernetes.client

        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
                   "spec": {"ports": [{"name": "webhook", "port": 443, "targetPort": port, "protocol": "TCP"}]}}
        endpoints = {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-host", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by": "trainjob-test-cluster"}},
            "addressType": "IPv4", "endpoints": [{"addresses": [self.host_address]}],
            "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}],
        }
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, service, endpoints])
        with self.client() as api:  # there from an earlier start: the port moves with the controller
            kubernetes.client.CoreV1Api(api).patch_namespaced_service(name, namespace, {"spec": service["spec"]})
            kubernetes.client.DiscoveryV1Api(api).patch_namespaced_endpoint_slice(
                f"{name}-host", namespace, {"ports": endpoints["ports"], "endpoints": endpoints["endpoints"]})
        cert, key = self.ca.issue(f"{namespace}-{name}", dns=[f"{name}.{namespace}.svc",
                                                            f"{name}.{namespace}.svc.cluster.local"])
        cert_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(cert, cert_dir / "tls.crt")
        shutil.copy(key, cert_dir / "tls.key")

    def wait_for_service_route(self, namespace: str, name: str, port: int = 443, timeout: float = 60.0) -> None:
        """Until a TLS connection from this host to Service ``namespace/name`` at ``port`` reaches the webhook server
        behind it: kube-proxy has programmed the Service's endpoints and the server answers with the certificate
        :meth:`webhook_service` issued for the Service's name. The API server dials webhooks the same way (their
        ClusterIP, through the host's nat OUTPUT chain), so a webhook registered before this holds fails until
        kube-proxy's next sync. A TCP connection alone proves nothing: before kube-proxy's rules exist the ClusterIP
        goes out by the default route, where a network's transparent proxy may accept any connection to port 443
        (and answer with a certificate of its own)."""
        import kubernetes.client

        with self.client() as api:
            address = kubernetes.client.CoreV1Api(api).read_namespaced_service(name, namespace).spec.cluster_ip
        context = ssl.create_default_context(cafile=str(self.ca.cert_path))
        deadline = time.monotonic() + timeout
        error: OSError | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:  # ssl.SSLError (a certificate not from the test CA, or for another name) is an OSError
                with socket.create_connection((address, port), timeout=2) as sock, \
                        context.wrap_socket(sock, server_hostname=f"{name}.{namespace}.svc"):
                    return
            except OSError as e:
                error = e
                time.sleep(0.2)
        raise TimeoutError(f"Service {namespace}/{name} ({address}:{port}) not reachable from the host after "
                           f"{timeout:g} s ({error}):\n{self.logs()}")

    def webhook_client_config(self, namespace: str, name: str, path: str) -> dict[str, Any]:
        """A webhook's ``clientConfig``: Service ``namespace/name`` (see :meth:`webhook_service`) at ``path``."""
        return {"service": {"namespace": namespace, "name": name, "path": path, "port": 443},
                "caBundle": base64.b64encode(self.ca.cert_path.read_bytes()).decode()}

    def install_podgroup_crds(self) -> None:
        """The coscheduling (scheduler-plugins) and Volcano PodGroup CRDs, as their projects publish them."""
        crds = [yaml.safe_load(p.read_text()) for p in sorted(self.manifests("podgroups").glob("*.yaml"))]
        self.apply(crds)
        self.wait_for_crds([c["metadata"]["name"] for c in crds])

    def wait_for_crds(self, names: list[str], timeout: float = 60.0) -> None:
        """Until every CRD in ``names`` is Established (served)."""
        import kubernetes.client

        deadline = time.monotonic() + timeout
        with self.client() as api:
            ext = kubernetes.client.ApiextensionsV1Api(api)
            pending = list(names)
            while pending and time.monotonic() < deadline:
                crd = ext.read_custom_resource_definition(pending[0])
                conditions = {c.type: c.status for c in (crd.status.conditions or [])}
                if conditions.get("Established") == "True":
                    pending.pop(0)
                else:
                    time.sleep(0.2)
        if pending:
            raise TimeoutError(f"CRDs not established after {timeout:g} s: {pending}")

    def _wait_http(self, url: str, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"{name} not ready after {timeout:g} s:\n{self.processes[name].tail()}")

    # -- the nodes ------------------------------------------------------------------------------------------------

    def _start_nodes(self, names: list[str]) -> None:
        """The registry and the images, then each node and CoreDNS."""
        self.registry = Registry.start(cache_dir() / "registry", self.root / "logs" / "registry.log")
        self.images = build_images(self.registry, self.components, self.root / "logs" / "images.log")
        self.nodes = Nodes(self, self.registry, self.images, self.host_address)
        for name in names:
            self.nodes.start_node(name, wait=False)
        for name in names:
            self.wait_node_ready(timeout=120.0, name=name)
        self.nodes.start_coredns()
        with ThreadPoolExecutor(4) as pool:  # each node pulls the large images ahead of the first pod; a failure raises
            for pulled in [pool.submit(self.nodes.pull, node, self.images[image])
                           for node in self.nodes.nodes.values() for image in ("trainjob-train", "trainjob-operator")]:
                pulled.result()
        self.nodes.wait_dns()

    @property
    def training_image(self) -> str:
        """The image the tests' training pods run: ``deploy/training.Dockerfile`` (torch, trainjob, examples/)."""
        return self.images["trainjob-train"]

    @property
    def operator_image(self) -> str:
        """The operator image (``deploy/Dockerfile``) that ``trainjob install --image`` deploys."""
        return self.images["trainjob-operator"]

    @property
    def stacks_image(self) -> str:
        """The stack dumper (``deploy/stacks.Dockerfile``: py-spy) that ``trainjob stacks --debug-image`` runs."""
        return self.images["trainjob-stacks"]

    def lose_node(self, name: str = SECOND_NODE) -> None:
        """Node ``name``'s machine is gone: its kubelet, containerd and every container SIGKILLed at once. The Node
        and its pods stay in the API server until Kubernetes' node lifecycle acts (NotReady after the grace period,
        then the ``unreachable`` taints); :meth:`restore_node` brings the machine back."""
        self.nodes.lose_node(name)

    def restore_node(self, name: str = SECOND_NODE) -> None:
        """Node ``name`` back in service, as an admin brings a repaired machine back: its containerd and kubelet
        started again if they are down, the ``out-of-service`` taint removed and the node made schedulable; until the
        Node is Ready without taints."""
        import kubernetes.client

        if f"kubelet-{name}" not in self.processes:
            self.nodes.start_node(name, wait=False)
        with self.client() as api:
            core = kubernetes.client.CoreV1Api(api)
            taints = [t.to_dict() for t in core.read_node(name).spec.taints or []
                      if t.key != "node.kubernetes.io/out-of-service"]
            core.patch_node(name, {"spec": {"taints": taints or None, "unschedulable": None}})
        self.wait_node_ready(timeout=120.0, name=name)

    def wait_node_ready(self, timeout: float = 60.0, name: str = NODE_NAME) -> None:
        import kubernetes.client

        deadline = time.monotonic() + timeout
        with self.client() as api:
            core = kubernetes.client.CoreV1Api(api)
            while time.monotonic() < deadline:
                self.check_alive()
                with contextlib.suppress(kubernetes.client.ApiException):
                    node = core.read_node(name)
                    ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
                    taints = [t.key for t in node.spec.taints or []]
                    if ready and ready[0].status == "True" and not taints:
                        return
                time.sleep(0.3)
        kubelet = self.processes.get(f"kubelet-{name}")
        raise TimeoutError(f"node {name} not Ready after {timeout:g} s:\n{kubelet.tail() if kubelet else ''}")
