"""agentq's one Kubernetes client: JSON over one pooled aiohttp session per API server.

Operator (``agentq.operator.rest`` and ``informer``), sidecar
(``agentq.sidecar.kubeapi``) and CLI (``agentq.kube.sync``) all send their
requests through ``Client``. Chosen by measurement over kubernetes_asyncio,
lightkube, kr8s and the kubernetes sync client (docs/benchmarks.md, "One
Kubernetes client"): no generated models, no thread per call, the least CPU
per request and the smallest import.

What it owns, and its callers do not:

- credentials on every request (``agentq.kube.credentials``), the TLS session
  presenting the current client certificate (a new one from an exec plugin
  gets a new connection pool);
- a 401: the credential is refreshed (the exec plugin run again, the token file
  read again) and the request sent once more; a second 401 is returned as it
  is, a refusal the caller reports (the operator's ``Status.FORBIDDEN``, the
  CLI's exit code). A 403 is returned at once: refreshing changes no RBAC;
- failures without an answer raise ``TransportError`` (outcome unknown) and a
  credential that cannot be had raises ``CredentialError`` (nothing sent).

Answers are raw bytes: each caller decodes as it must (the operator with
``agentq.views.decode``, which takes any nesting).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentq.kube.config import KubeConfig
from agentq.kube.credentials import Auth, CredentialError, Credentials

MERGE_PATCH = "application/merge-patch+json"
MAX_LINE = 64 * 1024 * 1024  # one watch event; the API server refuses objects over 3 MiB


class TransportError(RuntimeError):
    """No answer from the API server (refused, reset, timed out): the outcome is unknown."""


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: the HTTP status, the body's bytes, and the requests it took (2 after a
    401 that a refreshed credential answered)."""

    status: int
    raw: bytes
    attempts: int = 1
    retry_after: float | None = None  # the Retry-After of a 429 or 503, in seconds

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None


class Stream:
    """An open watch response: ``status``, and its lines when 200."""

    def __init__(self, response: aiohttp.ClientResponse, attempts: int) -> None:
        self.response = response
        self.status = response.status
        self.attempts = attempts

    async def read(self) -> bytes:
        return await self.response.read()

    async def lines(self) -> AsyncIterator[bytes]:
        """Each line (without its newline), whatever its length up to ``MAX_LINE``;
        aiohttp's own ``readline`` stops at 128 KiB."""
        buffer = bytearray()
        async for chunk in self.response.content.iter_any():
            buffer.extend(chunk)
            while True:
                end = buffer.find(b"\n")
                if end < 0:
                    if len(buffer) > MAX_LINE:
                        raise TransportError(f"a watch line over {MAX_LINE} bytes")
                    break
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                yield line
        if buffer.strip():
            yield bytes(buffer)


class Client:
    """Requests to one API server (``config``), ``pool`` connections at most."""

    def __init__(
        self, config: KubeConfig, *, pool: int = 32, timeout: float = 10.0, connect: float = 5.0
    ) -> None:
        self.config = config
        self.server = config.server
        self.timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect)
        self._connect = connect
        self._pool = pool
        self._session: aiohttp.ClientSession | None = None
        self._session_cert: tuple[bytes, bytes] | None = None
        self._retired: list[aiohttp.ClientSession] = []
        self.refreshes = 0  # 401s answered by refreshing the credential

    @property
    def credentials(self) -> Credentials:
        return self.config.credentials

    def _session_for(self, auth: Auth) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed or auth.cert != self._session_cert:
            if self._session is not None and not self._session.closed:
                # A new client certificate: new connections. Requests in flight finish on
                # the old pool; it is closed with the client.
                self._retired.append(self._session)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=self.config.ssl_context(auth.cert), limit=self._pool
                ),
                timeout=self.timeout,
            )
            self._session_cert = auth.cert
        return self._session

    async def close(self) -> None:
        for session in [*self._retired, self._session]:
            if session is not None and not session.closed:
                await session.close()
        self._session = None
        self._retired = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        accept: str = "application/json",
    ) -> Response:
        """One request (two after a 401 a refreshed credential may answer)."""
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        attempts = 0
        while True:
            attempts += 1
            auth = await self.credentials.current()
            generation = self.credentials.generation
            headers = {**auth.headers, "Accept": accept}
            if data is not None:
                headers["Content-Type"] = content_type
            session = self._session_for(auth)
            try:
                async with session.request(
                    method,
                    self.server + path,
                    params=params,
                    data=data,
                    headers=headers,
                    timeout=timeout or self.timeout,
                ) as rsp:
                    raw = await rsp.read()
                    status = rsp.status
                    retry_after = _seconds(rsp.headers.get("Retry-After"))
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                raise TransportError(f"{method} {path}: {type(err).__name__}: {err}") from err
            if status == 401 and attempts == 1 and self.credentials.refreshable:
                self.refreshes += 1
                await self.credentials.refresh(generation)
                continue
            return Response(status, raw, attempts, retry_after)

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Mapping[str, str], read_timeout: float
    ) -> AsyncIterator[Stream]:
        """An open watch (or any streamed GET): no total timeout, ``read_timeout`` between
        chunks. A 401 is answered as ``request`` does."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._connect, sock_read=read_timeout
        )
        attempts = 0
        while True:
            attempts += 1
            auth = await self.credentials.current()
            generation = self.credentials.generation
            session = self._session_for(auth)
            try:
                async with session.get(
                    self.server + path,
                    params=params,
                    headers={**auth.headers, "Accept": "application/json"},
                    timeout=timeout,
                ) as rsp:
                    if rsp.status == 401 and attempts == 1 and self.credentials.refreshable:
                        self.refreshes += 1
                        await self.credentials.refresh(generation)
                        continue
                    yield Stream(rsp, attempts)
                    return
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                raise TransportError(f"GET {path}: {type(err).__name__}: {err}") from err


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:  # an HTTP date: the API server never sends one
        return None


def object_path(
    group: str, version: str, namespace: str | None, plural: str, name: str = ""
) -> str:
    """The REST path of a collection or object (``namespace`` None: all namespaces)."""
    base = "/api/v1" if not group else f"/apis/{group}/{version}"
    path = f"{base}/namespaces/{_segment(namespace)}/{plural}" if namespace else f"{base}/{plural}"
    return f"{path}/{_segment(name)}" if name else path


def _segment(text: str) -> str:
    """``text`` as one path segment, whatever it holds ("a/b", ".."): a name or namespace
    from a manifest must not address another resource."""
    from urllib.parse import quote

    if text in (".", ".."):  # no Kubernetes name; an HTTP client would resolve it
        raise ValueError(f"{text!r} is not a Kubernetes name")
    return quote(text, safe="")


def lease_path(namespace: str | None, name: str = "") -> str:
    return object_path("coordination.k8s.io", "v1", namespace, "leases", name)


__all__ = [
    "MERGE_PATCH",
    "Client",
    "CredentialError",
    "Response",
    "Stream",
    "TransportError",
    "lease_path",
    "object_path",
]
