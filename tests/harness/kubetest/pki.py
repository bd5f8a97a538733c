"""The test cluster's certificates: one CA, serving certificates for loopback, client certificates per identity.

Kubernetes authenticates a client certificate as user ``CN`` in groups ``O``; the identities here are the ones a
kubeadm cluster gives its components (``system:kube-controller-manager``, ``system:kube-scheduler``,
``system:node:<name>`` in ``system:nodes``, an admin in ``system:masters``)::

    ca = CertificateAuthority.create(tmp / "pki")
    cert, key = ca.issue("apiserver", ips=["127.0.0.1"], dns=["kubernetes.default.svc"])
    cert, key = ca.issue("admin", organization="system:masters", client=True)
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_FOR = datetime.timedelta(days=2)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class CertificateAuthority:
    directory: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_path(self) -> Path:
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: Path) -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainjob-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        ca = cls(directory, cert, key)
        ca.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / "ca.key").write_bytes(_pem_key(key))
        return ca

    def issue(
        self,
        name: str,
        *,
        common_name: str | None = None,
        organization: str | None = None,
        ips: list[str] = (),  # type: ignore[assignment]
        dns: list[str] = (),  # type: ignore[assignment]
        client: bool = False,
    ) -> tuple[Path, Path]:
        """A certificate and key signed by this CA, written as ``name.crt`` / ``name.key``; serving unless ``client``."""
        key = _key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name or name)]
        if organization:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        sans += [x509.DNSName(d) for d in dns]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        key_path.chmod(0o600)
        return cert_path, key_path


def service_account_key(directory: Path) -> tuple[Path, Path]:
    """The RSA key pair that signs service-account tokens (``sa.key``, ``sa.pub``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(_pem_key(key))
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
