"""Certificates, keys and the admin kubeconfig of the embedded control plane.

Everything is generated fresh for each cluster in its state directory: a CA,
the API server's serving certificate (loopback names only), a client
certificate in ``system:masters`` for the admin kubeconfig, and the
service-account signing key pair, and for the aggregation layer a front-proxy CA
and the client certificate the API server proxies with. ECDSA P-256 keeps generation
fast.

With a local node (``up --node``) the same CA also issues the kubelet's client
certificate (``system:node:<name>`` in ``system:nodes``, which the Node
authorizer scopes to its own node), the kubelet's serving certificate (so the
API server verifies the kubelet it dials for logs and exec), the API server's
client certificate for the kubelet (so the kubelet needs no anonymous access)
and the scheduler's client certificate (``system:kube-scheduler``).
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
    # The aggregation layer (APIService-served APIs such as KEDA's external metrics): a
    # CA of its own, and the client certificate the API server presents to those servers
    # when it proxies a request (CN front-proxy-client, the only name they accept).
    front_proxy_ca_cert: Path | None = None
    front_proxy_client_cert: Path | None = None
    front_proxy_client_key: Path | None = None


FRONT_PROXY_CLIENT = "front-proxy-client"


def new_key() -> ec.EllipticCurvePrivateKey:
    """A P-256 key, the kind every certificate here carries."""
    return ec.generate_private_key(ec.SECP256R1())


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def issue_cert(
    *,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool = False,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> x509.Certificate:
    """A certificate of ``key`` for ``subject``, signed by ``issuer_key``: a CA's, a
    server's (its names and IPs) or a client's; valid from 5 minutes ago for a year
    unless ``not_before``/``not_after`` say otherwise."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after or now + _VALIDITY)
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


@dataclass(frozen=True)
class NodePki:
    """Paths of the certificates of a local node (all issued by the cluster's CA)."""

    kubelet_client_cert: Path
    kubelet_client_key: Path
    kubelet_serving_cert: Path
    kubelet_serving_key: Path
    apiserver_kubelet_client_cert: Path
    apiserver_kubelet_client_key: Path
    scheduler_cert: Path
    scheduler_key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = []
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _issue(
    ca: Pki,
    cert_path: Path,
    key_path: Path,
    subject: x509.Name,
    *,
    client: bool = False,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
) -> None:
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = new_key()
    cert = issue_cert(
        subject=subject,
        key=key,
        issuer=ca_cert.subject,
        issuer_key=ca_key,
        client=client,
        server_names=server_names,
        server_ips=server_ips,
    )
    _write(key_path, pem_key(key))
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))


def generate_node(
    directory: Path, ca: Pki, *, node_name: str, node_ips: tuple[str, ...]
) -> NodePki:
    """Issue the certificates of the local node ``node_name`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    node = NodePki(
        kubelet_client_cert=directory / "kubelet-client.crt",
        kubelet_client_key=directory / "kubelet-client.key",
        kubelet_serving_cert=directory / "kubelet.crt",
        kubelet_serving_key=directory / "kubelet.key",
        apiserver_kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        apiserver_kubelet_client_key=directory / "apiserver-kubelet-client.key",
        scheduler_cert=directory / "scheduler.crt",
        scheduler_key=directory / "scheduler.key",
    )
    _issue(
        ca,
        node.kubelet_client_cert,
        node.kubelet_client_key,
        _name(f"system:node:{node_name}", "system:nodes"),
        client=True,
    )
    _issue(
        ca,
        node.kubelet_serving_cert,
        node.kubelet_serving_key,
        _name(node_name),
        server_names=(node_name, "localhost"),
        server_ips=(*node_ips, "127.0.0.1"),
    )
    # The API server acts for users who already passed its own authorization; the
    # kubelet checks this identity by a SubjectAccessReview, which system:masters passes.
    _issue(
        ca,
        node.apiserver_kubelet_client_cert,
        node.apiserver_kubelet_client_key,
        _name("kube-apiserver-kubelet-client", "system:masters"),
        client=True,
    )
    _issue(ca, node.scheduler_cert, node.scheduler_key, _name("system:kube-scheduler"), client=True)
    return node


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
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_client_cert=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
    )
    ca_key = new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentq-local-ca")])
    ca = issue_cert(subject=ca_name, key=ca_key, issuer=ca_name, issuer_key=ca_key, ca=True)
    _write(pki.ca_key, pem_key(ca_key))
    _write(pki.ca_cert, ca.public_bytes(serialization.Encoding.PEM))

    serving_key = new_key()
    serving = issue_cert(
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
    _write(pki.serving_key, pem_key(serving_key))
    _write(pki.serving_cert, serving.public_bytes(serialization.Encoding.PEM))

    admin_key = new_key()
    admin = issue_cert(
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
    _write(pki.admin_key, pem_key(admin_key))
    _write(pki.admin_cert, admin.public_bytes(serialization.Encoding.PEM))

    # Its own CA: a client certificate of the cluster's CA must not pass for the proxy.
    fp_key = new_key()
    fp_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentq-front-proxy-ca")])
    fp_ca = issue_cert(subject=fp_name, key=fp_key, issuer=fp_name, issuer_key=fp_key, ca=True)
    assert pki.front_proxy_ca_cert and pki.front_proxy_client_cert and pki.front_proxy_client_key
    _write(pki.front_proxy_ca_cert, fp_ca.public_bytes(serialization.Encoding.PEM))
    proxy_key = new_key()
    proxy = issue_cert(
        subject=_name(FRONT_PROXY_CLIENT),
        key=proxy_key,
        issuer=fp_name,
        issuer_key=fp_key,
        client=True,
    )
    _write(pki.front_proxy_client_key, pem_key(proxy_key))
    _write(pki.front_proxy_client_cert, proxy.public_bytes(serialization.Encoding.PEM))

    sa_key = new_key()
    _write(pki.sa_key, pem_key(sa_key))
    _write(
        pki.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return pki


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    pki: Pki,
    name: str = "agentq-local",
    client: tuple[Path, Path] | None = None,
) -> None:
    """Write a self-contained kubeconfig (certificates embedded) to ``path``.

    The user is the admin, or ``client`` (certificate, key) when given.
    """
    client_cert, client_key = client or (pki.admin_cert, pki.admin_key)

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
                    "client-certificate-data": b64(client_cert),
                    "client-key-data": b64(client_key),
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
