"""The operator's own client for the Kubernetes API (:mod:`trainjob.backends.kubernetes.rest`): which credentials
it reads from a kubeconfig or a pod, and its requests over real TLS on loopback (a CA and serving certificate
issued as the status endpoint's are), with :class:`KubeApi` on top."""

from __future__ import annotations

import base64
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob.backends.kubernetes.config import KubernetesBackendConfig
from trainjob.backends.kubernetes.kubeapi import ApiError, KubeApi
from trainjob.backends.kubernetes.resources import TRAINJOBS
from trainjob.backends.kubernetes.rest import RestClient, RestConfig, RestError, rest_config
from trainjob.backends.kubernetes.tls import ServingTLS, issue


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/",
                                                          "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}},
                     {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}],
    }))
    return str(path)


def test_a_kubeconfig_with_a_client_certificate_is_read_with_paths_relative_to_it(tmp_path: Path) -> None:
    pem = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    path = kubeconfig(tmp_path, {"client-certificate-data": pem, "client-key": "keys/u.key"})
    config = rest_config(KubernetesBackendConfig(config_file=path))
    assert config == RestConfig(host="https://10.0.0.1:6443", ca_file=str(tmp_path / "ca.crt"),
                                cert_pem=b"-----BEGIN CERTIFICATE-----\n", key_file=str(tmp_path / "keys/u.key"))


def test_a_token_and_an_insecure_cluster_with_its_ca_inline(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"tokenFile": "/run/token"},
                      {"server": "https://k:443", "certificate-authority-data": base64.b64encode(b"CA").decode(),
                       "insecure-skip-tls-verify": True})
    config = rest_config(KubernetesBackendConfig(config_file=path, context="other"))
    assert config == RestConfig(host="https://k:443", ca_pem="CA", insecure=True, token_file="/run/token")


@pytest.mark.parametrize("user", [
    {"exec": {"command": "aws", "args": ["eks", "get-token"]}},
    {"auth-provider": {"name": "oidc"}},
    {"username": "admin", "password": "secret"},
])
def test_credentials_of_other_kinds_are_left_to_the_kubernetes_client(tmp_path: Path, user: dict[str, Any]) -> None:
    assert rest_config(KubernetesBackendConfig(config_file=kubeconfig(tmp_path, user))) is None


def test_merged_or_unreadable_kubeconfigs_are_left_to_the_kubernetes_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert rest_config(KubernetesBackendConfig()) is None
    assert rest_config(KubernetesBackendConfig(config_file=str(tmp_path / "missing"))) is None
    path = kubeconfig(tmp_path, {"token": "t"})
    assert rest_config(KubernetesBackendConfig(config_file=path, context="nowhere")) is None


def test_in_a_pod_the_service_account_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = rest_config(KubernetesBackendConfig())
    assert config == RestConfig(host="https://[fd00::1]:443",
                                ca_file="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                                token_file="/var/run/secrets/kubernetes.io/serviceaccount/token")


class _ApiServer(BaseHTTPRequestHandler):
    """Answers as the API server does: a TrainJob named ``mnist``, a 404 ``Status`` for any other; each request
    is kept (method, path, headers, body)."""

    seen: list[tuple[str, str, dict[str, str], Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, dict(self.headers), body))
        if self.path.startswith("/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/mnist"):
            status, answer = 200, {"kind": "TrainJob", "metadata": {"name": "mnist"}}
        else:
            status, answer = 404, {"kind": "Status", "message": f"{self.path} not found", "code": 404}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = _answer  # noqa: N815 (http.server's names)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def api_server() -> Iterator[tuple[str, ServingTLS]]:
    tls, _ = issue(["127.0.0.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    server.socket = tls.server_context().wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_port}", tls
    server.shutdown()
    server.server_close()


def test_requests_carry_the_token_and_kube_api_reads_their_answers(
    api_server: tuple[str, ServingTLS], tmp_path: Path
) -> None:
    host, tls = api_server
    token = tmp_path / "token"
    token.write_text("rotated-token\n")
    client = RestClient(RestConfig(host=host, ca_pem=tls.ca_pem, token_file=str(token)), user_agent="test/1")
    counted: list[tuple[str, int | None]] = []
    client.on_response = lambda method, status: counted.append((method, status))
    api = KubeApi(client)
    _ApiServer.seen.clear()
    assert api.get(TRAINJOBS, "ml", "mnist") == {"kind": "TrainJob", "metadata": {"name": "mnist"}}
    assert api.get(TRAINJOBS, "ml", "gone") is None
    assert api.patch(TRAINJOBS, "ml", "mnist", {"metadata": {"labels": {"a": "b"}}}) is not None
    with pytest.raises(ApiError) as refused:
        api.list_pods("ml", "app=x")
    assert refused.value.status == 404
    assert str(refused.value) == ("cannot list pods app=x: the API server answered 404 Not Found: "
                                  "/api/v1/namespaces/ml/pods?labelSelector=app%3Dx not found")
    (method, path, headers, _), *_, (patch, _, patch_headers, body) = _ApiServer.seen[:3]
    assert (method, path) == ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/mnist")
    assert headers["Authorization"] == "Bearer rotated-token" and headers["User-Agent"] == "test/1"
    assert (patch, patch_headers["Content-Type"], body) == ("PATCH", "application/merge-patch+json",
                                                            {"metadata": {"labels": {"a": "b"}}})
    assert counted == [("GET", 200), ("GET", 404), ("PATCH", 200), ("GET", 404)]
    client.close()


def test_a_server_whose_certificate_the_ca_did_not_sign_is_not_talked_to(api_server: tuple[str, ServingTLS]) -> None:
    host, _ = api_server
    other, _ = issue(["127.0.0.1"])
    client = RestClient(RestConfig(host=host, ca_pem=other.ca_pem, token="t"))
    with pytest.raises(RestError) as refused:
        client.request("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/mnist")
    assert refused.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    with pytest.raises(ApiError, match="the Kubernetes API server is unreachable"):
        KubeApi(client).get(TRAINJOBS, "ml", "mnist")


def test_the_operator_process_runs_without_the_kubernetes_package(subprocesses: Any) -> None:
    """What ``trainjob operator`` does before it imports the operator when this client reads its credentials:
    the operator, its status endpoint and its metrics load neither the ``kubernetes`` package nor a web framework."""
    probe = ("import sys\n"
             "from trainjob.backends.kubernetes.rest import without_kubernetes_client\n"
             "assert without_kubernetes_client()\n"
             "import trainjob.backends.kubernetes.operator, trainjob.backends.kubernetes.status_server\n"
             "import trainjob.backends.kubernetes.metrics, trainjob.backends.kubernetes.tls\n"
             "print(sorted({m.split('.')[0] for m in sys.modules}\n"
             "             & {'kubernetes', 'kopf', 'aiohttp', 'starlette', 'uvicorn', 'torch'}))\n")
    done = subprocesses.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
