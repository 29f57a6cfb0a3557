"""Test certificates for the claim port's TLS: a CA, and serving certificates it signs
(valid, expired, for another name), as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentq.controlplane.pki import issue_cert, new_key, pem_key

SERVICE_NAME = "agentq-operator-claims.agentq-system.svc"


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass
class Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, name: str = "agentq-test-ca") -> Ca:
        key = new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = issue_cert(
            subject=subject,
            key=key,
            issuer=subject,
            issuer_key=key,
            ca=True,
            not_before=now - datetime.timedelta(days=1),
            not_after=now + datetime.timedelta(days=30),
        )
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.pem)
        return path

    def serving(
        self,
        names: tuple[str, ...] = (SERVICE_NAME, "127.0.0.1"),
        *,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
    ) -> tuple[bytes, bytes]:
        """``(certificate PEM, key PEM)`` of a serving certificate for ``names`` (DNS
        names, or IP addresses)."""
        key = new_key()
        now = datetime.datetime.now(datetime.UTC)
        ips = tuple(n for n in names if _is_ip(n))
        cert = issue_cert(
            subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]),
            key=key,
            issuer=self.cert.subject,
            issuer_key=self.key,
            server_names=tuple(n for n in names if n not in ips),
            server_ips=ips,
            not_before=not_before or now - datetime.timedelta(hours=1),
            not_after=not_after or now + datetime.timedelta(days=7),
        )
        return cert.public_bytes(serialization.Encoding.PEM), pem_key(key)

    def write_serving(
        self,
        cert_path: Path,
        key_path: Path,
        names: tuple[str, ...] = (SERVICE_NAME, "127.0.0.1"),
        *,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
    ) -> None:
        cert, key = self.serving(names, not_before=not_before, not_after=not_after)
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)


__all__ = ["SERVICE_NAME", "Ca"]
