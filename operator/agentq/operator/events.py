"""Kubernetes Events for transitions, recorded off the decision path.

A decision never waits for its Event: events go to a bounded queue drained by
a few writers. When the API server is slower than the transitions (a burst of
reclaims), the queue drops its oldest events and counts them
(``agentq_events_dropped_total``): an Event is a note for people, the status
is the record.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from agentq.clock import Clock, rfc3339
from agentq.operator import metrics
from agentq.operator.port import Kube, KubeError

log = logging.getLogger("agentq.events")

MESSAGE_LIMIT = 1024


class Involved:
    """What an Event is about: an object's identity (enough for ``involvedObject``)."""

    __slots__ = ("api_version", "kind", "name", "namespace", "resource_version", "uid")

    def __init__(
        self, *, kind: str, namespace: str, name: str, uid: str, resource_version: str = ""
    ) -> None:
        self.api_version = "agentq.dev/v1alpha1"
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.uid = uid
        self.resource_version = resource_version


class EventSink:
    def __init__(
        self, kube: Kube, clock: Clock, *, component: str, limit: int = 20_000, writers: int = 4
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.component = component
        self.limit = limit
        self.writers = writers
        self._queue: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def record(self, involved: Involved, *, reason: str, message: str, warning: bool) -> None:
        now = rfc3339(self.clock.now())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved.name}."},
            "involvedObject": {
                "apiVersion": involved.api_version,
                "kind": involved.kind,
                "name": involved.name,
                "namespace": involved.namespace,
                "uid": involved.uid,
                "resourceVersion": involved.resource_version,
            },
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._queue.append((involved.namespace, body))
        while len(self._queue) > self.limit:
            self._queue.popleft()
            metrics.EVENTS_DROPPED.inc()
        self._wake.set()

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._drain(), name=f"events-{i}") for i in range(self.writers)
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def flush(self) -> None:
        """Write everything queued now (tests, and shutdown)."""
        while self._queue:
            namespace, body = self._queue.popleft()
            await self._write(namespace, body)

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def _drain(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            namespace, body = self._queue.popleft()
            await self._write(namespace, body)

    async def _write(self, namespace: str, body: dict[str, Any]) -> None:
        try:
            reply = await self.kube.create_event(namespace, body)
            if not reply.ok:
                log.warning("event %s refused: %s", body["reason"], reply.message)
        except KubeError as err:
            log.warning("could not record event %s: %s", body["reason"], err)
