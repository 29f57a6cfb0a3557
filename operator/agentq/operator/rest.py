"""The production ``Kube`` port: the operator's few API calls on ``agentq.kube.Client``.

One pooled aiohttp session, no thread hand-off per call, no model
(de)serialization (docs/benchmarks.md). Every call has a timeout (the
client's); a call that gets no answer raises ``KubeError`` -- its outcome is
unknown and the controller re-decides from what it sees next. A credential
that cannot be had, or one the API server refuses even after a refresh, is a
``Status.FORBIDDEN`` reply: nothing happened.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from agentq import GROUP, VERSION, views
from agentq.kube import MERGE_PATCH, Client, CredentialError, TransportError
from agentq.models import TASK_PLURAL
from agentq.operator.port import (
    Body,
    KubeError,
    Reply,
    Status,
    lease_path,
    object_path,
    reply_for,
)


class RestKube:
    """``agentq.operator.port.Kube`` over ``agentq.kube.Client``."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def close(self) -> None:
        await self.client.close()

    async def _call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Reply:
        try:
            rsp = await self.client.request(method, path, body=body, content_type=content_type)
        except TransportError as err:
            raise KubeError(str(err)) from err
        except CredentialError as err:
            return Reply(Status.FORBIDDEN, None, f"no credential: {err}")
        try:
            # views.decode: a task's payload may be nested deeper than json.loads can go.
            parsed = views.decode(rsp.raw) if rsp.raw else None
        except ValueError:
            parsed = None
        return reply_for(rsp.status, parsed, rsp.raw[:2000].decode(errors="replace"))

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

    async def get_task(self, namespace: str, name: str) -> Reply:
        return await self._call("GET", object_path(GROUP, VERSION, namespace, TASK_PLURAL, name))

    async def list_leases(self, namespace: str, label_selector: str) -> Reply:
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        return await self._call("GET", lease_path(namespace) + "?" + query)

    async def create_event(self, namespace: str, body: Body) -> Reply:
        return await self._call("POST", object_path("", "v1", namespace, "events"), body)
