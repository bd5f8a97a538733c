"""Gang scheduling on the test cluster: the scheduler of ``sigs.k8s.io/scheduler-plugins`` with its Coscheduling
plugin, started beside kube-scheduler for the tests that need it, and a pod size that leaves a node room for a
given number of pods.

``scripts/cluster/build.sh`` builds that scheduler (``binaries["scheduler-plugins"]``). It answers only to pods
with ``schedulerName: scheduler-plugins-scheduler`` (kube-scheduler keeps every other pod), as its own user with
kube-scheduler's roles plus the PodGroups (``scheduling.x-k8s.io/v1alpha1``) it reads::

    with coscheduling_scheduler(cp) as scheduler_name:
        cpu = cpu_for_slots(cp, NODE_NAME, 3)   # three pods of this request fit on the node, a fourth does not
        ...  # pods with schedulerName: scheduler_name, a scheduling.x-k8s.io/pod-group label, on NODE_NAME
"""

from __future__ import annotations

import contextlib
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from kubetest.controlplane import ControlPlane, free_port

SCHEDULER_NAME = "scheduler-plugins-scheduler"
USER = "trainjob:scheduler-plugins"
PROCESS = "scheduler-plugins"
#: How long a pod Coscheduling turned down waits, at least, before it is tried again.
RETRY_SECONDS = 3

RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "trainjob:scheduler-plugins:podgroups"},
        "rules": [{"apiGroups": ["scheduling.x-k8s.io"], "resources": ["podgroups", "podgroups/status"],
                   "verbs": ["get", "list", "watch", "update", "patch"]}],
    },
    *[
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"trainjob:scheduler-plugins:{role.rsplit(':', 1)[-1]}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        }
        for role in ("system:kube-scheduler", "system:volume-scheduler", "trainjob:scheduler-plugins:podgroups")
    ],
]


def scheduler_config(kubeconfig_path: str) -> dict[str, Any]:
    """One profile, ``scheduler-plugins-scheduler``, with Coscheduling as the examples of scheduler-plugins
    configure it: the queue sort (instead of every other), and its pre-filter, post-filter, permit and reserve
    extension points (``multiPoint``)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig_path},
        "leaderElection": {"leaderElect": False},
        "profiles": [{
            "schedulerName": SCHEDULER_NAME,
            "plugins": {
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
            },
            "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}],
        }],
    }


@contextlib.contextmanager
def coscheduling_scheduler(cp: ControlPlane, timeout: float = 60.0) -> Iterator[str]:
    """The scheduler-plugins scheduler, running (and healthy) until the block ends; yields its scheduler name.

    Installs the PodGroup CRDs and the scheduler's RBAC (both stay: they are cluster-wide and idempotent)."""
    binary = cp.components["binaries"].get("scheduler-plugins")
    if not binary:
        raise RuntimeError("scripts/cluster/build.sh built no scheduler-plugins binary")
    cp.install_podgroup_crds()
    cp.apply(RBAC)
    kubeconfig = cp._component_kubeconfig(PROCESS, USER)
    config = cp.root / f"{PROCESS}.yaml"
    config.write_text(yaml.safe_dump(scheduler_config(str(kubeconfig))))
    port = free_port()
    process = cp._spawn(
        PROCESS,
        [
            binary,
            f"--config={config}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={cp.root / PROCESS}",
            # A gang that Coscheduling turned down is tried again on a new pod or a PodGroup change only; the
            # PodGroup changes come from scheduler-plugins' controller (its status), which does not run here. So
            # pods it could not place are retried at the queue's next flush (every 30 s) instead of after 5 minutes.
            f"--pod-max-in-unschedulable-pods-duration={RETRY_SECONDS}s",
            "--v=2",
        ],
    )
    try:
        _wait_healthy(f"https://127.0.0.1:{port}/healthz", process.alive, process.tail, timeout)
        yield SCHEDULER_NAME
    finally:
        process.stop()
        cp.processes.pop(PROCESS, None)


def _wait_healthy(url: str, alive: Callable[[], bool], tail: Callable[[], str], timeout: float) -> None:
    """Until ``url`` answers 200; fails at once if the process exits."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate; only the answer matters
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{PROCESS} exited:\n{tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, context=context, timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{PROCESS} not healthy after {timeout:g} s:\n{tail()}")


def millicores(quantity: str) -> int:
    """A CPU quantity (``"2"``, ``"500m"``, ``"1.5"``) in millicores."""
    return int(quantity[:-1]) if quantity.endswith("m") else round(float(quantity) * 1000)


def requested_cpu(cp: ControlPlane, node: str) -> int:
    """Millicores that the unfinished pods on ``node`` request (what the scheduler counts as used)."""
    import kubernetes.client

    with cp.client() as api:
        pods = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}"
        ).items
    total = 0
    for pod in pods:
        if pod.status.phase in ("Succeeded", "Failed"):
            continue
        total += sum(millicores(str(((c.resources and c.resources.requests) or {}).get("cpu", "0")))
                     for c in pod.spec.containers)
    return total


def cpu_for_slots(cp: ControlPlane, node: str, slots: int) -> str:
    """A CPU request of which exactly ``slots`` more pods fit on ``node`` (its allocatable less what its pods
    request now): the node's real size decides, as a smaller machine would."""
    import kubernetes.client

    with cp.client() as api:
        allocatable = kubernetes.client.CoreV1Api(api).read_node(node).status.allocatable or {}
    free = millicores(str(allocatable["cpu"])) - requested_cpu(cp, node)
    each = free // (slots + 0.5)  # slots fit; slots + 1 leave half a pod's worth short
    assert each >= 100, f"node {node} has {free}m CPU free, too little for {slots} pods"
    return f"{int(each)}m"
