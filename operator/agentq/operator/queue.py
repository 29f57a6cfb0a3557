"""Pending tasks per namespace and required-capability set, by priority then age (Kueue's queues).

Dispatch pops heads instead of sorting every task: a capability set no available
worker covers is skipped whole, in O(1) per set. ``members`` are every pending
task of a set; ``queued`` those that may be granted now, each with a heap entry
(entries of tasks no longer queued, or queued since under another key -- a
changed priority -- are dropped lazily). The order is ``spec.priority``
highest first, then creation time, then name: ``docs/tenancy.md``.

Pure data structure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from agentq.views import Key

__all__ = ["PendingQueue", "QueueKey"]

#: A task's place: (-priority, created, name); the least goes first.
QueueKey = tuple[int, str, str]


@dataclass
class _Set:
    """Pending tasks of one (namespace, capability set)."""

    heap: list[QueueKey] = field(default_factory=list)
    members: set[str] = field(default_factory=set)  # every pending task of the set
    queued: dict[str, QueueKey] = field(default_factory=dict)  # those queued: live entry


class PendingQueue:
    """Pending tasks, per namespace and capability set: highest priority, then oldest
    (created, name), first."""

    def __init__(self) -> None:
        self._sets: dict[str, dict[frozenset[str], _Set]] = {}
        self._where: dict[Key, frozenset[str]] = {}

    def add(
        self, key: Key, required: frozenset[str], created: str, *, ready: bool, priority: int = 0
    ) -> None:
        """``key`` is pending; ``ready``: it may be granted now (else it waits, a member)."""
        namespace, name = key
        old = self._where.get(key)
        if old is not None and old != required:
            self.remove(key)
        entry = self._sets.setdefault(namespace, {}).setdefault(required, _Set())
        entry.members.add(name)
        self._where[key] = required
        place = (-priority, created, name)
        if not ready:
            entry.queued.pop(name, None)
        elif entry.queued.get(name) != place:
            entry.queued[name] = place
            heapq.heappush(entry.heap, place)

    def remove(self, key: Key) -> None:
        """``key`` is no longer pending (its heap entry is dropped lazily)."""
        required = self._where.pop(key, None)
        if required is None:
            return
        namespace, name = key
        entry = self._sets[namespace][required]
        entry.members.discard(name)
        entry.queued.pop(name, None)
        if not entry.members:
            del self._sets[namespace][required]
            if not self._sets[namespace]:
                del self._sets[namespace]

    def contains(self, key: Key) -> bool:
        return key in self._where

    def namespaces(self) -> list[str]:
        return list(self._sets)

    def sets(self, namespace: str) -> dict[frozenset[str], _Set]:
        return self._sets.get(namespace, {})

    def members(self, namespace: str, required: frozenset[str]) -> set[str]:
        entry = self._sets.get(namespace, {}).get(required)
        return entry.members if entry is not None else set()

    def head(self, namespace: str, required: frozenset[str]) -> QueueKey | None:
        """The first dispatchable task of the set (its place; the name is last), without
        removing it."""
        entry = self._sets.get(namespace, {}).get(required)
        if entry is None:
            return None
        heap = entry.heap
        queued = entry.queued
        while heap and queued.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        if len(heap) > 2 * len(queued) + 64:  # stale entries dominate: compact
            entry.heap = [e for e in heap if queued.get(e[2]) == e]
            heapq.heapify(entry.heap)
            heap = entry.heap
        return heap[0] if heap else None

    def pop(self, namespace: str, required: frozenset[str]) -> None:
        """Take the head of the set off the queue (it stays a member until ``remove``)."""
        entry = self._sets[namespace][required]
        if self.head(namespace, required) is None:
            return
        name = heapq.heappop(entry.heap)[2]
        entry.queued.pop(name, None)

    def queued(self, key: Key) -> bool:
        """Whether ``key`` may be granted now (has a live heap entry)."""
        required = self._where.get(key)
        if required is None:
            return False
        return key[1] in self._sets[key[0]][required].queued

    def unqueue(self, key: Key) -> None:
        """``key`` stays pending but may not be granted now (its heap entry goes lazily)."""
        required = self._where.get(key)
        if required is not None:
            self._sets[key[0]][required].queued.pop(key[1], None)

    def items(self) -> Iterator[tuple[Key, frozenset[str], bool]]:
        """Every member: (key, its capability set, queued)."""
        for namespace, sets in self._sets.items():
            for required, entry in sets.items():
                for name in entry.members:
                    yield (namespace, name), required, name in entry.queued

    def __len__(self) -> int:
        return len(self._where)
