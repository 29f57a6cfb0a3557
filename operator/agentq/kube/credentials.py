"""Who we are to the API server, kept fresh: what each request's credentials are.

One ``Credentials`` per connection, from any of the sources a kubeconfig or a
pod offers:

- a static bearer token, basic auth, or a client certificate (the certificate
  is TLS material: ``agentq.kube.config`` puts it in the SSL context);
- a token file (``tokenFile``, or the pod's projected ServiceAccount token),
  re-read every ``TOKEN_REREAD_SECONDS`` as client-go does, since the kubelet
  rotates bound tokens well before they expire, and at once on ``refresh()``;
- an exec plugin (``users[].user.exec``): the command is run as the
  ``client.authentication.k8s.io`` ExecCredential protocol says (its
  ``apiVersion``, ``args`` and ``env``; ``KUBERNETES_EXEC_INFO`` on its
  environment; no terminal), and what it prints -- a token, or a client
  certificate and key -- is used until its ``expirationTimestamp``, then the
  command is run again. No expiry: until the API server refuses it.

``refresh()`` is what a 401 calls (``agentq.kube.client``): the cached
credential is dropped and read or run again once; a static one cannot change,
so ``refreshable`` says whether retrying is worth it. Obtaining a credential
that fails (the plugin exits non-zero, prints no credential, the token file is
unreadable or empty) raises ``CredentialError``: nothing was sent.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# client-go's token-file reload period (transport/token_source.go): bound tokens are
# rotated by the kubelet at 80 % of their life, so a minute is always in time.
TOKEN_REREAD_SECONDS = 60.0
# An exec plugin that prints nothing in this long is broken (a login flow that waits
# for a person cannot run here: we give it no terminal).
EXEC_TIMEOUT_SECONDS = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class CredentialError(RuntimeError):
    """No credential could be had (nothing was sent); the message says why."""


@dataclass(frozen=True)
class Auth:
    """What one request carries: headers, and a client certificate for the TLS handshake."""

    headers: Mapping[str, str]
    cert: tuple[bytes, bytes] | None = None  # (certificate PEM, key PEM)
    expires: datetime.datetime | None = None  # an exec credential's expirationTimestamp


@dataclass(frozen=True)
class ExecPlugin:
    """A kubeconfig ``exec`` section: the command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    interactive_mode: str = "IfAvailable"
    provide_cluster_info: bool = False
    base: Path | None = None  # the kubeconfig's directory: a relative command's root

    @classmethod
    def parse(cls, section: Mapping[str, Any], base: Path | None) -> ExecPlugin:
        command = section.get("command")
        if not command:
            raise CredentialError("the kubeconfig's exec section names no command")
        api_version = str(section.get("apiVersion") or "")
        if api_version not in EXEC_API_VERSIONS:
            raise CredentialError(
                f"exec plugin {command!r}: apiVersion {api_version!r} is not one of "
                f"{', '.join(EXEC_API_VERSIONS)}"
            )
        env = tuple((str(e.get("name")), str(e.get("value", ""))) for e in section.get("env") or [])
        return cls(
            command=str(command),
            args=tuple(str(a) for a in section.get("args") or []),
            env=env,
            api_version=api_version,
            interactive_mode=str(section.get("interactiveMode") or "IfAvailable"),
            provide_cluster_info=bool(section.get("provideClusterInfo")),
            base=base,
        )

    def executable(self) -> str:
        # client-go: a relative path with a separator is relative to the kubeconfig's
        # directory; a bare name is looked up on PATH.
        if os.sep in self.command and not os.path.isabs(self.command) and self.base is not None:
            return str(self.base / self.command)
        return self.command


def _parse_time(text: str) -> datetime.datetime:
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=datetime.UTC)


class Credentials:
    """The credential of one connection, cached, refreshed when it expires or is refused."""

    def __init__(
        self,
        *,
        token: str | None = None,
        token_file: Path | None = None,
        basic: tuple[str, str] | None = None,
        exec_plugin: ExecPlugin | None = None,
        cluster_info: Mapping[str, Any] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.token = token
        self.token_file = token_file
        self.basic = basic
        self.exec_plugin = exec_plugin
        self.cluster_info = dict(cluster_info or {})
        self._monotonic = monotonic
        self._now = now
        self._cached: Auth | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()
        self.runs = 0  # exec plugin runs and token file reads, for tests and logs
        self.generation = 0  # bumped each time the credential is obtained again

    @property
    def refreshable(self) -> bool:
        """Whether ``refresh()`` can give a different credential (worth retrying a 401)."""
        return self.exec_plugin is not None or self.token_file is not None

    @property
    def kind(self) -> str:
        if self.exec_plugin is not None:
            return f"exec plugin {self.exec_plugin.command}"
        if self.token_file is not None:
            return f"token file {self.token_file}"
        if self.token:
            return "bearer token"
        if self.basic:
            return "basic auth"
        return "client certificate or none"

    def _fresh(self, auth: Auth | None) -> bool:
        if auth is None:
            return False
        if self.exec_plugin is not None:
            return auth.expires is None or self._now() < auth.expires
        if self.token_file is not None:
            return self._monotonic() - self._read_at < TOKEN_REREAD_SECONDS
        return True

    async def current(self) -> Auth:
        """The credential for the next request (obtained again if it expired)."""
        cached = self._cached
        if self._fresh(cached):
            assert cached is not None
            return cached
        async with self._lock:
            if not self._fresh(self._cached):
                self._cached = await self._obtain()
                self.generation += 1
            assert self._cached is not None
            return self._cached

    async def refresh(self, seen: int | None = None) -> None:
        """The API server refused the credential of generation ``seen``: drop it, so the
        next ``current()`` obtains it again (once, for all requests refused together)."""
        async with self._lock:
            if seen is None or seen == self.generation:
                self._cached = None

    async def _obtain(self) -> Auth:
        if self.exec_plugin is not None:
            return await self._run_exec(self.exec_plugin)
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as err:
                raise CredentialError(f"cannot read token file {self.token_file}: {err}") from err
            if not token:
                raise CredentialError(f"token file {self.token_file} is empty")
            self.runs += 1
            self._read_at = self._monotonic()
            return Auth({"Authorization": f"Bearer {token}"})
        if self.token:
            return Auth({"Authorization": f"Bearer {self.token}"})
        if self.basic is not None:
            raw = f"{self.basic[0]}:{self.basic[1]}".encode()
            return Auth({"Authorization": f"Basic {base64.b64encode(raw).decode()}"})
        return Auth({})

    def _exec_info(self, plugin: ExecPlugin) -> str:
        spec: dict[str, Any] = {"interactive": False}
        if plugin.provide_cluster_info and self.cluster_info:
            cluster = {"server": self.cluster_info.get("server")}
            if self.cluster_info.get("ca"):
                cluster["certificate-authority-data"] = base64.b64encode(
                    self.cluster_info["ca"]
                ).decode()
            if self.cluster_info.get("insecure"):
                cluster["insecure-skip-tls-verify"] = True
            spec["cluster"] = cluster
        return json.dumps(
            {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}
        )

    async def _run_exec(self, plugin: ExecPlugin) -> Auth:
        if plugin.interactive_mode == "Always":
            raise CredentialError(
                f"exec plugin {plugin.command!r} needs a terminal (interactiveMode: Always)"
            )
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": self._exec_info(plugin)}
        try:
            proc = await asyncio.create_subprocess_exec(
                plugin.executable(),
                *plugin.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as err:
            raise CredentialError(f"cannot run exec plugin {plugin.command!r}: {err}") from err
        try:
            out, err_out = await asyncio.wait_for(proc.communicate(), EXEC_TIMEOUT_SECONDS)
        except TimeoutError as err:
            proc.kill()
            await proc.wait()
            raise CredentialError(
                f"exec plugin {plugin.command!r} printed nothing in {EXEC_TIMEOUT_SECONDS:.0f} s"
            ) from err
        self.runs += 1
        if proc.returncode != 0:
            tail = err_out.decode(errors="replace").strip()[-500:]
            raise CredentialError(
                f"exec plugin {plugin.command!r} exited {proc.returncode}: {tail}"
            )
        return self._exec_credential(plugin, out)

    def _exec_credential(self, plugin: ExecPlugin, out: bytes) -> Auth:
        try:
            credential = json.loads(out)
        except ValueError as err:
            raise CredentialError(f"exec plugin {plugin.command!r} printed no JSON") from err
        if not isinstance(credential, dict) or credential.get("kind") != "ExecCredential":
            raise CredentialError(f"exec plugin {plugin.command!r} printed no ExecCredential")
        if credential.get("apiVersion") != plugin.api_version:
            raise CredentialError(
                f"exec plugin {plugin.command!r} answered apiVersion "
                f"{credential.get('apiVersion')!r}, asked {plugin.api_version!r}"
            )
        status = credential.get("status") or {}
        expires = None
        if status.get("expirationTimestamp"):
            try:
                expires = _parse_time(str(status["expirationTimestamp"]))
            except ValueError as err:
                raise CredentialError(
                    f"exec plugin {plugin.command!r}: bad expirationTimestamp "
                    f"{status['expirationTimestamp']!r}"
                ) from err
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        token = status.get("token")
        if token:
            return Auth({"Authorization": f"Bearer {token}"}, None, expires)
        if cert and key:
            return Auth({}, (str(cert).encode(), str(key).encode()), expires)
        raise CredentialError(
            f"exec plugin {plugin.command!r} printed neither a token nor a client certificate"
        )


__all__ = ["Auth", "CredentialError", "Credentials", "ExecPlugin"]
