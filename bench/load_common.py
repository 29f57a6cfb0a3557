"""Shared by the load benchmark's driver and its fleet process: a plain async client.

Deliberately not the operator's own client, so the raw write rate is measured
with something independent of what is being measured.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp

from agentq import kube

TASKS = "/apis/agentq.dev/v1alpha1/namespaces/{ns}/agenttasks"
WORKERS = "/apis/agentq.dev/v1alpha1/namespaces/{ns}/agentworkers"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
QUEUES = "/apis/agentq.dev/v1alpha1/agentqueues"  # cluster-scoped


@dataclass
class Connection:
    """The admin kubeconfig's server, TLS and (static) headers."""

    server: str
    ssl_context: Any
    static_headers: dict[str, str]

    def headers(self) -> dict[str, str]:
        return dict(self.static_headers)


def connect(kubeconfig: str) -> Connection:
    config = kube.from_kubeconfig(kubeconfig)
    token = config.credentials.token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Connection(config.server, config.ssl_context(), headers)


class Api:
    """A few JSON requests against the API server over one pooled aiohttp session."""

    def __init__(self, connection: Connection, *, pool: int = 64) -> None:
        self.connection = connection
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=connection.ssl_context, limit=pool),
            timeout=aiohttp.ClientTimeout(total=60),
        )

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: Iterable[int] = (200, 201),
    ) -> tuple[int, Any]:
        headers = {**self.connection.headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = content_type
        # A loaded API server sometimes cuts a large answer short (a payload error, a
        # dropped connection, or a body that ends mid-document): reads are retried.
        for attempt in range(8):
            try:
                async with self.session.request(
                    method, self.connection.server + path, data=data, headers=headers
                ) as rsp:
                    text = await rsp.text()
                    if rsp.status not in ok:
                        return rsp.status, text
                    return rsp.status, json.loads(text) if text else None
            except (
                aiohttp.ClientPayloadError,
                aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError,
                TimeoutError,
                ValueError,  # a truncated document
            ):
                if method != "GET" or attempt == 7:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    async def list_all(self, path: str, *, page: int = 500) -> tuple[list[dict[str, Any]], str]:
        """Every item of a collection, in pages of ``page`` (a 10,000-item answer in one
        piece is what a loaded API server cuts short), and the list's resourceVersion.
        ``path`` may carry a query (``?labelSelector=...``)."""
        items: list[dict[str, Any]] = []
        version = ""
        cont = ""
        joiner = "&" if "?" in path else "?"
        busy = 0
        while True:
            query = f"limit={page}" + (f"&continue={urllib.parse.quote(cont)}" if cont else "")
            status, listed = await self.request("GET", f"{path}{joiner}{query}", ok=(200,))
            if status == 410:  # the continue token expired: start over
                items, version, cont = [], "", ""
                continue
            if status in (429, 504) and busy < 30:
                # 504 "Too large resource version": the watch cache is behind the page's
                # resourceVersion on a loaded API server; it says to retry after a second.
                busy += 1
                await asyncio.sleep(1.0)
                continue
            if status != 200 or not isinstance(listed, dict):
                raise RuntimeError(f"LIST {path}: HTTP {status}: {str(listed)[:300]}")
            meta = listed.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            items.extend(listed.get("items") or [])
            cont = str(meta.get("continue") or "")
            if not cont:
                return items, version

    async def text(self, path: str) -> str:
        async with self.session.get(
            self.connection.server + path, headers=self.connection.headers()
        ) as rsp:
            return await rsp.text()


async def bounded(jobs: Iterable[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    """Run ``jobs`` with at most ``concurrency`` in flight; their results in order."""
    sem = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with sem:
            return await job()

    return await asyncio.gather(*(one(j) for j in jobs))
