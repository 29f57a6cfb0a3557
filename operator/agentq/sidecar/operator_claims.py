"""Reading a cross-namespace claim's task from the operator, not the API server.

A claim of a task of another namespace (docs/tenancy.md, "Cross-namespace claims")
has its Lease in this worker's namespace, but its AgentTask is in the team's, where
the sidecar has no RBAC (and must get none: it would read every team's payloads).
The operator answers for the claim's holder only:
``GET {operator_url}/v1/claims/{lease namespace}/{lease name}`` with a projected
ServiceAccount token of audience ``agentq.dev/operator`` (read from its file for
every request: the kubelet rotates it), and the answer is shaped like the
AgentTask (``metadata`` name/namespace/uid, ``spec``, ``status.attempt``), so the
watcher activates the attempt from it as from a task it read itself.

Every answer but 200 is a ``ClaimError`` with its HTTP status (0: no answer, or no
token to send); the watcher decides what each means (403 and 404: try again with
backoff; 410: the claim ended).

TLS: an ``https://`` URL needs ``ca_file``, the CA bundle the operator's serving
certificate chains to (the chart's or cert-manager's ``ca.crt``, from a ConfigMap of
this namespace); only that CA is trusted (never the system's), and the certificate
must name the URL's host (the Service's DNS name), or ``server_name`` when given. The
bundle is re-read when its file changes (a rotated CA reaches the ConfigMap's mount).
A handshake refused (an unknown CA, an expired certificate, another name) or a
bundle that does not load is a ``ClaimError`` with status 0 and ``tls`` set: the
watcher counts it as ``code="tls"`` and logs it as an error, and tries again.
"""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

Body = dict[str, Any]

# Where manifests/agent/ mounts the projected token (the sidecar container only).
DEFAULT_TOKEN_FILE = "/var/run/secrets/agentq.dev/operator/token"
AUDIENCE = "agentq.dev/operator"
TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=3)
MAX_TOKEN_BYTES = 16 * 1024


class ClaimError(Exception):
    """The operator did not hand the claim's task over: ``status`` is its HTTP status,
    or 0 when there was no answer (or no token to send)."""

    def __init__(self, status: int, message: str, *, tls: bool = False) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.tls = tls  # no TLS connection: the server's certificate refused, or no CA

    @property
    def code(self) -> str:
        """The ``code`` label of ``agentq_sidecar_claim_reads_total`` for it."""
        if self.status:
            return str(self.status)
        return "tls" if self.tls else "error"


class OperatorClaims:
    """Claims' tasks from the operator at ``url``, authenticated by ``token_file``;
    over TLS (``https://``) trusting ``ca_file`` alone (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token_file: str = DEFAULT_TOKEN_FILE,
        *,
        ca_file: str | None = None,
        server_name: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.tls = self.url.startswith("https://")
        if self.tls and not ca_file:
            raise ValueError(f"{url} is https: the CA file of the operator's certificate is needed")
        self.ca_file = ca_file
        self.server_name = server_name or None
        self._session: aiohttp.ClientSession | None = None
        self._context: ssl.SSLContext | None = None
        self._ca_stamp: tuple[int, int, int] | None = None
        self._stale: aiohttp.ClientSession | None = None  # of the CA bundle before

    def _token(self) -> str:
        try:
            raw = Path(self.token_file).read_bytes()[:MAX_TOKEN_BYTES]
        except OSError as err:
            raise ClaimError(0, f"cannot read the operator token {self.token_file}: {err}") from err
        token = raw.decode(errors="replace").strip()
        if not token:
            raise ClaimError(0, f"the operator token file {self.token_file} is empty")
        return token

    def _ssl(self) -> ssl.SSLContext | None:
        """The client context trusting ``ca_file`` alone, made again when the file changed
        (the session with it: no connection of the old trust is reused)."""
        if not self.tls or self.ca_file is None:
            return None
        try:
            st = os.stat(self.ca_file)  # through the kubelet's ..data link
        except OSError as err:
            raise ClaimError(
                0, f"cannot read the operator's CA bundle {self.ca_file}: {err}", tls=True
            ) from err
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._context is None or stamp != self._ca_stamp:
            # A bare client context: verifies the chain and the host name, trusts no CA
            # until one is loaded (never the system's).
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (OSError, ssl.SSLError, ValueError) as err:
                raise ClaimError(
                    0, f"the operator's CA bundle {self.ca_file} does not load: {err}", tls=True
                ) from err
            self._context = context
            self._ca_stamp = stamp
            self._stale = self._session
            self._session = None
        return self._context

    async def _client(self) -> aiohttp.ClientSession:
        context = self._ssl()
        if self._stale is not None:
            stale, self._stale = self._stale, None
            if not stale.closed:
                await stale.close()
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
            self._session = aiohttp.ClientSession(timeout=TIMEOUT, connector=connector)
        return self._session

    async def read(self, namespace: str, lease_name: str) -> Body:
        """The task of the claim whose Lease is ``namespace``/``lease_name``."""
        url = f"{self.url}/v1/claims/{quote(namespace, safe='')}/{quote(lease_name, safe='')}"
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        session = await self._client()
        try:
            async with session.get(
                url, headers=headers, allow_redirects=False, server_hostname=self.server_name
            ) as rsp:
                status = rsp.status
                raw = await rsp.read()
        except (aiohttp.ClientSSLError, ssl.SSLError) as err:
            raise ClaimError(
                0,
                f"GET {url}: TLS refused ({type(err).__name__}: {err}); the operator's "
                f"certificate must chain to {self.ca_file} and name "
                f"{self.server_name or 'the URL host'}",
                tls=True,
            ) from err
        except aiohttp.ClientConnectorError as err:
            if self.tls and isinstance(err.os_error, ConnectionResetError):
                raise ClaimError(
                    0,
                    f"GET {url}: the operator ended the TLS handshake (has it a certificate "
                    "to serve? its log and agentq_claim_tls_ready say)",
                    tls=True,
                ) from err
            raise ClaimError(0, f"GET {url}: {type(err).__name__}: {err}") from err
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise ClaimError(0, f"GET {url}: {type(err).__name__}: {err}") from err
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, RecursionError):
            body = None
        if status != 200:
            message = body.get("message") if isinstance(body, dict) else None
            raise ClaimError(status, str(message or raw[:300].decode(errors="replace")))
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("metadata"), dict)
            or not isinstance(body.get("spec"), dict)
        ):
            raise ClaimError(502, f"the operator's answer is not a task: {raw[:200]!r}")
        return body

    async def close(self) -> None:
        for session in (self._session, self._stale):
            if session is not None and not session.closed:
                await session.close()
        self._session = self._stale = None


__all__ = ["AUDIENCE", "DEFAULT_TOKEN_FILE", "ClaimError", "OperatorClaims"]
