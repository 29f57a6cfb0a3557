"""The sidecar's Kubernetes requests, counted: ``agentq.kube.Client`` with the sidecar's terms.

The sidecar makes few kinds of request (Lease get/create/replace, one Lease
watch, AgentTask get, AgentWorker get/create/patch), and must count every one
of them: its promise is one API request per renewal. ``KubeApi`` keeps a
counter of requests by verb and resource (a 401 answered by a refreshed
credential counts as the two requests it was) and speaks in ``ApiError``s: the
HTTP status, or 0 when there was no answer or no credential to send. The
credentials, their refresh (exec plugins, the pod's rotated token) and the
401 retry are ``agentq.kube``'s.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from agentq.kube import Client, CredentialError, TransportError
from agentq.kube import load as load_config
from agentq.kube.config import in_pod

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


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
    return base if name is None else f"{base}/{quote(name)}"


def custom_path(group: str, version: str, namespace: str, plural: str, name: str | None) -> str:
    base = f"/apis/{group}/{version}/namespaces/{quote(namespace)}/{plural}"
    return base if name is None else f"{base}/{quote(name)}"


def _decoded(raw: bytes) -> Body:
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        decoded = {"message": raw[:500].decode(errors="replace")}
    if not isinstance(decoded, dict):
        decoded = {"message": str(decoded)[:500]}
    return decoded


class KubeApi:
    """JSON requests to one API server; ``requests`` counts them by (verb, resource)."""

    def __init__(self, client: Client, *, field_manager: str = "agentq-sidecar") -> None:
        self.client = client
        self._field_manager = field_manager
        self.requests: Counter[tuple[str, str]] = Counter()

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None) -> KubeApi:
        """``kubeconfig`` if given, else the pod's service account; outside a pod, else
        the default kubeconfig. In a pod never ``$KUBECONFIG`` or ``~/.kube/config``:
        a file the agent container might have planted must not become our identity."""
        config = load_config(kubeconfig, home_fallback=not in_pod())
        return cls(Client(config, pool=32, timeout=10, connect=3))

    async def close(self) -> None:
        await self.client.close()

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
        query = dict(params or {})
        if body is not None:
            query.setdefault("fieldManager", self._field_manager)
        try:
            rsp = await self.client.request(
                method, path, body=body, content_type=content_type, params=query, timeout=timeout
            )
        except (TransportError, CredentialError) as err:
            raise ApiError(0, f"{method} {path}: {err}") from err
        self.requests[(method, resource)] += rsp.attempts - 1
        decoded = _decoded(rsp.raw)
        if rsp.status >= 400:
            raise ApiError(rsp.status, str(decoded.get("message") or decoded), decoded)
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
        try:
            async with self.client.stream(
                path, params=query, read_timeout=timeout_seconds + 30
            ) as response:
                self.requests[("WATCH", resource)] += response.attempts - 1
                if response.status >= 400:
                    decoded = _decoded(await response.read())
                    raise ApiError(response.status, str(decoded.get("message")), decoded)
                async for line in response.lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = (event.get("object") or {}).get("code") or 500
                        raise ApiError(int(status), "watch error", event.get("object"))
                    yield event
        except (
            TransportError,
            CredentialError,
            aiohttp.ClientError,
            TimeoutError,
            OSError,
            ValueError,
        ) as err:
            raise ApiError(0, f"watch {path}: {err!r}") from err


__all__ = ["ApiError", "KubeApi", "custom_path", "lease_path"]
