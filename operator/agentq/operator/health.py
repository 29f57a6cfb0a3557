"""Whether the watches are connected and current.

Expiry is judged from what the watches show, so it is judged only while every
watch is healthy: a stalled watch looks exactly like every holder dying. The
informers report their health here; when all are healthy again the listeners
(the controller) look at every claim. ``agentq_watch_healthy{resource}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agentq.operator import metrics


class WatchHealth:
    """Whether the watches are connected and current; expiry is judged only while they are."""

    def __init__(self, resources: Iterable[str] = ()) -> None:
        self._healthy = dict.fromkeys(resources, False)
        self._listeners: list[Callable[[], None]] = []

    def set(self, resource: str, healthy: bool) -> None:
        was = self.healthy
        self._healthy[resource] = healthy
        metrics.WATCH_HEALTHY.labels(resource).set(1 if healthy else 0)
        if self.healthy and not was:
            for listener in self._listeners:
                listener()

    @property
    def healthy(self) -> bool:
        return all(self._healthy.values())

    def on_healthy(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)


class AlwaysHealthy(WatchHealth):
    """A controller built without watches (the unit harness); both watcher modes report
    their health (the informer itself, kopf through ``kopfwatch``)."""

    @property
    def healthy(self) -> bool:
        return True


__all__ = ["AlwaysHealthy", "WatchHealth"]
