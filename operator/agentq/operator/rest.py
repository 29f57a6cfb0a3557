"""The production ``Kube`` port: the operator's few API calls on one aiohttp session.

Chosen by measurement over the kubernetes package's sync client in threads
(``agentq.operator.kube``): no thread hand-off per call, no model
(de)serialization, one pooled keep-alive connection set; see
docs/benchmarks.md. Every call has a timeout (``request_timeout``); a call that
times out raises ``KubeError`` -- its outcome is unknown and the controller
re-decides from what it sees next.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

import aiohttp

from agentq import GROUP, VERSION, views
from agentq.models import TASK_PLURAL
from agentq.operator.connection import Connection
from agentq.operator.port import Body, KubeError, Reply, lease_path, object_path, reply_for

MERGE_PATCH = "application/merge-patch+json"


class RestKube:
    """``agentq.operator.port.Kube`` over aiohttp."""

    def __init__(
        self, connection: Connection, *, pool: int = 32, request_timeout: float = 10.0
    ) -> None:
        self.connection = connection
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._pool = pool
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.connection.ssl_context, limit=self._pool),
                timeout=self.timeout,
                json_serialize=json.dumps,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Reply:
        headers = {**self.connection.headers(), "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":"))
            headers["Content-Type"] = content_type
        try:
            async with self.session.request(
                method, self.connection.server + path, data=data, headers=headers
            ) as rsp:
                raw = await rsp.read()
                code = rsp.status
        except (TimeoutError, aiohttp.ClientError) as err:
            raise KubeError(f"{method} {path}: {type(err).__name__}: {err}") from err
        try:
            # views.decode: a task's payload may be nested deeper than json.loads can go.
            parsed = views.decode(raw) if raw else None
        except ValueError:
            parsed = None
        return reply_for(code, parsed, raw[:2000].decode(errors="replace"))

    async def patch_status(
        self, plural: str, namespace: str, name: str, resource_version: str | None, patch: Body
    ) -> Reply:
        body: Body = {"status": patch}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        path = object_path(GROUP, VERSION, namespace, plural, name) + "/status"
        return await self._call("PATCH", path, body, content_type=MERGE_PATCH)

    async def create_lease(self, namespace: str, body: Body) -> Reply:
        return await self._call("POST", lease_path(namespace), body)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Reply:
        return await self._call("PUT", lease_path(namespace, name), body)

    async def patch_lease(
        self, namespace: str, name: str, resource_version: str, patch: Body
    ) -> Reply:
        body = {
            **patch,
            "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version},
        }
        return await self._call(
            "PATCH", lease_path(namespace, name), body, content_type=MERGE_PATCH
        )

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None) -> Reply:
        options: Body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version is not None:
            options["preconditions"] = {"resourceVersion": resource_version}
        return await self._call("DELETE", lease_path(namespace, name), options)

    async def delete_task(
        self, namespace: str, name: str, uid: str, resource_version: str
    ) -> Reply:
        options: Body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        path = object_path(GROUP, VERSION, namespace, TASK_PLURAL, name)
        return await self._call("DELETE", path, options)

    async def get_lease(self, namespace: str, name: str) -> Reply:
        return await self._call("GET", lease_path(namespace, name))

    async def list_leases(self, namespace: str, label_selector: str) -> Reply:
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        return await self._call("GET", lease_path(namespace) + "?" + query)

    async def create_event(self, namespace: str, body: Body) -> Reply:
        return await self._call("POST", object_path("", "v1", namespace, "events"), body)


async def wait_closed(kube: RestKube) -> None:
    """Close the session and give aiohttp's connector a moment to close its sockets."""
    await kube.close()
    await asyncio.sleep(0)
