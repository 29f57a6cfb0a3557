"""The comparison ``Kube`` port: the kubernetes package's sync client, in threads.

This was the operator's only door to the API server before the aiohttp client
(``agentq.operator.rest``) replaced it; comparison only, it lives in bench/ and
runs through ``bench/threaded_operator.py`` (the ``threads`` variant of
``make bench-load``). Every call runs in a worker thread (``asyncio.to_thread``)
so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION
from agentq.operator.port import Body, KubeError, Reply, reply_for

MERGE = "application/merge-patch+json"


def make_api_client(*, pool_size: int = 32) -> client.ApiClient:
    """An API client from the in-cluster service account, else the kubeconfig."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    # One pooled connection per concurrent writer thread.
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class ThreadedKube:
    """``agentq.operator.port.Kube`` over the kubernetes sync client, in threads."""

    def __init__(self, api: client.ApiClient, *, request_timeout: float = 10.0) -> None:
        self.api = api
        self.timeout = request_timeout
        self.custom = client.CustomObjectsApi(api)
        self.leases = client.CoordinationV1Api(api)
        self.core = client.CoreV1Api(api)

    async def _call(self, call: Any, *args: Any, **kwargs: Any) -> Reply:
        kwargs["_request_timeout"] = self.timeout
        try:
            result = await asyncio.to_thread(call, *args, **kwargs)
        except ApiException as err:
            body = None
            with contextlib.suppress(ValueError):
                body = json.loads(err.body) if err.body else None
            return reply_for(int(err.status or 0), body, str(err.body or err.reason))
        except Exception as err:  # urllib3 timeouts, connection errors
            raise KubeError(f"{type(err).__name__}: {err}") from err
        if result is None or isinstance(result, dict):
            return reply_for(200, result, "")
        return reply_for(200, self.api.sanitize_for_serialization(result), "")

    async def patch_status(
        self, plural: str, namespace: str, name: str, resource_version: str | None, patch: Body
    ) -> Reply:
        body: Body = {"status": patch}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._call(
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            body,
            _content_type=MERGE,
        )

    async def create_lease(self, namespace: str, body: Body) -> Reply:
        return await self._call(self.leases.create_namespaced_lease, namespace, body)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Reply:
        return await self._call(self.leases.replace_namespaced_lease, name, namespace, body)

    async def patch_lease(
        self, namespace: str, name: str, resource_version: str, patch: Body
    ) -> Reply:
        body = {
            **patch,
            "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version},
        }
        return await self._call(
            self.leases.patch_namespaced_lease, name, namespace, body, _content_type=MERGE
        )

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None) -> Reply:
        preconditions = (
            client.V1Preconditions(resource_version=resource_version) if resource_version else None
        )
        return await self._call(
            self.leases.delete_namespaced_lease,
            name,
            namespace,
            body=client.V1DeleteOptions(preconditions=preconditions),
        )

    async def delete_task(
        self, namespace: str, name: str, uid: str, resource_version: str
    ) -> Reply:
        return await self._call(
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "agenttasks",
            name,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version)
            ),
        )

    async def get_lease(self, namespace: str, name: str) -> Reply:
        return await self._call(self.leases.read_namespaced_lease, name, namespace)

    async def get_task(self, namespace: str, name: str) -> Reply:
        return await self._call(
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            "agenttasks",
            name,
        )

    async def list_leases(self, namespace: str, label_selector: str) -> Reply:
        return await self._call(
            self.leases.list_namespaced_lease, namespace, label_selector=label_selector
        )

    async def create_event(self, namespace: str, body: Body) -> Reply:
        return await self._call(self.core.create_namespaced_event, namespace, body)

    async def close(self) -> None:
        await asyncio.to_thread(self.api.close)


__all__ = ["ThreadedKube", "make_api_client"]
