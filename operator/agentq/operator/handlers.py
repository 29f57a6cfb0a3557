"""kopf watch handlers (``--watcher kopf``): they only feed the controller's cache.

The default watch machinery is ``agentq.operator.informer``; kopf is kept as
the alternative the benchmark compares it with (docs/benchmarks.md). All
handlers are ``async`` so they run on the event loop (kopf runs sync handlers
in threads, and the cache is not thread-safe) and return at once; no handler
calls the API server. Only ``on.event`` is used: it needs no finalizers or
progress annotations, so kopf writes nothing to our objects.

kopf reports neither when its first lists are complete nor whether a watch is
connected: in this mode the controller starts deciding after a settling delay
and cannot refuse to judge expiry on a stalled watch (it still re-reads a
Lease before reclaiming it).
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

    def feed(plural: str, event: kopf.RawEvent) -> None:
        controller.observe(plural, str(event.get("type") or "MODIFIED"), dict(event["object"]))

    @kopf.on.event(GROUP, VERSION, "agenttasks", registry=registry)
    async def task_event(event: kopf.RawEvent, **_: Any) -> None:
        feed("agenttasks", event)

    @kopf.on.event(GROUP, VERSION, "agentworkers", registry=registry)
    async def worker_event(event: kopf.RawEvent, **_: Any) -> None:
        feed("agentworkers", event)

    @kopf.on.event(
        "coordination.k8s.io",
        "v1",
        "leases",
        labels={protocol.LABEL_LEASE_KIND: kopf.PRESENT},
        registry=registry,
    )
    async def lease_event(event: kopf.RawEvent, **_: Any) -> None:
        feed("leases", event)

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
