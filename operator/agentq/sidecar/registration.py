"""Creates the worker's AgentWorker, or brings its spec in line with the sidecar's flags.

Optional: only when ``--capabilities`` is given. Runs once at start, retried
with backoff while the API server is away; a spec the API server refuses (422)
is logged and not retried. ``paused`` is never touched: cordoning is a person's
decision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from agentq import GROUP, VERSION
from agentq.kube import Backoff
from agentq.sidecar.kubeapi import ApiError, KubeApi, custom_path

log = logging.getLogger("agentq.sidecar.registration")


async def register(
    api: KubeApi,
    *,
    namespace: str,
    worker: str,
    spec: dict[str, Any],
    stop: asyncio.Event,
    owner: dict[str, Any] | None = None,
    on_registered: Callable[[dict[str, Any]], None] = lambda worker: None,
) -> bool:
    """Create or update ``AgentWorker/<worker>`` with ``spec``; True once it matches,
    after ``on_registered`` is given the AgentWorker. ``owner`` (an ownerReference, the
    pod's): set when it is created, so the garbage collector deletes it with the pod (a
    pool's worker)."""
    backoff = Backoff(initial=0.5, maximum=10.0)
    path = custom_path(GROUP, VERSION, namespace, "agentworkers", worker)
    while not stop.is_set():
        try:
            try:
                current = await api.request("GET", path, resource="agentworkers")
            except ApiError as err:
                if err.status != 404:
                    raise
                body = {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "AgentWorker",
                    "metadata": {
                        "name": worker,
                        "namespace": namespace,
                        **({"ownerReferences": [owner]} if owner else {}),
                    },
                    "spec": spec,
                }
                created = await api.request(
                    "POST",
                    custom_path(GROUP, VERSION, namespace, "agentworkers", None),
                    body=body,
                    resource="agentworkers",
                )
                log.info("registered AgentWorker %s/%s: %s", namespace, worker, spec)
                on_registered(created)
                return True
            have = current.get("spec") or {}
            changes = {k: v for k, v in spec.items() if _differs(have.get(k), v)}
            if changes:
                await api.request(
                    "PATCH",
                    path,
                    body={"spec": changes},
                    content_type="application/merge-patch+json",
                    resource="agentworkers",
                )
                log.info("updated AgentWorker %s/%s: %s", namespace, worker, changes)
            on_registered(current)
            return True
        except ApiError as err:
            if err.status == 409:
                continue  # created by someone else in between: read it and compare
            if err.status in (400, 403, 422):
                log.error("cannot register AgentWorker %s/%s: %s", namespace, worker, err)
                return False
            log.warning("registering AgentWorker %s/%s: %s; retrying", namespace, worker, err)
            await backoff.sleep(stop)
    return False


def _differs(have: Any, want: Any) -> bool:
    if isinstance(want, list) and isinstance(have, list):
        return sorted(map(str, have)) != sorted(map(str, want))
    if isinstance(want, int | float) and isinstance(have, int | float):
        return float(have) != float(want)
    return bool(have != want)
