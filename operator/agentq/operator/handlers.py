"""kopf watch handlers (``--watcher kopf``): they only feed the controller's cache.

The default watch machinery is ``agentq.operator.informer``; kopf is the
design's named framework and a supported mode held to the same guarantees
(``agentq.operator.kopfwatch``: watch health, a real synced signal). All
handlers are ``async`` so they run on the event loop (kopf runs sync handlers
in threads, and the cache is not thread-safe) and return at once; no handler
calls the API server. Only ``on.event`` is used: it needs no finalizers or
progress annotations, so kopf writes nothing to our objects.

kopf logs in with agentq's own credentials (``agentq.kube``: exec plugins,
rotated ServiceAccount tokens); when kopf asks again (a 401, or the
credential's expiry passed) the credential is refreshed first.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import kopf

from agentq import GROUP, VERSION, kube, protocol
from agentq.operator.controller import Controller
from agentq.operator.port import Body


async def connection_info(
    kubeconfig: kube.KubeConfig, *, refused: int | None = None
) -> kopf.ConnectionInfo:
    """kopf's login for ``kubeconfig``: the current credential, obtained anew if it is
    still the one kopf had before (generation ``refused``; another client of ours may
    have refreshed it already)."""
    credentials = kubeconfig.credentials
    if refused is not None:
        await credentials.refresh(refused)
    auth = await credentials.current()
    header = str(auth.headers.get("Authorization", ""))
    scheme, _, value = header.partition(" ")
    username = password = token = None
    if scheme == "Basic":
        username, _, password = base64.b64decode(value).decode().partition(":")
    elif scheme:
        token = value
    cert = auth.cert or kubeconfig.cert
    return kopf.ConnectionInfo(
        server=kubeconfig.server,
        ca_data=kubeconfig.ca,
        insecure=kubeconfig.insecure or None,
        scheme="Bearer" if token else None,
        token=token,
        username=username,
        password=password,
        certificate_data=cert[0] if cert else None,
        private_key_data=cert[1] if cert else None,
        default_namespace=kubeconfig.namespace,
        expiration=auth.expires,
    )


def make_registry(
    controller: Controller,
    kubeconfig: kube.KubeConfig,
    on_fed: Callable[[str, str, Body], None] = lambda plural, kind, body: None,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    given: list[int] = []  # the credential's generation kopf was last given

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf asks again after a 401 or once the credential expired: refresh it then.
        info = await connection_info(kubeconfig, refused=given[-1] if given else None)
        given.append(kubeconfig.credentials.generation)
        return info

    def feed(plural: str, event: kopf.RawEvent) -> None:
        kind = str(event.get("type") or "MODIFIED")
        body = dict(event["object"])
        controller.observe(plural, kind, body)
        on_fed(plural, kind, body)

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
