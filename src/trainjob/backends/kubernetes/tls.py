"""The serving certificate of the operator's status endpoint (:mod:`.status_server`), and the CA pods trust it by.

The operator keeps a self-signed CA and a serving certificate for its status endpoint's host names in the Secret
``trainjob-operator-status-tls`` of its namespace (``ca.crt``, ``tls.crt``, ``tls.key``), created by the first
replica that starts, so every replica serves the same certificate and a restart changes nothing the running pods
hold. The pods receive ``ca.crt`` from ConfigMap ``trainjob-status-ca`` of their namespace, which their status-client
volume projects (:class:`.status_server.NamespaceCA`)::

    tls = load_or_create_serving_tls(api, "trainjob-system", ["trainjob-operator.trainjob-system.svc"])
    context = tls.server_context()     # ssl.SSLContext for the HTTPS server
    tls.ca_pem                         # what the pods verify the server with

A Secret whose certificate does not name every host asked for is issued again from the same CA (the pods' CA
stays valid). The names a certificate was issued for are noted on the Secret (:data:`NAMES_ANNOTATION`, with the
certificate's digest), so a restart reads them there rather than loading ``cryptography`` (12 MiB of the operator's
memory, with its libraries) to parse the certificate; a certificate put there by hand (its digest differs) is parsed.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainjob.backends.kubernetes.kubeapi import ApiError
from trainjob.backends.kubernetes.resources import SECRETS
from trainjob.errors import AlreadyExistsError, BackendError

if TYPE_CHECKING:
    from trainjob.backends.kubernetes.kubeapi import KubeApi

TLS_SECRET = "trainjob-operator-status-tls"
#: The Secret's annotation ``<sha256 of tls.crt>:<name>,<name>...``: the names its serving certificate holds.
NAMES_ANNOTATION = "trainjob/serving-names"
_VALID_DAYS = 3650


@dataclass(frozen=True)
class ServingTLS:
    """PEM texts of the CA, the serving certificate and its key."""

    ca_pem: str
    cert_pem: str
    key_pem: str

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as tmp:  # ssl loads a chain from files only
            cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
            with open(cert, "w") as f:
                f.write(self.cert_pem)
            with open(key, "w") as f:
                f.write(self.key_pem)
            os.chmod(key, 0o600)
            context.load_cert_chain(cert, key)
        return context

    def names(self) -> set[str]:
        """The DNS names and IP addresses the serving certificate is valid for."""
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.cert_pem.encode())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}


def _digest(cert_pem: str) -> str:
    return hashlib.sha256(cert_pem.encode()).hexdigest()


def names_note(cert_pem: str, names: set[str]) -> str:
    """The :data:`NAMES_ANNOTATION` of a certificate issued for ``names``."""
    return f"{_digest(cert_pem)}:{','.join(sorted(names))}"


def noted_names(note: str | None, cert_pem: str) -> set[str] | None:
    """The names ``note`` gives for ``cert_pem``; ``None`` when it is missing or was written for another
    certificate."""
    digest, _, names = (note or "").partition(":")
    if not names or digest != _digest(cert_pem):
        return None
    return set(names.split(","))


def _name(common_name: str):  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Sequence[str]):  # type: ignore[no-untyped-def]
    from cryptography import x509

    entries: list[x509.GeneralName] = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(entries)


def _pem_key(key) -> str:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def issue(hosts: Sequence[str], ca_pem: str | None = None, ca_key_pem: str | None = None) -> tuple[ServingTLS, str]:
    """A serving certificate for ``hosts`` signed by the given CA (a new one when ``None``); the TLS texts and the
    CA's key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    now = datetime.datetime.now(datetime.UTC)
    if ca_pem is None or ca_key_pem is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(_name("trainjob-operator-ca")).issuer_name(_name(
            "trainjob-operator-ca")).public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(
                days=_VALID_DAYS)).add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(ca_key, hashes.SHA256()))
        ca_pem, ca_key_pem = ca.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(ca_key)
    ca_cert = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(
                days=_VALID_DAYS)).add_extension(_san(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    tls = ServingTLS(ca_pem, cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))
    return tls, ca_key_pem


def load_or_create_serving_tls(api: KubeApi, namespace: str, hosts: Sequence[str]) -> ServingTLS:
    """The status endpoint's TLS from Secret ``namespace/trainjob-operator-status-tls``: created when missing,
    its serving certificate issued again (same CA) when it does not name every one of ``hosts``."""
    def decoded(data: dict[str, str], key: str) -> str:
        return base64.b64decode(data[key]).decode()

    def body(tls: ServingTLS, ca_key_pem: str, names: set[str],
             resource_version: str | None = None) -> dict[str, object]:
        meta: dict[str, object] = {"name": TLS_SECRET, "namespace": namespace,
                                   "annotations": {NAMES_ANNOTATION: names_note(tls.cert_pem, names)}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        texts = {"ca.crt": tls.ca_pem, "ca.key": ca_key_pem, "tls.crt": tls.cert_pem, "tls.key": tls.key_pem}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in texts.items()}}

    for _ in range(3):
        try:
            secret = api.read_secret(namespace, TLS_SECRET)
        except ApiError as exc:
            raise BackendError(f"cannot read Secret {namespace}/{TLS_SECRET} (the status endpoint's TLS): "
                               f"{exc}") from exc
        if secret is None:
            tls, ca_key_pem = issue(hosts)
            try:
                api.create(body(tls, ca_key_pem, set(hosts)), SECRETS)
                return tls
            except AlreadyExistsError:  # another replica made it first; use that one
                continue
            except ApiError as exc:
                raise BackendError(f"cannot create Secret {namespace}/{TLS_SECRET}: {exc}") from exc
        data = secret.get("data") or {}
        try:
            tls = ServingTLS(decoded(data, "ca.crt"), decoded(data, "tls.crt"), decoded(data, "tls.key"))
            ca_key_pem = decoded(data, "ca.key")
        except (KeyError, ValueError) as exc:
            raise BackendError(f"Secret {namespace}/{TLS_SECRET} lacks {exc}; delete it to have it made again") from exc
        note = ((secret["metadata"].get("annotations") or {}).get(NAMES_ANNOTATION))
        names = noted_names(note, tls.cert_pem)
        if names is None:  # made before the names were noted, or by hand: parse it (and note it for next time)
            names = tls.names()
            with contextlib.suppress(ApiError):
                api.patch(SECRETS, namespace, TLS_SECRET,
                          {"metadata": {"annotations": {NAMES_ANNOTATION: names_note(tls.cert_pem, names)}}})
        if set(hosts) <= names:
            return tls
        names = set(hosts) | names
        tls, _ = issue(sorted(names), tls.ca_pem, ca_key_pem)
        try:
            if api.replace(body(tls, ca_key_pem, names, secret["metadata"].get("resourceVersion")),
                           SECRETS) is not None:
                return tls
        except ApiError as exc:
            if exc.status != 409:  # 409: changed meanwhile; read it again
                raise BackendError(f"cannot update Secret {namespace}/{TLS_SECRET}: {exc}") from exc
    raise BackendError(f"cannot read or create Secret {namespace}/{TLS_SECRET}")
