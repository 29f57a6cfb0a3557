"""Where the API server is and who we are to it: the pod's account or a kubeconfig.

``load()`` is what operator and sidecar use: a kubeconfig when one is named,
else the pod's ServiceAccount, else ``$KUBECONFIG`` / ``~/.kube/config``. The
CLI chooses as kubectl does (``from_kubeconfig`` first, the pod's account when
there is no kubeconfig).

Kubeconfigs are read as kubectl reads them: ``$KUBECONFIG`` may list several
files, merged (the first file to set ``current-context`` or to define a name
wins); relative paths are relative to the file that names them; CA and client
material inline (``*-data``) or in files; users with a client certificate, a
bearer token (inline or ``tokenFile``), basic auth or an ``exec`` plugin. The
legacy ``auth-provider`` plugins are refused with a message (use their exec
replacement, e.g. kubelogin).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentq.kube.credentials import CredentialError, Credentials, ExecPlugin

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(RuntimeError):
    """No usable way to reach the API server; the message says what was tried."""


@dataclass
class KubeConfig:
    """One API server and the credentials to use there."""

    server: str  # no trailing slash
    credentials: Credentials
    ca: bytes | None = None
    insecure: bool = False
    cert: tuple[bytes, bytes] | None = None  # a static client certificate and key (PEM)
    namespace: str | None = None  # the context's (or the pod's) namespace
    source: str = ""  # where this came from, for messages
    context: str | None = None
    _ssl: dict[tuple[bytes, bytes] | None, ssl.SSLContext] = field(default_factory=dict, repr=False)

    def ssl_context(self, cert: tuple[bytes, bytes] | None = None) -> ssl.SSLContext | bool:
        """The TLS settings for a connection presenting ``cert`` (else the static one);
        False for plain http."""
        if not self.server.startswith("https://"):
            return False
        chosen = cert or self.cert
        if chosen not in self._ssl:
            self._ssl[chosen] = _ssl_context(ca=self.ca, cert=chosen, insecure=self.insecure)
        return self._ssl[chosen]


def _ssl_context(
    *, ca: bytes | None, cert: tuple[bytes, bytes] | None, insecure: bool
) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca is not None:
        context.load_verify_locations(cadata=ca.decode())
    if cert is not None:
        # load_cert_chain only reads files: write the material to a private temporary
        # directory just long enough to load it.
        with tempfile.TemporaryDirectory(prefix="agentq-tls-") as tmp:
            cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert_path.write_bytes(cert[0])
            key_path.touch(mode=0o600)
            key_path.write_bytes(cert[1])
            context.load_cert_chain(str(cert_path), str(key_path))
    return context


def in_cluster(account_dir: Path | None = None) -> KubeConfig | None:
    """The pod's ServiceAccount (its projected token re-read as it rotates), if in a pod."""
    account = account_dir or SERVICE_ACCOUNT_DIR
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    token_file = account / "token"
    if not host or not port or not token_file.exists():
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    namespace_file = account / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.exists() else None
    ca_file = account / "ca.crt"
    return KubeConfig(
        server=f"https://{host}:{port}",
        credentials=Credentials(token_file=token_file),
        ca=ca_file.read_bytes() if ca_file.exists() else None,
        namespace=namespace or None,
        source="the pod's service account",
    )


def kubeconfig_files(explicit: str | Path | None = None) -> list[Path]:
    """The kubeconfig files kubectl would read: ``explicit``, else ``$KUBECONFIG``
    (a list), else ``~/.kube/config``."""
    raw = str(explicit) if explicit else os.environ.get("KUBECONFIG") or "~/.kube/config"
    if explicit:
        return [Path(raw).expanduser()]
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def _merged(files: Sequence[Path]) -> dict[str, Any]:
    """The files' kubeconfigs merged as kubectl merges them; each named entry keeps the
    directory of the file it came from (``_base``)."""
    merged: dict[str, Any] = {"current-context": None, "clusters": {}, "users": {}, "contexts": {}}
    read = 0
    for path in files:
        if not path.exists():
            continue
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"cannot read kubeconfig {path}: {err}") from err
        if not isinstance(config, dict):
            raise ConfigError(f"kubeconfig {path} is not a mapping")
        read += 1
        merged["current-context"] = merged["current-context"] or config.get("current-context")
        for section, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in config.get(section) or []:
                name = entry.get("name")
                if name is not None and name not in merged[section]:
                    merged[section][name] = {**(entry.get(key) or {}), "_base": path.parent}
    if not read:
        shown = os.pathsep.join(str(f) for f in files)
        raise ConfigError(f"no kubeconfig found (looked for {shown})")
    return merged


def _material(entry: dict[str, Any], key: str) -> bytes | None:
    """A kubeconfig file reference (``key``) or inline base64 data (``key-data``)."""
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = entry.get(key)
    if path:
        p = Path(path).expanduser()
        try:
            return (p if p.is_absolute() else entry["_base"] / p).read_bytes()
        except OSError as err:
            raise ConfigError(f"cannot read {key} {p}: {err}") from err
    return None


def contexts(kubeconfig: str | Path | None = None) -> tuple[list[str], str | None]:
    """The context names the kubeconfig(s) define, and the current one."""
    merged = _merged(kubeconfig_files(kubeconfig))
    return list(merged["contexts"]), merged["current-context"]


def from_kubeconfig(
    kubeconfig: str | Path | None = None, *, context: str | None = None
) -> KubeConfig:
    """The connection a kubeconfig's (current, or named) context describes."""
    files = kubeconfig_files(kubeconfig)
    merged = _merged(files)
    shown = os.pathsep.join(str(f) for f in files if f.exists())
    name = context or merged["current-context"]
    if not name:
        raise ConfigError(f"kubeconfig {shown} has no current-context")
    ctx = merged["contexts"].get(name)
    if ctx is None:
        raise ConfigError(f"kubeconfig {shown} has no context named {name!r}")
    cluster = merged["clusters"].get(ctx.get("cluster"))
    if cluster is None:
        raise ConfigError(f"kubeconfig {shown} has no cluster named {ctx.get('cluster')!r}")
    user: dict[str, Any] = {}
    if ctx.get("user"):
        user = merged["users"].get(ctx["user"])
        if user is None:
            raise ConfigError(f"kubeconfig {shown} has no user named {ctx['user']!r}")
    if "auth-provider" in user:
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise ConfigError(
            f"kubeconfig {shown}: user {ctx['user']!r} uses the {provider!r} auth-provider, "
            "which agentq does not run; use its exec plugin instead (e.g. kubelogin for oidc)"
        )
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f"kubeconfig {shown}: cluster {ctx.get('cluster')!r} has no server")
    ca = _material(cluster, "certificate-authority")
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    cert_pem, key_pem = _material(user, "client-certificate"), _material(user, "client-key")
    try:
        exec_plugin = ExecPlugin.parse(user["exec"], user["_base"]) if user.get("exec") else None
    except CredentialError as err:
        raise ConfigError(f"kubeconfig {shown}: {err}") from err
    token_file = user.get("tokenFile")
    credentials = Credentials(
        token=user.get("token") or None,
        token_file=(user["_base"] / Path(token_file).expanduser()) if token_file else None,
        basic=(str(user["username"]), str(user.get("password", "")))
        if user.get("username")
        else None,
        exec_plugin=exec_plugin,
        cluster_info={"server": server, "ca": ca, "insecure": insecure},
    )
    return KubeConfig(
        server=server,
        credentials=credentials,
        ca=ca,
        insecure=insecure,
        cert=(cert_pem, key_pem) if cert_pem and key_pem else None,
        namespace=ctx.get("namespace") or None,
        source=f"kubeconfig {shown}, context {name}",
        context=name,
    )


def in_pod() -> bool:
    """Whether this process runs in a Kubernetes pod (the kubelet set the Service address)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def load(
    kubeconfig: str | Path | None = None,
    *,
    home_fallback: bool = True,
) -> KubeConfig:
    """A named kubeconfig; else the pod's account when in a pod; else the default
    kubeconfig (``$KUBECONFIG``, ``~/.kube/config``) unless ``home_fallback`` is False:
    then a missing pod account is an error, never a file someone else could plant."""
    if kubeconfig is None:
        found = in_cluster()
        if found is not None:
            return found
        if not home_fallback:
            raise ConfigError(
                f"no ServiceAccount token at {SERVICE_ACCOUNT_DIR / 'token'} (is the projected "
                "token volume mounted into this container?) and no kubeconfig named: in a pod "
                "the sidecar does not fall back to $KUBECONFIG or ~/.kube/config"
            )
    return from_kubeconfig(kubeconfig)


__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ConfigError",
    "KubeConfig",
    "contexts",
    "from_kubeconfig",
    "in_cluster",
    "in_pod",
    "kubeconfig_files",
    "load",
]
