"""The Kubernetes API over plain HTTPS (urllib3), for the operator: no ``kubernetes`` package in its process.

Once imported, the ``kubernetes`` package holds about 40 MiB of a process and takes half a second to load (some 800
modules of API models), for objects the operator never builds: it
speaks dicts. :class:`RestClient` sends the operator's requests itself when its credentials are of a kind read
here (:func:`rest_config`):

====================================================  =========================================================
where                                                 credentials
====================================================  =========================================================
in a pod (no kubeconfig, ``KUBERNETES_SERVICE_HOST``)  the service account's token (read again each minute: the
                                                      kubelet rotates it) and CA
a kubeconfig's context                                the cluster's ``server`` and CA (file or data, or
                                                      ``insecure-skip-tls-verify``); the user's client
                                                      certificate and key (files or data), ``token`` or
                                                      ``tokenFile``
====================================================  =========================================================

Any other kubeconfig (an ``exec`` plugin, an ``auth-provider``, several files in ``$KUBECONFIG``) goes through the
``kubernetes`` client, as the CLI and the SDK always do: :class:`ClientTransport` sends the same requests through
its ``ApiClient``. Either way a request is ``transport.request(method, path, ...)``, answered by a urllib3
response or :class:`RestError`::

    client = RestClient(rest_config(KubernetesBackendConfig()))
    response = client.request("GET", "/api/v1/namespaces/default/pods", query={"labelSelector": "app=x"})
    pods = json.loads(response.data)["items"]
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode

from trainjob.backends.kubernetes.config import KubernetesBackendConfig, _in_cluster

if TYPE_CHECKING:
    import kubernetes.client
    import urllib3

#: Where a pod's service account is mounted.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: How long a token read from a file is used before it is read again.
TOKEN_FILE_SECONDS = 60.0
_USER_KEYS = {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token", "tokenFile"}


class RestError(Exception):
    """The API server answered ``status`` (``0``: no answer: unreachable, refused, TLS), with ``reason`` and
    ``body`` (its ``Status`` object as text); the attributes the ``kubernetes`` client's ``ApiException`` has."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"({status}) {reason}: {body}" if status else body)
        self.status, self.reason, self.body = status, reason, body


class Transport(Protocol):
    """How :class:`~trainjob.backends.kubernetes.kubeapi.KubeApi` sends a request."""

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json", preload: bool = True,
                timeout: float | None = None, accept: str = "application/json") -> urllib3.BaseHTTPResponse: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RestConfig:
    """Where the API server is and who this process is to it."""

    host: str
    ca_file: str | None = None
    ca_pem: str | None = None
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    token_file: str | None = None


def rest_config(config: KubernetesBackendConfig) -> RestConfig | None:
    """The credentials ``config`` names, when they are of a kind :class:`RestClient` uses (the module's table);
    ``None`` for any other, or a kubeconfig that cannot be read (the ``kubernetes`` client then says why)."""
    if _in_cluster(config):
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        return RestConfig(host=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
                          ca_file=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt"),
                          token_file=os.path.join(SERVICE_ACCOUNT_DIR, "token"))
    path = config.config_file or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if os.pathsep in path:
        return None  # several files merged: the kubernetes client's rules
    path = os.path.expanduser(path)
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        context = _named(data.get("contexts"), config.context or data.get("current-context"))["context"]
        cluster = _named(data.get("clusters"), context["cluster"])["cluster"]
        user = (_named(data.get("users"), context["user"]) or {}).get("user") or {} if context.get("user") else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration, yaml.YAMLError):
        return None
    if set(user) - _USER_KEYS or set(cluster) - {"server", "certificate-authority", "certificate-authority-data",
                                                  "insecure-skip-tls-verify", "extensions"}:
        return None
    here = os.path.dirname(path)

    def file(value: str | None) -> str | None:
        return None if not value else value if os.path.isabs(value) else os.path.join(here, value)

    def data_of(key: str) -> bytes | None:
        return base64.b64decode(user[key]) if user.get(key) else None

    ca = cluster.get("certificate-authority-data")
    return RestConfig(
        host=str(cluster["server"]).rstrip("/"),
        ca_file=file(cluster.get("certificate-authority")),
        ca_pem=base64.b64decode(ca).decode() if ca else None,
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file(user.get("client-certificate")), key_file=file(user.get("client-key")),
        cert_pem=data_of("client-certificate-data"), key_pem=data_of("client-key-data"),
        token=user.get("token"), token_file=file(user.get("tokenFile")),
    )


def _named(entries: Any, name: Any) -> dict[str, Any]:
    return next(entry for entry in entries or [] if entry.get("name") == name)


class RestClient:
    """Requests to the API server of a :class:`RestConfig`, over a pool of ``maxsize`` connections (one per
    thread that talks at once: the reconciler's workers, the status endpoint). ``on_response(method, status)`` is
    called for each request (``status`` ``None`` when no answer came): the operator's request metrics."""

    def __init__(self, config: RestConfig, user_agent: str | None = None, maxsize: int = 16) -> None:
        import urllib3

        self.config = config
        self.user_agent = user_agent or "trainjob"
        self.on_response: Callable[[str, int | None], None] | None = None
        self._token_lock = threading.Lock()
        self._token: tuple[float, str | None] = (-1.0, None)
        context = ssl.create_default_context(cafile=config.ca_file, cadata=config.ca_pem)
        if config.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if config.cert_file or config.cert_pem:
            _load_client_certificate(context, config)
        self._pool = urllib3.PoolManager(num_pools=4, maxsize=maxsize, block=False, ssl_context=context,
                                         **({"cert_reqs": "CERT_NONE", "assert_hostname": False}
                                            if config.insecure else {}))

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json", preload: bool = True,
                timeout: float | None = None, accept: str = "application/json") -> urllib3.BaseHTTPResponse:
        """Send one request; the response (``preload=False``: its body not read yet, for a stream), or
        :class:`RestError` for an answer of 400 or more, or none."""
        import urllib3

        url = self.config.host + path + (f"?{urlencode(query, doseq=True)}" if query else "")
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        token = self._bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        code: int | None = None
        try:
            response = self._pool.request(method, url, body=data, headers=headers, preload_content=preload,
                                          timeout=urllib3.Timeout(connect=10.0, read=timeout))
            code = response.status
        except urllib3.exceptions.HTTPError as exc:
            raise RestError(0, "", f"cannot reach the API server at {self.config.host}: {exc}") from exc
        finally:
            if self.on_response is not None:
                self.on_response(method, code)
        if response.status >= 400:
            text = (response.data if preload else response.read()).decode(errors="replace")
            response.release_conn()
            raise RestError(response.status, response.reason or "", text)
        return response

    def close(self) -> None:
        self._pool.clear()

    def _bearer(self) -> str | None:
        if self.config.token_file is None:
            return self.config.token
        with self._token_lock:
            read_at, token = self._token
            if time.monotonic() - read_at > TOKEN_FILE_SECONDS or token is None:
                with open(self.config.token_file, encoding="utf-8") as f:
                    token = f.read().strip()
                self._token = (time.monotonic(), token)
            return token

    def bearer_token(self) -> str | None:
        """The token requests carry now (``None``: the client certificate is the credential)."""
        return self._bearer()


def _load_client_certificate(context: ssl.SSLContext, config: RestConfig) -> None:
    """The client certificate and key into ``context``; PEM data passes through files only this user can read,
    removed once loaded (:mod:`ssl` reads a chain from files alone)."""
    if config.cert_pem is None and config.key_pem is None:
        context.load_cert_chain(str(config.cert_file), config.key_file)
        return
    with tempfile.TemporaryDirectory(prefix="trainjob-client-") as scratch:
        paths = []
        for name, pem, given in (("tls.crt", config.cert_pem, config.cert_file),
                                 ("tls.key", config.key_pem, config.key_file)):
            if pem is None:
                paths.append(given)
                continue
            path = os.path.join(scratch, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(pem)
            paths.append(path)
        context.load_cert_chain(str(paths[0]), paths[1])


class ClientTransport:
    """:class:`Transport` over the ``kubernetes`` client's ``ApiClient`` (any kubeconfig it reads: exec plugins,
    auth providers, merged files): what the CLI and the SDK use."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.api_client = api_client

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json", preload: bool = True,
                timeout: float | None = None, accept: str = "application/json") -> urllib3.BaseHTTPResponse:
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            return self.api_client.call_api(  # type: ignore[no-any-return]
                path, method, query_params=list((query or {}).items()), header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
                _request_timeout=timeout)
        except ApiException as exc:
            status = exc.status if isinstance(exc.status, int) else 0
            raise RestError(status, str(exc.reason or ""), str(exc.body or exc.reason or exc)) from exc
        except Exception as exc:  # urllib3's own errors, before any answer
            import urllib3

            if isinstance(exc, urllib3.exceptions.HTTPError):
                raise RestError(0, "", f"cannot reach the API server: {exc}") from exc
            raise

    def close(self) -> None:
        self.api_client.close()


def load_client(config: KubernetesBackendConfig,
                user_agent: str | None = None) -> RestClient | kubernetes.client.ApiClient:
    """A :class:`RestClient` where :func:`rest_config` reads ``config``'s credentials, else the ``kubernetes``
    client's ``ApiClient`` (:func:`~trainjob.backends.kubernetes.config.load_api_client`, which says what is wrong
    with a kubeconfig it cannot read)."""
    rest = rest_config(config)
    if rest is not None:
        return RestClient(rest, user_agent)
    from trainjob.backends.kubernetes.config import load_api_client

    return load_api_client(config, user_agent=user_agent)


class _NoKubernetesClient:
    """A meta path finder that refuses the ``kubernetes`` package (see :func:`without_kubernetes_client`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "kubernetes" or name.startswith("kubernetes."):
            raise ModuleNotFoundError(f"No module named {name!r} (trainjob's operator talks through its own "
                                      "RestClient: trainjob.backends.kubernetes.rest)", name=name)


def without_kubernetes_client() -> bool:
    """Keep the ``kubernetes`` package out of this process from now on (the operator's, once :func:`rest_config`
    reads its credentials): about 40 MiB and half a second, for model objects the operator never builds, should
    anything it loads import the package when it is installed. ``False`` (nothing done) when it
    is imported already."""
    import sys

    if "kubernetes" in sys.modules:
        return False
    if not any(isinstance(finder, _NoKubernetesClient) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NoKubernetesClient())
    return True
