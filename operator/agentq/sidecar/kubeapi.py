"""A thin async Kubernetes REST client for the sidecar, on aiohttp.

The sidecar makes few kinds of request (Lease get/create/replace, one Lease
watch, AgentTask get, AgentWorker get/create/patch), and must count every one
of them: its promise is one API request per renewal. So it speaks JSON over
aiohttp directly instead of through a generated client, and keeps a counter of
requests by verb and resource. Credentials come from the ``kubernetes``
package's config loaders (kubeconfig, exec plugins, in-cluster service account
with token rotation), so no auth logic lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

Body = dict[str, Any]

# Ordinary requests: a Lease write must either land or fail well inside a heartbeat
# interval, so the renewal loop can retry while the lease is still valid.
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=3)


class ApiError(Exception):
    """The API server answered with an error status (or could not be reached: status 0)."""

    def __init__(self, status: int, message: str, body: Body | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.body = body or {}


def load_configuration(kubeconfig: str | None) -> k8s_client.Configuration:
    """Credentials: ``kubeconfig`` if given, else in-cluster, else the default kubeconfig."""
    cfg = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        return cfg
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=cfg)
    return cfg


def _ssl_context(cfg: k8s_client.Configuration) -> ssl.SSLContext | bool:
    if not str(cfg.host).startswith("https"):
        return False
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    if not cfg.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
    return base if name is None else f"{base}/{quote(name)}"


def custom_path(group: str, version: str, namespace: str, plural: str, name: str | None) -> str:
    base = f"/apis/{group}/{version}/namespaces/{quote(namespace)}/{plural}"
    return base if name is None else f"{base}/{quote(name)}"


class KubeApi:
    """JSON requests to one API server; ``requests`` counts them by (verb, resource)."""

    def __init__(self, cfg: k8s_client.Configuration, *, field_manager: str = "agentq-sidecar"):
        self._cfg = cfg
        self._host = str(cfg.host).rstrip("/")
        self._field_manager = field_manager
        self._session: aiohttp.ClientSession | None = None
        self.requests: Counter[tuple[str, str]] = Counter()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None) -> KubeApi:
        return cls(load_configuration(kubeconfig))

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        # auth_settings() runs the refresh hook (in-cluster token rotation, expiring
        # exec/OIDC tokens) and gives the header to send (bearer token, "Bearer ..").
        # A refresh that fails (a token file unreadable or empty for a moment) is an
        # ApiError like an unreachable server, so every caller retries it.
        try:
            settings = self._cfg.auth_settings()
        except Exception as err:
            raise ApiError(0, f"refreshing the credentials: {err!r}") from err
        for setting in settings.values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[str(setting["key"])] = str(setting["value"])
        return headers

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=_ssl_context(self._cfg), limit=32)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        resource: str,
        params: Mapping[str, str] | None = None,
        body: Body | None = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout = REQUEST_TIMEOUT,
    ) -> Body:
        """One request; the decoded body on 2xx, else ``ApiError`` (status 0: unreachable)."""
        self.requests[(method, resource)] += 1
        headers = self._headers()
        data = None
        query = dict(params or {})
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":"))
            query.setdefault("fieldManager", self._field_manager)
        session = await self.session()
        try:
            async with session.request(
                method, self._host + path, params=query, data=data, headers=headers, timeout=timeout
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise ApiError(0, f"{method} {path}: {err!r}") from err
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"message": raw[:500].decode(errors="replace")}
        if not isinstance(decoded, dict):
            decoded = {"message": str(decoded)[:500]}
        if status >= 400:
            raise ApiError(status, str(decoded.get("message") or decoded), decoded)
        return decoded

    async def watch(
        self, path: str, *, resource: str, params: Mapping[str, str], timeout_seconds: int
    ) -> AsyncIterator[Body]:
        """The events of one watch request, until the server ends it.

        A 410 (as an HTTP status or as an ERROR event) raises ``ApiError(410)``: the
        caller must list again. Connection failures raise ``ApiError(0)``.
        """
        self.requests[("WATCH", resource)] += 1
        query = {
            **params,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        session = await self.session()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=3, sock_read=timeout_seconds + 30)
        try:
            async with session.get(
                self._host + path, params=query, headers=self._headers(), timeout=timeout
            ) as response:
                if response.status >= 400:
                    raw = await response.read()
                    try:
                        decoded = json.loads(raw)
                    except ValueError:
                        decoded = {"message": raw[:500].decode(errors="replace")}
                    raise ApiError(response.status, str(decoded.get("message")), decoded)
                while True:
                    line = await response.content.readline()
                    if not line:
                        return
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = (event.get("object") or {}).get("code") or 500
                        raise ApiError(int(status), "watch error", event.get("object"))
                    yield event
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
            raise ApiError(0, f"watch {path}: {err!r}") from err


class Backoff:
    """Exponential backoff with full jitter, for reconnects and retries."""

    def __init__(
        self, *, initial: float = 0.2, maximum: float = 5.0, rand: random.Random | None = None
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self._failures = 0
        self._rand = rand or random.Random()

    def reset(self) -> None:
        self._failures = 0

    def next(self) -> float:
        ceiling = min(self.maximum, self.initial * (2**self._failures))
        self._failures += 1
        return float(ceiling * (0.5 + self._rand.random() / 2))

    async def sleep(self, stop: asyncio.Event) -> None:
        """Sleep the next backoff delay, or less if ``stop`` is set."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=self.next())
