"""Kubernetes Events for transitions, recorded off the decision path.

A decision never waits for its Event: events go to a bounded queue drained by
a few writers. The writers take the operator's API slots at low priority
(``agentq.operator.slots``): while decisions wait for the API server (a backlog
drain, a burst of reclaims) Events wait, and they are written when the burst is
over -- an Event is a note for people, the status is the record. If they still
fall behind, the queue drops its oldest events and counts them
(``agentq_events_dropped_total``); ``agentq_events_queued`` says how many wait.
A queued event is a small tuple; its body is built when it is written.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, NamedTuple

from agentq.clock import Clock, rfc3339
from agentq.operator import metrics
from agentq.operator.port import Kube, KubeError
from agentq.operator.slots import Slots

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


class _Queued(NamedTuple):
    involved: Involved
    reason: str
    message: str
    warning: bool
    stamp: str


class EventSink:
    def __init__(
        self,
        kube: Kube,
        clock: Clock,
        *,
        component: str,
        limit: int = 20_000,
        writers: int = 4,
        slots: Slots | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.component = component
        self.limit = limit
        self.writers = writers
        self.slots = slots  # the operator's API slots, taken at low priority
        self._queue: collections.deque[_Queued] = collections.deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.written = 0

    def record(self, involved: Involved, *, reason: str, message: str, warning: bool) -> None:
        stamp = rfc3339(self.clock.now())
        self._queue.append(_Queued(involved, reason, message[:MESSAGE_LIMIT], warning, stamp))
        while len(self._queue) > self.limit:
            self._queue.popleft()
            metrics.EVENTS_DROPPED.inc()
        metrics.EVENTS_QUEUED.set(len(self._queue))
        self._wake.set()

    def _body(self, event: _Queued) -> dict[str, Any]:
        involved = event.involved
        return {
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
            "reason": event.reason,
            "message": event.message,
            "type": "Warning" if event.warning else "Normal",
            "source": {"component": self.component},
            "firstTimestamp": event.stamp,
            "lastTimestamp": event.stamp,
            "count": 1,
        }

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
            await self._write(self._queue.popleft(), slot=False)

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def _drain(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._write(self._queue.popleft())

    async def _write(self, event: _Queued, *, slot: bool = True) -> None:
        metrics.EVENTS_QUEUED.set(len(self._queue))
        namespace, body = event.involved.namespace, self._body(event)
        try:
            if slot and self.slots is not None:
                async with self.slots.low():
                    reply = await self.kube.create_event(namespace, body)
            else:
                reply = await self.kube.create_event(namespace, body)
            self.written += 1
            if not reply.ok:
                log.warning("event %s refused: %s", event.reason, reply.message)
        except KubeError as err:
            log.warning("could not record event %s: %s", event.reason, err)
