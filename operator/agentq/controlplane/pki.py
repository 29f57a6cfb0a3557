"""Certificates, keys and the admin kubeconfig of the embedded control plane.

Everything is generated fresh for each cluster in its state directory: a CA,
the API server's serving certificate (loopback names only), a client
certificate in ``system:masters`` for the admin kubeconfig, and the
service-account signing key pair. ECDSA P-256 keeps generation fast.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any dev or test cluster, short enough to not pretend to be production.
_VALIDITY = datetime.timedelta(days=365)
SERVICE_IP = "10.0.0.1"  # the first address of the service range given to the API server


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _cert(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool = False,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server_names or server_ips:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path) -> Pki:
    """Write a fresh CA, serving and admin certificates and SA keys into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
    )
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentq-local-ca")])
    ca = _cert(subject=ca_name, key=ca_key, issuer=ca_name, issuer_key=ca_key, ca=True)
    _write(pki.ca_key, _pem_key(ca_key))
    _write(pki.ca_cert, ca.public_bytes(serialization.Encoding.PEM))

    serving_key = _key()
    serving = _cert(
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        key=serving_key,
        issuer=ca_name,
        issuer_key=ca_key,
        server_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        server_ips=("127.0.0.1", SERVICE_IP),
    )
    _write(pki.serving_key, _pem_key(serving_key))
    _write(pki.serving_cert, serving.public_bytes(serialization.Encoding.PEM))

    admin_key = _key()
    admin = _cert(
        subject=x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "agentq-admin"),
            ]
        ),
        key=admin_key,
        issuer=ca_name,
        issuer_key=ca_key,
        client=True,
    )
    _write(pki.admin_key, _pem_key(admin_key))
    _write(pki.admin_cert, admin.public_bytes(serialization.Encoding.PEM))

    sa_key = _key()
    _write(pki.sa_key, _pem_key(sa_key))
    _write(
        pki.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return pki


def write_kubeconfig(path: Path, *, server: str, pki: Pki, name: str = "agentq-local") -> None:
    """Write a self-contained admin kubeconfig (certificates embedded) to ``path``."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": f"{name}-admin",
                "user": {
                    "client-certificate-data": b64(pki.admin_cert),
                    "client-key-data": b64(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": name, "user": f"{name}-admin", "namespace": "default"},
            }
        ],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
