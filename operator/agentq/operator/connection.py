"""Where the API server is and how to authenticate to it: in-cluster, else a kubeconfig.

The operator talks to the API server with aiohttp (``agentq.operator.rest`` and
``agentq.operator.informer``), not with the kubernetes package: importing that
package's thousands of generated models costs ~60 MB of memory and its sync
client needs a thread per call. This module turns the usual sources of
credentials into what aiohttp needs: a base URL, an SSL context, and headers.

Supported: the in-cluster service account (token re-read from its file, since
bound tokens rotate), and kubeconfig users with client certificates, a bearer
token (inline or ``tokenFile``) or basic auth, CA and client material inline
(``*-data``) or in files. A kubeconfig user that needs an ``exec`` or
``auth-provider`` plugin is delegated to the kubernetes package's loader
(imported only then), which runs the plugin.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Bound service-account tokens are refreshed by the kubelet well before they expire;
# re-reading the file this often keeps a long-running operator authenticated.
TOKEN_REREAD_SECONDS = 60.0


class ConnectionError_(RuntimeError):
    """No usable way to reach the API server; the message says what was tried."""


@dataclass
class Connection:
    """How to reach the API server: ``server`` (no trailing slash), TLS and auth headers."""

    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None = None
    token_file: Path | None = None
    basic: tuple[str, str] | None = None
    _token_read_at: float = field(default=0.0, repr=False)

    def headers(self) -> dict[str, str]:
        """Authorization headers for the next request (re-reads a token file now and then)."""
        if self.token_file is not None:
            now = time.monotonic()
            if self.token is None or now - self._token_read_at > TOKEN_REREAD_SECONDS:
                self.token = self.token_file.read_text().strip()
                self._token_read_at = now
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.basic is not None:
            raw = f"{self.basic[0]}:{self.basic[1]}".encode()
            return {"Authorization": f"Basic {base64.b64encode(raw).decode()}"}
        return {}


def _material(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    """A kubeconfig file reference (``key``) or inline base64 data (``key-data``)."""
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = entry.get(key)
    if path:
        p = Path(path)
        return (p if p.is_absolute() else base / p).read_bytes()
    return None


def _ssl_context(
    *, ca: bytes | None, cert: bytes | None, key: bytes | None, insecure: bool
) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca is not None:
        context.load_verify_locations(cadata=ca.decode())
    if cert is not None and key is not None:
        # load_cert_chain only reads files: write the material to a private temporary
        # directory just long enough to load it.
        with tempfile.TemporaryDirectory(prefix="agentq-tls-") as tmp:
            cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert_path.write_bytes(cert)
            key_path.write_bytes(key)
            os.chmod(key_path, 0o600)
            context.load_cert_chain(str(cert_path), str(key_path))
    return context


def in_cluster() -> Connection | None:
    """The pod's service account, if we run in a pod."""
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    token_file = SERVICE_ACCOUNT_DIR / "token"
    if not host or not port or not token_file.exists():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca = (SERVICE_ACCOUNT_DIR / "ca.crt").read_bytes()
    return Connection(
        server=f"https://{host}:{port}",
        ssl_context=_ssl_context(ca=ca, cert=None, key=None, insecure=False),
        token_file=token_file,
    )


def from_kubeconfig(path: str | Path | None = None, *, context: str | None = None) -> Connection:
    """The connection a kubeconfig's (current) context describes."""
    if path is None:
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(
            Path.home() / ".kube" / "config"
        )
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ConnectionError_(f"cannot read kubeconfig {path}: {err}") from err
    name = context or config.get("current-context")
    ctx = _named(config, "contexts", name, "context")
    cluster = _named(config, "clusters", ctx.get("cluster"), "cluster")
    user = _named(config, "users", ctx.get("user"), "user") if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        return _via_kubernetes_package(path, name)
    base = path.parent
    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise ConnectionError_(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    token = user.get("token")
    token_file = Path(user["tokenFile"]) if user.get("tokenFile") else None
    basic = (str(user["username"]), str(user.get("password", ""))) if user.get("username") else None
    context_ssl: ssl.SSLContext | bool = True
    if server.startswith("https://"):
        context_ssl = _ssl_context(
            ca=_material(cluster, "certificate-authority", base),
            cert=_material(user, "client-certificate", base),
            key=_material(user, "client-key", base),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        )
    return Connection(
        server=server, ssl_context=context_ssl, token=token, token_file=token_file, basic=basic
    )


def _named(config: dict[str, Any], section: str, name: Any, key: str) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            value: dict[str, Any] = entry.get(key) or {}
            return value
    raise ConnectionError_(f"kubeconfig has no {section[:-1]} named {name!r}")


def _via_kubernetes_package(path: Path, context: str | None) -> Connection:
    """Let the kubernetes package run an exec / auth-provider plugin for us."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(path), context=context, client_configuration=configuration
    )
    ca = Path(configuration.ssl_ca_cert).read_bytes() if configuration.ssl_ca_cert else None
    cert = Path(configuration.cert_file).read_bytes() if configuration.cert_file else None
    key = Path(configuration.key_file).read_bytes() if configuration.key_file else None
    auth = (configuration.api_key or {}).get("authorization", "")
    token = auth.removeprefix("Bearer ").strip() or None
    return Connection(
        server=str(configuration.host).rstrip("/"),
        ssl_context=_ssl_context(ca=ca, cert=cert, key=key, insecure=not configuration.verify_ssl),
        token=token,
    )


def load(kubeconfig: str | Path | None = None) -> Connection:
    """In-cluster if we run in a pod (and no kubeconfig was named), else the kubeconfig."""
    if kubeconfig is None:
        found = in_cluster()
        if found is not None:
            return found
    return from_kubeconfig(kubeconfig)
