"""The operator's only door to the API server.

Every call is the synchronous kubernetes client run in a worker thread
(``asyncio.to_thread``), so kopf's event loop is never blocked. Writes that
decide something are compare-and-swap: they carry the resourceVersion the
decision was made on, and a 409 Conflict returns ``None`` so the caller drops
its decision and re-reads instead of guessing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION
from agentq.clock import Clock, rfc3339

log = logging.getLogger("agentq.kube")
Body = dict[str, Any]
MERGE = "application/merge-patch+json"


async def _tolerating(statuses: tuple[int, ...], call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a sync client call in a thread; None if it fails with one of ``statuses``."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except ApiException as err:
        if err.status in statuses:
            return None
        raise


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


class Kube:
    """Async wrappers around the few API calls the operator makes."""

    def __init__(self, api: client.ApiClient, clock: Clock, *, component: str) -> None:
        self.api = api
        self.clock = clock
        self.component = component
        self.custom = client.CustomObjectsApi(api)
        self.leases = client.CoordinationV1Api(api)
        self.core = client.CoreV1Api(api)

    # -- AgentTask / AgentWorker status ------------------------------------------------

    async def patch_status(
        self, plural: str, namespace: str, name: str, resource_version: str | None, status: Body
    ) -> Body | None:
        """Merge ``status`` into the object's status if it is still at ``resource_version``.

        Returns the updated object, or None if it changed meanwhile (409) or is gone (404).
        """
        body: Body = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        result: Body | None = await _tolerating(
            (404, 409),
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            plural,
            name,
            body,
            _content_type=MERGE,
        )
        return result

    # -- Leases ------------------------------------------------------------------------

    async def put_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease | None:
        """Create ``lease``, or overwrite the existing one of that name (CAS on its version).

        Returns None when a concurrent writer won the race (the caller re-reads later).
        """
        created = await self.create_lease(namespace, lease)
        if created is not None:
            return created
        current = await self.read_lease(namespace, lease.metadata.name)
        if current is None:
            return None  # deleted in between: the next pass writes it again
        lease.metadata.resource_version = current.metadata.resource_version
        return await self.replace_lease(namespace, lease)

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None) -> bool:
        """Delete a Lease if still at ``resource_version``; False if it changed or is gone."""
        preconditions = (
            client.V1Preconditions(resource_version=resource_version) if resource_version else None
        )
        done = await _tolerating(
            (404, 409),
            self.leases.delete_namespaced_lease,
            name,
            namespace,
            body=client.V1DeleteOptions(preconditions=preconditions),
        )
        return done is not None

    async def read_lease(self, namespace: str, name: str) -> client.V1Lease | None:
        return await _tolerating((404,), self.leases.read_namespaced_lease, name, namespace)

    async def create_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease | None:
        """None if a Lease of that name exists already."""
        return await _tolerating((409,), self.leases.create_namespaced_lease, namespace, lease)

    async def replace_lease(self, namespace: str, lease: client.V1Lease) -> client.V1Lease | None:
        """None if the Lease changed since it was read (409)."""
        return await _tolerating(
            (409,), self.leases.replace_namespaced_lease, lease.metadata.name, namespace, lease
        )

    def lease_to_dict(self, lease: client.V1Lease) -> Body:
        result: Body = self.api.sanitize_for_serialization(lease)
        return result

    # -- Events ------------------------------------------------------------------------

    async def event(
        self, involved: Body, *, reason: str, message: str, warning: bool = False
    ) -> None:
        """Record a Kubernetes Event on ``involved``; failures are logged, never raised."""
        meta = involved.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        now = self.clock.now()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name', 'agentq')}."),
            involved_object=client.V1ObjectReference(
                api_version=involved.get("apiVersion"),
                kind=involved.get("kind"),
                name=meta.get("name"),
                namespace=namespace,
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=self.component),
            first_timestamp=rfc3339(now),
            last_timestamp=rfc3339(now),
            count=1,
        )
        try:
            await asyncio.to_thread(self.core.create_namespaced_event, namespace, event)
        except ApiException as err:
            log.warning("could not record event %s on %s: %s", reason, meta.get("name"), err)
