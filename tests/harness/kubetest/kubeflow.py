"""Kubeflow Trainer's own controller manager (v2.1.0, or the current release with ``build.sh --current``; built
unmodified by ``scripts/cluster/build.sh``) on the test control plane, so that trainjob's operator can be compared
with it on the same inputs.

It runs as it does in a cluster, with what its project publishes:

- as its ServiceAccount ``kubeflow-system/kubeflow-trainer-controller-manager``, bound to the ClusterRole of
  ``manifests/base/rbac/role.yaml``;
- with its configuration file (``config.trainer.kubeflow.org/v1alpha1``): leader election off, its own certificate
  management off (that rotates a Secret for a Service's DNS name; here the test CA issues it), the webhook server
  on the host's address with that certificate (controller-runtime reads it from
  ``$TMPDIR/k8s-webhook-server/serving-certs``), metrics off;
- with its validating webhooks (``manifests/base/webhook/manifests.yaml``) registered while it runs, reached as in
  a cluster through its Service ``kubeflow-system/kubeflow-trainer-controller-manager``
  (:meth:`ControlPlane.webhook_service`), so every TrainJob and runtime created meanwhile passes Kubeflow's own
  validation.

Both controllers claim TrainJobs without ``spec.managedBy``, so they must not run at the same time: stop
trainjob's operator before :meth:`KubeflowController.start` and start it again after :meth:`stop`.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
from pathlib import Path
from typing import Any

import yaml

from kubetest.controlplane import KUBEFLOW_ACCOUNT, KUBEFLOW_NAMESPACE, ControlPlane, Process, free_port

#: The names its webhook configurations are registered under (v2.1.0 has the validating one; v2.3.0 both).
WEBHOOK_CONFIGURATIONS = {"ValidatingWebhookConfiguration": "kubeflow-trainer-validator",
                          "MutatingWebhookConfiguration": "kubeflow-trainer-mutator"}
#: The Service Kubeflow's manifests put in front of its controller manager (webhooks on port 443).
WEBHOOK_SERVICE = "kubeflow-trainer-controller-manager"


#: Where Kubeflow Trainer v2.3's status server reads its certificate (a fixed path, unlike the webhook server's).
STATUS_SERVER_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
#: The Secret its ``TrainJobStatus`` plugin reads the CA from (``certManagement.webhookSecretName``'s default).
WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"
#: Where a pod's ServiceAccount files are mounted (``/var/run/secrets``), and the API server's Service address.
SECRETS_MOUNT = Path("/run/secrets")
API_SERVICE_IP = "10.96.0.1"


class KubeflowController:
    """``trainer-controller-manager`` as a child process of the test, on the control plane ``cp``.

    ``feature_gates`` (``{"TrainJobStatus": True}``) go to its ``--feature-gates``. With ``TrainJobStatus`` (v2.2
    and later, alpha, off by default) it also serves its status endpoint, on a port of this host with the test CA's
    certificate, and the Secret its plugin copies the CA from is made: every TrainJob then gets a ConfigMap with the
    CA and its pods the status client's variables and volume, as trainjob's operator always gives them."""

    def __init__(self, cp: ControlPlane, feature_gates: dict[str, bool] | None = None) -> None:
        self.cp = cp
        self.feature_gates = dict(feature_gates or {})
        self.process: Process | None = None
        self._status_cert_dir: Path | None = None
        self._made_secrets_mount = False

    @property
    def binary(self) -> str:
        return str(self.cp.components["binaries"]["kubeflow-trainer"])

    def start(self, timeout: float = 90.0) -> None:
        assert self.process is None or not self.process.alive(), "Kubeflow's controller runs already"
        cp = self.cp
        role = yaml.safe_load(cp.manifests("kubeflow", "rbac-role.yaml").read_text())
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role["metadata"]["name"]},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": KUBEFLOW_ACCOUNT, "namespace": KUBEFLOW_NAMESPACE}],
        }
        cp.apply([role, binding])
        account = cp.service_account_kubeconfig(KUBEFLOW_NAMESPACE, KUBEFLOW_ACCOUNT)

        tmp = cp.root / "kubeflow-tmp"
        cert_dir = tmp / "k8s-webhook-server" / "serving-certs"
        webhook_port, probe_port = free_port(), free_port()
        cp.webhook_service(KUBEFLOW_NAMESPACE, WEBHOOK_SERVICE, webhook_port, cert_dir)
        config = {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "certManagement": {"enable": False},
            "webhook": {"port": webhook_port, "host": cp.host_address},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        }
        config_path = cp.root / "kubeflow-config.yaml"
        argv = [self.binary, f"--kubeconfig={account}", f"--config={config_path}", "--zap-log-level=info"]
        if self.feature_gates:
            argv.append("--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in self.feature_gates.items()))
        if self.feature_gates.get("TrainJobStatus"):
            config["statusServer"] = {"port": free_port()}
            self._serve_status(cert_dir)
            argv = self._as_in_a_pod(account, argv)
        config_path.write_text(yaml.safe_dump(config))
        self.process = cp._spawn("kubeflow-trainer", argv, env={"TMPDIR": str(tmp)})
        try:
            cp._wait_http(f"http://127.0.0.1:{probe_port}/readyz", "kubeflow-trainer", timeout=timeout)
            cp.wait_for_service_route(KUBEFLOW_NAMESPACE, WEBHOOK_SERVICE)
            cp.apply(self._webhooks())
        except BaseException:
            self.stop()
            raise

    def _serve_status(self, cert_dir: Path) -> None:
        """The status server's certificate where it reads it, and the CA's Secret its plugin reads."""
        if STATUS_SERVER_CERT_DIR.exists():
            raise RuntimeError(f"{STATUS_SERVER_CERT_DIR} exists already (another Kubeflow controller on this host?); "
                               "its status server reads its certificate there")
        STATUS_SERVER_CERT_DIR.mkdir(parents=True)
        self._status_cert_dir = STATUS_SERVER_CERT_DIR
        for name in ("tls.crt", "tls.key"):
            shutil.copy(cert_dir / name, STATUS_SERVER_CERT_DIR / name)
        data = {"ca.crt": Path(self.cp.ca.cert_path).read_bytes(), "tls.crt": (cert_dir / "tls.crt").read_bytes(),
                "tls.key": (cert_dir / "tls.key").read_bytes()}
        self.cp.apply([{"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                        "metadata": {"name": WEBHOOK_SECRET, "namespace": KUBEFLOW_NAMESPACE},
                        "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}])

    def _as_in_a_pod(self, account: Path, argv: list[str]) -> list[str]:
        """``argv`` run in a mount namespace of its own that has what a pod has and the status server reads: its
        ServiceAccount's token in ``/var/run/secrets/kubernetes.io/serviceaccount`` (whose issuer it discovers)
        and the name ``kubernetes.default.svc`` (that issuer, the API server's Service). Nothing of it is seen
        outside that process; ``/run/secrets``, its mount point, is made here if missing and removed by
        :meth:`stop`."""
        folder = self.cp.root / "kubeflow-serviceaccount"
        folder.mkdir(exist_ok=True)
        user = yaml.safe_load(account.read_text())["users"][0]["user"]
        (folder / "token").write_text(user["token"])
        (folder / "namespace").write_text(KUBEFLOW_NAMESPACE)
        shutil.copy(self.cp.ca.cert_path, folder / "ca.crt")
        hosts = self.cp.root / "kubeflow-hosts"
        hosts.write_text(Path("/etc/hosts").read_text() + f"\n{API_SERVICE_IP} kubernetes.default.svc\n")
        if not SECRETS_MOUNT.exists():
            SECRETS_MOUNT.mkdir()
            self._made_secrets_mount = True
        script = (f"mount -t tmpfs tmpfs {SECRETS_MOUNT} && mkdir -p {SECRETS_MOUNT}/kubernetes.io/serviceaccount && "
                  f'mount --bind "$1" {SECRETS_MOUNT}/kubernetes.io/serviceaccount && mount --bind "$2" /etc/hosts && '
                  'shift 2 && exec "$@"')
        # unshare and sh exec what follows: the process measured is the controller's
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(folder), str(hosts),
                *argv]

    def _webhooks(self) -> list[dict[str, Any]]:
        configs = [d for d in yaml.safe_load_all(self.cp.manifests("kubeflow", "webhooks.yaml").read_text()) if d]
        for config in configs:
            config["metadata"] = {"name": WEBHOOK_CONFIGURATIONS[config["kind"]]}
            for hook in config["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = self.cp.webhook_client_config(KUBEFLOW_NAMESPACE, WEBHOOK_SERVICE, path)
        return configs

    def stop(self) -> None:
        """Unregister the webhooks (they fail closed) and stop the process."""
        import kubernetes.client

        with self.cp.client() as api:
            admission = kubernetes.client.AdmissionregistrationV1Api(api)
            with contextlib.suppress(kubernetes.client.ApiException):
                admission.delete_validating_webhook_configuration(
                    WEBHOOK_CONFIGURATIONS["ValidatingWebhookConfiguration"])
            with contextlib.suppress(kubernetes.client.ApiException):
                admission.delete_mutating_webhook_configuration(WEBHOOK_CONFIGURATIONS["MutatingWebhookConfiguration"])
        if self.process is not None:
            self.process.stop()
            self.cp.processes.pop("kubeflow-trainer", None)
        if self._status_cert_dir is not None:
            shutil.rmtree(self._status_cert_dir.parent, ignore_errors=True)  # /tmp/k8s-webhook-server
            self._status_cert_dir = None
        if self._made_secrets_mount:
            with contextlib.suppress(OSError):
                SECRETS_MOUNT.rmdir()
            self._made_secrets_mount = False

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def tail(self, chars: int = 4000) -> str:
        return self.process.tail(chars) if self.process is not None else ""

    @property
    def audit_user(self) -> str:
        return f"system:serviceaccount:{KUBEFLOW_NAMESPACE}:{KUBEFLOW_ACCOUNT}"

