"""Kueue on the test cluster: its controller manager (``sigs.k8s.io/kueue``, built unmodified by
``scripts/cluster/build.sh``) with the TrainJob integration, run as Kueue's manifests install it:

- as its ServiceAccount ``kueue-system/kueue-controller-manager``, bound to the ClusterRole of
  ``config/components/rbac/role.yaml`` and to the Role of ``manager_secrets_role.yaml`` in its namespace;
- with its configuration file (``config.kueue.x-k8s.io/v1beta2``): the ``trainer.kubeflow.org/trainjob``
  integration, leader election off, its own certificate management off (that rotates a Secret; here the test CA
  signs the certificate of its webhook Service's DNS name), the webhook server on the host's address behind its
  Service ``kueue-webhook-service`` (:meth:`ControlPlane.webhook_service`), as JobSet's is;
- its metrics certificate where Kueue reads one when it does not manage certificates
  (``/etc/kueue/metrics/certs``, mounted from a Secret by its cert-manager install): here a private mount namespace
  overlays ``/etc`` for that one process, with the files in the test's directory (nothing on the host changes);
- its mutating and validating webhooks (``config/components/webhook/manifests.yaml``) for its own kinds and for
  TrainJobs, registered through that Service while it runs. The webhooks of the integrations not enabled here (pods, batch Jobs)
  are left out: they fail closed, and would refuse every pod once Kueue stops.

``VisibilityOnDemand`` (an aggregated API server of its own) is off: there is no aggregation layer route here.

    with kueue_controller(cp):
        k8s.kubectl("apply", "-f", queues_yaml)   # ResourceFlavor, ClusterQueue, LocalQueue
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import yaml

from kubetest.controlplane import ControlPlane, free_port

NAMESPACE = "kueue-system"
ACCOUNT = "kueue-controller-manager"
PROCESS = "kueue"
FRAMEWORKS = ["trainer.kubeflow.org/trainjob"]
#: The Service its webhooks are reached through (the name its manifests give it).
WEBHOOK_SERVICE = "kueue-webhook-service"
#: The webhook configurations registered while Kueue runs.
WEBHOOK_CONFIGURATIONS = {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
                          "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"}
#: Webhooks for these API groups are registered (Kueue's own kinds, and TrainJobs).
WEBHOOK_GROUPS = {"kueue.x-k8s.io", "trainer.kubeflow.org"}


def configuration(webhook_host: str, webhook_port: int, probe_port: int, cert_dir: str) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": webhook_host, "certDir": cert_dir},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": FRAMEWORKS},
    }


def webhooks(cp: ControlPlane) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for :data:`WEBHOOK_GROUPS`, through its webhook Service."""
    configs = []
    for config in yaml.safe_load_all(cp.manifests("kueue", "webhooks.yaml").read_text()):
        if not config:
            continue
        kept = []
        for hook in config["webhooks"]:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups & WEBHOOK_GROUPS:
                continue
            hook["clientConfig"] = cp.webhook_client_config(NAMESPACE, WEBHOOK_SERVICE,
                                                            hook["clientConfig"]["service"]["path"])
            kept.append(hook)
        config["metadata"] = {"name": WEBHOOK_CONFIGURATIONS[config["kind"]]}
        config["webhooks"] = kept
        configs.append(config)
    return configs


def install_crds(cp: ControlPlane) -> None:
    """Kueue's CRDs, as its project publishes them (they stay: cluster-wide and idempotent)."""
    crds = [yaml.safe_load(p.read_text()) for p in sorted(cp.manifests("kueue").glob("kueue.x-k8s.io_*.yaml"))]
    cp.apply(crds)
    cp.wait_for_crds([c["metadata"]["name"] for c in crds])


@contextlib.contextmanager
def kueue_controller(cp: ControlPlane, timeout: float = 120.0) -> Iterator[None]:
    """Kueue's controller manager, running (ready, webhooks registered) until the block ends."""
    binary = cp.components["binaries"].get("kueue")
    if not binary:
        raise RuntimeError("scripts/cluster/build.sh built no kueue binary")
    install_crds(cp)
    role = yaml.safe_load(cp.manifests("kueue", "rbac-role.yaml").read_text())
    role["metadata"] = {"name": "kueue-manager-role"}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kueue-manager-rolebinding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
    }
    # Its Secrets in its own namespace (the certificates it would rotate; its cache waits to list them).
    secrets_role = yaml.safe_load(cp.manifests("kueue", "rbac-secrets-role.yaml").read_text())
    secrets_role["metadata"] = {"name": "kueue-manager-secrets-role", "namespace": NAMESPACE}
    secrets_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "kueue-manager-secrets-rolebinding", "namespace": NAMESPACE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": secrets_role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
    }
    cp.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, role, binding,
              secrets_role, secrets_binding])
    account = cp.service_account_kubeconfig(NAMESPACE, ACCOUNT)

    root = cp.root / PROCESS
    cert_dir = root / "webhook-certs"
    metrics_dir = root / "etc-upper" / "kueue" / "metrics" / "certs"
    for directory in (cert_dir, metrics_dir, root / "etc-work"):
        directory.mkdir(parents=True, exist_ok=True)
    webhook_port, probe_port = free_port(), free_port()
    cp.webhook_service(NAMESPACE, WEBHOOK_SERVICE, webhook_port, cert_dir)
    for name in ("tls.crt", "tls.key"):
        shutil.copy(cert_dir / name, metrics_dir / name)
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(configuration(cp.host_address, webhook_port, probe_port, str(cert_dir))))
    overlay = f"lowerdir=/etc,upperdir={root / 'etc-upper'},workdir={root / 'etc-work'}"
    process = cp._spawn(
        PROCESS,
        [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t overlay kueue-etc -o "{overlay}" /etc && exec "$0" "$@"',
            binary,
            f"--kubeconfig={account}",
            f"--config={config_path}",
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ],
    )
    registered = False
    try:
        cp._wait_http(f"http://127.0.0.1:{probe_port}/readyz", PROCESS, timeout=timeout)
        cp.wait_for_service_route(NAMESPACE, WEBHOOK_SERVICE)
        cp.apply(webhooks(cp))
        registered = True
        yield
    finally:
        if registered:
            _unregister(cp)
        process.stop()
        cp.processes.pop(PROCESS, None)


def _unregister(cp: ControlPlane) -> None:
    import kubernetes.client

    with cp.client() as api:
        admission = kubernetes.client.AdmissionregistrationV1Api(api)
        with contextlib.suppress(kubernetes.client.ApiException):
            admission.delete_mutating_webhook_configuration(WEBHOOK_CONFIGURATIONS["MutatingWebhookConfiguration"])
        with contextlib.suppress(kubernetes.client.ApiException):
            admission.delete_validating_webhook_configuration(
                WEBHOOK_CONFIGURATIONS["ValidatingWebhookConfiguration"])
