"""trainjob on the test cluster, installed as the README tells platform engineers: ``trainjob install --image``
with the operator image built from ``deploy/Dockerfile`` (:class:`DeployedOperator`: the ``trainjob-operator``
Deployment's two replicas, leader election on the Lease, the status endpoint behind its Service). Tests that run the
operator as a process of their own (its flags, its log, a profiler) scale the Deployment to 0 first and use
:class:`OperatorProcess`, with the same ServiceAccount's token.

The built-in torch runtimes run the training image built from ``deploy/training.Dockerfile``
(``trainjob install --torch-image``). Every runtime's pods also mount two host folders at their own paths, as a
cluster mounts a shared file system: the repo, read-only (the tests' training scripts), and the session's
temporary folder (what a test's pods write and the test reads). Both nodes are this host, so a hostPath is that
shared file system here.

:class:`TrainJobCluster` is what the end-to-end tests use::

    cluster = TrainJobCluster(control_plane, tmp)
    cluster.install()                          # trainjob install --image <the operator image>, as the admin
    cluster.operator.start()                   # until the Deployment's leader is ready
    cluster.create_job("mnist", trainer={"numNodes": 2, "command": [...]})
    cluster.wait_for_condition("mnist", "Complete", timeout=180)
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobtest.waiting import wait_until

from kubetest.controlplane import REPO, ControlPlane, free_port
from trainjob.backends.kubernetes.config import KubernetesBackendConfig, load_api_client
from trainjob.backends.kubernetes.kubeapi import KubeApi
from trainjob.backends.kubernetes.manifests import LEASE_NAME, OPERATOR_REPLICAS, STATUS_URL
from trainjob.backends.kubernetes.manifests import NAME as OPERATOR_NAME
from trainjob.backends.kubernetes.manifests import NAMESPACE as OPERATOR_NAMESPACE
from trainjob.backends.kubernetes.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    ENDPOINT_SLICES,
    JOBSETS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
)
from trainjob.backends.kubernetes.status import find_condition


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "the condition", every: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` on timeout."""
    return wait_until(predicate, timeout, interval=every, what=what)


def mount_shared_folders(runtime: dict[str, Any], folders: dict[str, bool]) -> dict[str, Any]:
    """``runtime`` with ``folders`` (path -> read-only) mounted at their own paths in every container of its pods."""
    runtime = copy.deepcopy(runtime)
    for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"]["spec"]
        volumes = pod.setdefault("volumes", [])
        for index, (path, read_only) in enumerate(folders.items()):
            name = f"shared-{index}"
            if any(v["name"] == name for v in volumes):
                continue
            volumes.append({"name": name, "hostPath": {"path": path, "type": "Directory"}})
            for container in pod.get("initContainers", []) + pod.get("containers", []):
                container.setdefault("volumeMounts", []).append(
                    {"name": name, "mountPath": path, **({"readOnly": True} if read_only else {})})
    return runtime


def no_retries(spec: dict[str, Any]) -> None:
    """For :meth:`TrainJobCluster.namespaced_runtime`: a failed pod fails its Job at once (the default is 6
    retries, each one a whole new training run)."""
    for rj in spec["template"]["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["backoffLimit"] = 0


class OperatorProcess:
    """``trainjob operator`` as a child process with the operator ServiceAccount's kubeconfig."""

    def __init__(self, kubeconfig: Path, log: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.popen: subprocess.Popen[bytes] | None = None
        #: Kubeflow's status endpoint, where the jobs' pods push progress (the same port across restarts, so the
        #: URL running pods were given stays good).
        self.status_port = free_port()
        self.extra_args = extra_args

        #: The address the pods reach this machine at (the node's bridge; set once the node is up).
        self.status_host = "127.0.0.1"

    @property
    def status_url(self) -> str:
        return f"https://{self.status_host}:{self.status_port}"

    def start(self) -> None:
        assert self.popen is None or self.popen.poll() is not None, "the operator runs already"
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "trainjob.cli.main", "operator",
                 f"--kubeconfig={self.kubeconfig}", "--workers=4", "-v",
                 f"--status-url={self.status_url}", f"--status-port={self.status_port}", *self.extra_args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as when its pod's node dies."""
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


class DeployedOperator:
    """The operator as users run it: the ``trainjob-operator`` Deployment of ``trainjob install`` (two replicas
    electing a leader on the Lease), its image pulled from the test registry. The same methods as
    :class:`OperatorProcess`: :meth:`start` and :meth:`stop` scale the Deployment, :meth:`kill` deletes the leader's
    pod with no grace (its containers SIGKILLed, as when its node dies), :meth:`tail` reads the pods' logs."""

    def __init__(self, cluster: TrainJobCluster, replicas: int = OPERATOR_REPLICAS) -> None:
        self.cluster = cluster
        self.replicas = replicas
        #: Where the jobs' pods report (the operator Service's DNS name).
        self.status_url = STATUS_URL

    def _kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", OPERATOR_NAMESPACE, *args, check=check)

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.api.list_pods(OPERATOR_NAMESPACE, f"app.kubernetes.io/name={OPERATOR_NAME}")

    def leader(self) -> str | None:
        """The pod holding the Lease (the elector's identity is ``<hostname>_<uuid>``; a pod's hostname is its
        name), or ``None``."""
        import kubernetes.client

        with contextlib.suppress(kubernetes.client.ApiException):
            lease = kubernetes.client.CoordinationV1Api(self.cluster.api.client).read_namespaced_lease(
                LEASE_NAME, OPERATOR_NAMESPACE)
            holder = lease.spec.holder_identity or ""
            ready = {p["metadata"]["name"] for p in self.pods() if _ready(p)}
            name = holder.rsplit("_", 1)[0]
            return name if name in ready else None
        return None

    def serving(self) -> list[tuple[str | None, list[str]]]:
        """Where the operator Service sends the pods' reports: (pod, addresses) of each endpoint of its
        EndpointSlices (the leader writes its own there just after it takes the Lease)."""
        slices = self.cluster.api.list(ENDPOINT_SLICES, OPERATOR_NAMESPACE,
                                       f"kubernetes.io/service-name={OPERATOR_NAME}")
        return [((e.get("targetRef") or {}).get("name"), list(e.get("addresses") or []))
                for s in slices for e in s.get("endpoints") or []]

    def _leads_and_serves(self) -> bool:
        leader = self.leader()
        return leader is not None and [pod for pod, _ in self.serving()] == [leader]

    def start(self, timeout: float = 180.0) -> None:
        """Scale to :attr:`replicas`; until a replica leads, is ready (it serves the status endpoint) and the
        operator Service points at it alone (a leader killed earlier left its own address there)."""
        self._kubectl("scale", "deployment", OPERATOR_NAME, f"--replicas={self.replicas}")
        self._wait(self._leads_and_serves, timeout, "a ready leader of the operator Deployment, behind its Service")

    def stop(self, timeout: float = 90.0) -> None:
        """Scale to 0; until its pods are gone (SIGTERM: the leader releases the Lease as it exits)."""
        self._kubectl("scale", "deployment", OPERATOR_NAME, "--replicas=0")
        self._wait(lambda: not self.pods(), timeout, "the operator's pods to go")

    def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            wait_for(predicate, timeout, what, every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{self.describe()}") from None

    def kill(self) -> None:
        """The leader's pod deleted with no grace: its process SIGKILLed; the other replica takes the Lease once it
        expires, and the Deployment makes a new pod."""
        leader = self.leader()
        assert leader is not None, self.describe()
        self._kubectl("delete", "pod", leader, "--grace-period=0", "--force", "--wait=false")

    def alive(self) -> bool:
        return self._leads_and_serves()

    def describe(self) -> str:
        pods = self._kubectl("get", "pods", "-o", "wide", check=False)
        return f"{pods.stdout}{pods.stderr}\n{self.tail(3000)}"

    def tail(self, chars: int = 4000) -> str:
        """Every operator pod's log (the leader's first), the last ``chars`` characters of each."""
        leader = self.leader()
        names = sorted((p["metadata"]["name"] for p in self.pods()), key=lambda n: n != leader)
        parts = []
        for name in names:
            done = self._kubectl("logs", name, "--tail=200", check=False)
            role = "leader" if name == leader else "replica"
            parts.append(f"--- {name} ({role})\n{(done.stdout + done.stderr)[-chars:]}")
        return "\n".join(parts)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class TrainJobCluster:
    """The control plane with trainjob installed; ``api`` talks as the admin, like ``kubectl`` would."""

    def __init__(self, control_plane: ControlPlane, root: Path) -> None:
        self.cp = control_plane
        self.root = root
        self.kubeconfig = control_plane.admin_kubeconfig
        self.config = KubernetesBackendConfig(config_file=str(self.kubeconfig))
        self.api = KubeApi(load_api_client(self.config))
        self.operator_kubeconfig = root / "operator.kubeconfig"
        self.operator = DeployedOperator(self)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the real ``kubectl`` (built from k8s.io/kubernetes with the control plane) as the admin; ``input``
        is its standard input (``kubectl apply -f -``)."""
        done = subprocess.run(
            [self.cp.components["binaries"]["kubectl"], f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, timeout=timeout, input=input,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def trainjob(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run the ``trainjob`` command line as a user would."""
        done = subprocess.run(
            [sys.executable, "-m", "trainjob.cli.main", *args],
            capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
        )
        if check and done.returncode != 0:
            raise AssertionError(f"trainjob {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def install(self) -> None:
        self.trainjob(*self.install_args)
        self.mount_shared_folders_in_runtimes()
        self.cp.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_NAME, self.operator_kubeconfig)

    @property
    def install_args(self) -> list[str]:
        """``trainjob install`` as this cluster is installed: the operator Deployment runs the operator image, the
        torch runtimes run the training image. The operator requests no CPU: each node has two, and the tests' jobs
        fill them with two 1-CPU pods."""
        return ["install", f"--kubeconfig={self.kubeconfig}", f"--image={self.cp.operator_image}",
                f"--operator-replicas={OPERATOR_REPLICAS}", "--operator-cpu=0",
                f"--torch-image={self.cp.training_image}"]

    def operator_process(self, log: Path, *args: str) -> OperatorProcess:
        """``trainjob operator`` as a process of this host with the operator's token (stop :attr:`operator` first:
        both would lead in turn); its status endpoint on the host's address."""
        process = OperatorProcess(self.operator_kubeconfig, log, extra_args=args)
        process.status_host = self.cp.host_address
        return process

    def resolve(self, url: str) -> str:
        """The ClusterIP behind a ``https://<service>.<namespace>.svc:<port>`` URL (this host has no cluster DNS;
        kube-proxy's rules take it from there)."""
        from urllib.parse import urlsplit

        service, namespace = (urlsplit(url).hostname or "").split(".")[:2]
        return self.api.core.read_namespaced_service(service, namespace).spec.cluster_ip

    def mount_shared_folders_in_runtimes(self) -> None:
        """Every ClusterTrainingRuntime's pods mount :attr:`shared_folders` (again, after an install)."""
        for runtime in self.api.list(CLUSTER_TRAINING_RUNTIMES, None):
            spec = mount_shared_folders(runtime, self.shared_folders)["spec"]
            self.api.patch(CLUSTER_TRAINING_RUNTIMES, None, runtime["metadata"]["name"], {"spec": spec})

    @property
    def shared_folders(self) -> dict[str, bool]:
        """Host folders every runtime's pods mount at the same path: folder -> read-only."""
        return {str(REPO): True, str(self.root.parent): False}

    # -- objects --------------------------------------------------------------------------------------------------

    def create_job(self, name: str, namespace: str = "default", runtime: str = "torch-distributed",
                   runtime_kind: str | None = None, annotations: dict[str, str] | None = None,
                   **spec: Any) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": runtime}
        if runtime_kind:
            ref["kind"] = runtime_kind
        body = {
            "apiVersion": TRAINJOBS.api_version,
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace, **({"annotations": annotations} if annotations else {})},
            "spec": {"runtimeRef": ref, **spec},
        }
        return self.api.create(body, TRAINJOBS)

    def namespaced_runtime(
        self, namespace: str, name: str, change: Callable[[dict[str, Any]], None] = lambda spec: None
    ) -> str:
        """A TrainingRuntime in ``namespace``: the built-in torch-distributed one, changed by ``change(spec)``."""
        spec = copy.deepcopy(self.api.get(CLUSTER_TRAINING_RUNTIMES, None, "torch-distributed")["spec"])
        change(spec)
        self.api.create(
            {
                "apiVersion": TRAINING_RUNTIMES.api_version,
                "kind": "TrainingRuntime",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            },
            TRAINING_RUNTIMES,
        )
        return name

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        job = self.api.get(TRAINJOBS, namespace, name)
        assert job is not None, f"TrainJob {namespace}/{name} is gone"
        return job

    def jobset(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.api.get(JOBSETS, namespace, name)

    def pods(self, job: str, namespace: str = "default") -> list[dict[str, Any]]:
        return self.api.list_pods(namespace, f"jobset.sigs.k8s.io/jobset-name={job}")

    def batch_jobs(self, job: str, namespace: str = "default") -> list[dict[str, Any]]:
        import json

        import kubernetes.client

        answer = kubernetes.client.BatchV1Api(self.api.client).list_namespaced_job(
            namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={job}", _preload_content=False
        )
        return list(json.loads(answer.data)["items"])

    def wait_for_condition(self, name: str, type_: str, value: str = "True", namespace: str = "default",
                           timeout: float = 60.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            job = self.job(name, namespace)
            cond = find_condition(job.get("status") or {}, type_)
            if cond is None or cond["status"] != value:
                failed = find_condition(job.get("status") or {}, "Failed")
                if type_ != "Failed" and failed is not None and failed["status"] == "True":
                    raise AssertionError(f"TrainJob {name} failed while waiting for {type_}: {failed}")
                return None
            return job

        try:
            return wait_for(check, timeout, f"TrainJob {namespace}/{name} to have {type_}={value}", every=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics(name, namespace)}") from None

    def diagnostics(self, name: str, namespace: str = "default") -> str:
        """What a person would look at: the job's status, its pods, the operator's log tail."""
        lines = [f"TrainJob status: {(self.api.get(TRAINJOBS, namespace, name) or {}).get('status')}"]
        js = self.jobset(name, namespace)
        lines.append(f"JobSet status: {(js or {}).get('status')}")
        for pod in self.pods(name, namespace):
            status = pod.get("status") or {}
            lines.append(f"pod {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: {status.get('phase')} "
                         f"{[(c['type'], c['status'], c.get('message')) for c in status.get('conditions') or []]} "
                         f"{[c.get('state') for c in status.get('containerStatuses') or []]}")
            with contextlib.suppress(Exception):  # gone with its node, or never started
                tail = self.api.read_log(namespace, pod, pod["spec"]["containers"][0]["name"], tail_lines=25)
                lines.append(f"  its log's end:\n{tail}")
        events = self.api.list_events(namespace, name, include_children=True)
        lines += [f"event {e['involvedObject']['name']}: {e['type']} {e['reason']}: {e['message']}" for e in events[-15:]]
        lines.append(f"operator log:\n{self.operator.tail(2500)}")
        nodes = {p["spec"].get("nodeName") for p in self.pods(name, namespace)}
        for component in (*(f"kubelet-{n}" for n in sorted(n for n in nodes if n)), "kube-scheduler",
                          "kube-controller-manager", "jobset"):
            if component in self.cp.processes:
                lines.append(f"{component} log:\n{self.cp.processes[component].tail(1500)}")
        return "\n".join(lines)
