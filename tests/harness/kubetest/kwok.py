"""Simulated nodes on the test control plane: KWOK (``sigs.k8s.io/kwok``, built unmodified by
``scripts/cluster/build.sh``) plays the kubelet for nodes that exist only as API objects, and moves the pods bound
to them through their life cycle, so that thousands of pods can be scheduled and finished on two CPU cores::

    with SimulatedNodes.start(cp, run_seconds=1.0) as kwok:
        names = kwok.add_nodes(4)                  # Ready within seconds, tainted and labelled
        cluster.namespaced_runtime(ns, "simulated", on_simulated_nodes)
        ...                                        # TrainJobs with runtimeRef TrainingRuntime "simulated"
    # stop(): the nodes are deleted, kwok and its RBAC are gone

Everything else is the real control plane: the scheduler binds the pods, the Job and JobSet controllers and the
operator see the same objects and the same status transitions a kubelet would write. Only the pods' processes are
imaginary.

What the simulated nodes are:

- annotated ``kwok.x-k8s.io/node=fake``: kwok runs with ``--manage-nodes-with-annotation-selector`` and touches
  nothing else (the real nodes and their pods are not its business);
- tainted ``kwok.x-k8s.io/node=fake:NoSchedule`` and labelled ``type=kwok``: only pods that tolerate the taint and
  select the label land there (:func:`on_simulated_nodes` changes a runtime so that its pods do), and no pod of
  another test ever does;
- with their own pod CIDR each (kwok hands pod IPs out of it), 32 CPUs, 256 GiB and 110 pods like a kubelet's
  default, and a node Lease that kwok renews (``node_lease_seconds / 4``), so the node lifecycle controller keeps
  them Ready.

The life cycle is ours (:data:`STAGE_TEMPLATES`, KWOK's Stage API, given to kwok in its configuration file rather
than as custom resources, so nothing is installed in the cluster): a node becomes Ready; a bound pod becomes
Running (``start_seconds``); a pod owned by a Job exits 0 ``run_seconds`` later (Succeeded), so its TrainJob
completes through the normal Job -> JobSet -> TrainJob path; a pod deleted while it runs fails with exit code 143
(SIGTERM), as a kubelet reports it, and is removed once no finalizer holds it.

kwok connects as the user ``kwok-controller`` (a client certificate from the test CA) with a ClusterRole of the
permissions it uses, and a FlowSchema puts it in the ``exempt`` priority level, as KWOK's own deployment does: the
simulated kubelets of a thousand nodes must not be throttled like a tenant.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kubetest.controlplane import ControlPlane, Process, free_port
from kubetest.nodes import SIMULATED_POD_RANGE

USER = "kwok-controller"
ANNOTATION = "kwok.x-k8s.io/node"
TAINT = {"key": ANNOTATION, "value": "fake", "effect": "NoSchedule"}
LABEL = {"type": "kwok"}
RBAC_NAME = "trainjob-test-kwok-controller"
#: Node resources, as a kubelet on a 32-CPU machine with the default pod limit reports them.
NODE_RESOURCES = {"cpu": "32", "memory": "256Gi", "pods": "110"}
#: Simulated nodes' pod CIDRs are /24s out of this range: room for 32,768 nodes.
POD_RANGE = ipaddress.ip_network(SIMULATED_POD_RANGE)

_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["patch", "update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "update", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["get", "list", "watch", "create", "patch", "update"]},
]

_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}

_NODE_CONDITIONS = """\
conditions:
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
{{ range $type, $status := dict "Ready" "True" "MemoryPressure" "False" "DiskPressure" "False"
     "PIDPressure" "False" "NetworkUnavailable" "False" }}
- type: {{ $type | Quote }}
  status: {{ $status | Quote }}
  reason: {{ if eq $type "Ready" }}"KubeletReady"{{ else }}"Simulated"{{ end }}
  message: "simulated by kwok"
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
{{ end }}
"""

#: The Stage templates kwok plays (Go templates with sprig and KWOK's functions, rendered into a status patch).
STAGE_TEMPLATES: dict[str, str] = {
    "node": _NODE_CONDITIONS + """\
addresses:
{{ with .status.addresses }}{{ YAML . 1 }}{{ else }}
- {type: InternalIP, address: {{ NodeIP | Quote }}}
- {type: Hostname, address: {{ .metadata.name | Quote }}}
{{ end }}
allocatable:
{{ with .status.allocatable }}{{ YAML . 1 }}{{ else }}  {cpu: "32", memory: 256Gi, pods: "110"}{{ end }}
capacity:
{{ with .status.capacity }}{{ YAML . 1 }}{{ else }}  {cpu: "32", memory: 256Gi, pods: "110"}{{ end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: "simulated"
  kernelVersion: "simulated"
  osImage: "simulated"
  kubeProxyVersion: ""
  bootID: ""
  machineID: ""
  systemUUID: ""
phase: Running
""",
    "pod-running": """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName (or .spec.hostNetwork false) (or .metadata.uid "") (or .metadata.name "")
          (or .metadata.namespace "") | Quote }}
conditions:
{{ range list "PodReadyToStartContainers" "Initialized" "ContainersReady" "Ready" }}
- {type: {{ . | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  ready: true
  started: true
  restartCount: 0
  state: {running: {startedAt: {{ $now | Quote }}}}
{{ end }}
""",
}


def exit_template(phase: str, code: int, reason: str) -> str:
    """The status of a pod whose containers exited with ``code``: terminal ``phase``, no longer Ready."""
    return f"""\
{{{{ $now := Now }}}}
{{{{ $started := or .status.startTime $now }}}}
phase: {phase}
conditions:
{{{{ range list "ContainersReady" "Ready" }}}}
- {{type: {{{{ . | Quote }}}}, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
{{{{ end }}}}
containerStatuses:
{{{{ range .spec.containers }}}}
- name: {{{{ .name | Quote }}}}
  image: {{{{ .image | Quote }}}}
  imageID: ""
  ready: false
  started: false
  restartCount: 0
  state:
    terminated: {{exitCode: {code}, reason: {reason}, startedAt: {{{{ $started | Quote }}}}, finishedAt: {{{{ $now | Quote }}}}}}
{{{{ end }}}}
"""


def _stage(name: str, kind: str, match: list[dict[str, Any]], next_: dict[str, Any],
           delay_ms: int = 0, jitter_ms: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": match},
        "next": next_,
    }
    if delay_ms or jitter_ms:
        spec["delay"] = {"durationMilliseconds": delay_ms, "jitterDurationMilliseconds": max(jitter_ms, delay_ms)}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def stages(start_seconds: float = 0.0, run_seconds: float = 1.0,
           heartbeat_seconds: float = 300.0) -> list[dict[str, Any]]:
    """KWOK Stages for the life cycle in the module docstring.

    ``start_seconds``: from bound to Running; ``run_seconds``: from Running to Succeeded, for pods owned by a
    Job (other pods run until deleted); ``heartbeat_seconds``: how often a node's status is rewritten (its Lease
    is what keeps it Ready; the status heartbeat is the kubelet's slow one)."""
    ready = {"key": '.status.conditions.[] | select(.type == "Ready") | .status', "operator": "In",
             "values": ["True"]}
    return [
        _stage("node-ready", "Node",
               [{**ready, "operator": "NotIn"}],
               {"statusTemplate": STAGE_TEMPLATES["node"]}),
        _stage("node-heartbeat", "Node",
               [ready, {"key": ".status.phase", "operator": "In", "values": ["Running"]}],
               {"statusTemplate": _NODE_CONDITIONS},
               delay_ms=int(heartbeat_seconds * 1000), jitter_ms=int(heartbeat_seconds * 1100)),
        _stage("pod-running", "Pod",
               [_NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}],
               {"statusTemplate": STAGE_TEMPLATES["pod-running"]},
               delay_ms=int(start_seconds * 1000)),
        _stage("pod-succeeded", "Pod",
               [_NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}],
               {"statusTemplate": exit_template("Succeeded", 0, "Completed")},
               delay_ms=int(run_seconds * 1000)),
        # Deleted while it runs: its containers get SIGTERM and exit 143, as a kubelet reports it.
        _stage("pod-terminated", "Pod",
               [{"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Pending", "Running"]}],
               {"statusTemplate": exit_template("Failed", 143, "Error")}),
        # A terminal pod that is being deleted and that no finalizer holds: the kubelet's final delete.
        _stage("pod-removed", "Pod",
               [{"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                {"key": ".status.phase", "operator": "In", "values": ["Succeeded", "Failed"]},
                {"key": ".metadata.finalizers", "operator": "DoesNotExist"}],
               {"delete": True}),
    ]


def on_simulated_nodes(spec: dict[str, Any]) -> None:
    """For :meth:`kubetest.cluster.TrainJobCluster.namespaced_runtime`: every pod of the runtime tolerates the
    simulated nodes' taint and selects their label, so it runs on one of them (and on nothing else)."""
    for rj in spec["template"]["spec"]["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"].setdefault("spec", {})
        pod["tolerations"] = [*pod.get("tolerations", []), {**TAINT, "operator": "Equal"}]
        pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **LABEL}


def node_body(name: str, index: int) -> dict[str, Any]:
    """A simulated node, as a kubelet would register it."""
    cidr = ipaddress.ip_network(f"{POD_RANGE.network_address + index * 256}/24")
    address = str(ipaddress.ip_address("172.16.0.0") + index + 1)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {**LABEL, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64"},
        },
        "spec": {"taints": [TAINT], "podCIDR": str(cidr), "podCIDRs": [str(cidr)]},
        "status": {
            "allocatable": dict(NODE_RESOURCES),
            "capacity": dict(NODE_RESOURCES),
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
        },
    }


class SimulatedNodes:
    """kwok as a child process of the control plane ``cp``, and the simulated nodes it plays."""

    def __init__(self, cp: ControlPlane, *, start_seconds: float = 0.0, run_seconds: float = 1.0,
                 node_lease_seconds: int = 40, prefix: str = "kwok-node", log_level: str = "INFO",
                 delete_on_stop: bool = True) -> None:
        """``start_seconds``, ``run_seconds``: see :func:`stages`; ``node_lease_seconds``: the nodes' Lease
        duration, renewed every quarter of it (a kubelet's default is 40); ``log_level``: kwok's (INFO logs every
        status patch; WARN for thousands of pods); ``delete_on_stop=False`` leaves the nodes and RBAC to a control
        plane that is thrown away next (deleting a thousand nodes takes minutes)."""
        self.cp = cp
        self.start_seconds = start_seconds
        self.run_seconds = run_seconds
        self.node_lease_seconds = node_lease_seconds
        self.prefix = prefix
        self.log_level = log_level
        self.delete_on_stop = delete_on_stop
        self.nodes: list[str] = []
        self.process: Process | None = None

    @classmethod
    @contextlib.contextmanager
    def start(cls, cp: ControlPlane, **options: Any) -> Iterator[SimulatedNodes]:
        """kwok running; on exit its nodes deleted and everything it needed removed."""
        kwok = cls(cp, **options)
        try:
            kwok.launch()
            yield kwok
        finally:
            kwok.stop()

    @property
    def binary(self) -> str:
        binaries = self.cp.components["binaries"]
        if "kwok" not in binaries:
            raise RuntimeError("scripts/cluster/build.sh built no kwok: its manifest.json has no binaries.kwok")
        return str(binaries["kwok"])

    def launch(self, timeout: float = 60.0) -> None:
        assert self.process is None or not self.process.alive(), "kwok runs already"
        cp = self.cp
        cp.apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": RBAC_NAME},
             "rules": _RULES},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": RBAC_NAME},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": RBAC_NAME},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]},
            {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": RBAC_NAME},
             "spec": {"priorityLevelConfiguration": {"name": "exempt"}, "matchingPrecedence": 1000,
                      "rules": [{"subjects": [{"kind": "User", "user": {"name": USER}}],
                                 "resourceRules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"],
                                                    "clusterScope": True, "namespaces": ["*"]}]}]}},
        ])
        account = cp._component_kubeconfig("kwok", USER)
        port = free_port()
        config = cp.root / "kwok.yaml"
        config.write_text(yaml.safe_dump_all(stages(self.start_seconds, self.run_seconds), sort_keys=False))
        self.process = cp._spawn("kwok", [
            self.binary,
            f"--kubeconfig={account}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
            f"--node-lease-duration-seconds={self.node_lease_seconds}",
            f"--v={self.log_level}",
            f"--server-address=127.0.0.1:{port}",  # for its /healthz, served once its controllers run
        ], env={"HOME": str(cp.root / "kwok-home")})
        try:
            cp._wait_http(f"http://127.0.0.1:{port}/healthz", "kwok", timeout)
        except BaseException:
            self.stop()
            raise

    def add_nodes(self, count: int, timeout: float = 120.0) -> list[str]:
        """Create ``count`` more simulated nodes and wait until every one is Ready and schedulable."""
        import kubernetes.client

        first = len(self.nodes)
        names = [f"{self.prefix}-{i}" for i in range(first, first + count)]
        with self.cp.client() as api:
            core = kubernetes.client.CoreV1Api(api)
            for i, name in enumerate(names, start=first):
                core.create_node(node_body(name, i))
                self.nodes.append(name)
            self.wait_ready(core, set(names), timeout)
        return names

    def wait_ready(self, core: Any, names: set[str], timeout: float) -> None:
        """Until every node in ``names`` is Ready with no taint but the simulated nodes' own."""
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending:
            self.cp.check_alive()
            answer = core.list_node(label_selector="type=kwok")
            for node in answer.items:
                ready = [c for c in node.status.conditions or [] if c.type == "Ready" and c.status == "True"]
                taints = [t.key for t in node.spec.taints or []]
                if ready and taints == [TAINT["key"]]:
                    pending.discard(node.metadata.name)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} simulated nodes not Ready after {timeout:g} s, e.g. "
                                   f"{sorted(pending)[:3]}:\n{self.tail()}")
            time.sleep(0.5)

    def delete_nodes(self, timeout: float = 120.0) -> None:
        """Delete every simulated node this object created, and wait until they are gone."""
        import kubernetes.client

        with self.cp.client() as api:
            core = kubernetes.client.CoreV1Api(api)
            core.delete_collection_node(label_selector="type=kwok")
            deadline = time.monotonic() + timeout
            while core.list_node(label_selector="type=kwok").items:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"simulated nodes still there after {timeout:g} s")
                time.sleep(0.3)
        self.nodes.clear()

    def stop(self) -> None:
        """Delete the nodes, stop kwok, remove its RBAC and FlowSchema: the cluster as it was before (only kwok
        stops with ``delete_on_stop=False``)."""
        import kubernetes.client

        try:
            if self.delete_on_stop:
                self.delete_nodes()
        finally:
            if self.process is not None:
                self.process.stop()
                self.cp.processes.pop("kwok", None)
                self.process = None
        if self.delete_on_stop:
            with self.cp.client() as api:
                rbac = kubernetes.client.RbacAuthorizationV1Api(api)
                flows = kubernetes.client.FlowcontrolApiserverV1Api(api)
                for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role,
                               flows.delete_flow_schema):
                    with contextlib.suppress(kubernetes.client.ApiException):
                        delete(RBAC_NAME)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def tail(self, chars: int = 3000) -> str:
        return self.process.tail(chars) if self.process is not None else ""

    @property
    def log(self) -> Path | None:
        return self.process.log if self.process is not None else None
