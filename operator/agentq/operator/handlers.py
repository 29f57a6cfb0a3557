"""kopf watch handlers: they only feed the controller's store and tracker.

All handlers are ``async`` so they run on the event loop (kopf runs sync
handlers in threads, and the store is not thread-safe) and return at once; no
handler calls the API server. Only ``on.event`` is used: it needs no
finalizers or progress annotations, so kopf writes nothing to our objects.
"""

from __future__ import annotations

from typing import Any

import kopf

from agentq import GROUP, VERSION, protocol
from agentq.operator.controller import Controller


def make_registry(controller: Controller) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A registry of our own has no default login handlers: use the kubernetes client's
        # configuration (in-cluster service account, else the kubeconfig).
        info: kopf.ConnectionInfo | None = kopf.login_via_client(**kwargs)
        return info

    def raw(event: kopf.RawEvent) -> tuple[dict[str, Any], bool]:
        return dict(event["object"]), event.get("type") == "DELETED"

    @kopf.on.event(GROUP, VERSION, "agenttasks", registry=registry)
    async def task_event(event: kopf.RawEvent, **_: Any) -> None:
        body, deleted = raw(event)
        controller.observe_task(body, deleted=deleted)

    @kopf.on.event(GROUP, VERSION, "agentworkers", registry=registry)
    async def worker_event(event: kopf.RawEvent, **_: Any) -> None:
        body, deleted = raw(event)
        controller.observe_worker(body, deleted=deleted)

    @kopf.on.event(
        "coordination.k8s.io",
        "v1",
        "leases",
        labels={protocol.LABEL_LEASE_KIND: kopf.PRESENT},
        registry=registry,
    )
    async def lease_event(event: kopf.RawEvent, **_: Any) -> None:
        body, deleted = raw(event)
        controller.observe_lease(body, deleted=deleted)

    return registry


def make_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # kopf would post its log lines as Kubernetes events; agentq posts its own, one per
    # transition, and never one per renewal.
    settings.posting.enabled = False
    # Reconnect watches regularly so a silently dropped connection costs little.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    return settings
