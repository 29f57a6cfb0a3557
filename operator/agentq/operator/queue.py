"""Pending tasks per namespace and required-capability set, oldest first (Kueue's queues).

Dispatch pops heads instead of sorting every task: a capability set no available
worker covers is skipped whole, in O(1) per set. ``members`` are every pending
task of a set; ``queued`` those that may be granted now, each with a heap entry
(entries of tasks no longer queued are dropped lazily).

Pure data structure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from agentq.views import Key

__all__ = ["PendingQueue"]


@dataclass
class _Set:
    """Pending tasks of one (namespace, capability set)."""

    heap: list[tuple[str, str]] = field(default_factory=list)  # (created, name)
    members: set[str] = field(default_factory=set)  # every pending task of the set
    queued: set[str] = field(default_factory=set)  # those with a live heap entry


class PendingQueue:
    """Pending tasks, per namespace and capability set, oldest (created, name) first."""

    def __init__(self) -> None:
        self._sets: dict[str, dict[frozenset[str], _Set]] = {}
        self._where: dict[Key, frozenset[str]] = {}

    def add(self, key: Key, required: frozenset[str], created: str, *, ready: bool) -> None:
        """``key`` is pending; ``ready``: it may be granted now (else it waits, a member)."""
        namespace, name = key
        old = self._where.get(key)
        if old is not None and old != required:
            self.remove(key)
        entry = self._sets.setdefault(namespace, {}).setdefault(required, _Set())
        entry.members.add(name)
        self._where[key] = required
        if not ready:
            entry.queued.discard(name)
        elif name not in entry.queued:
            entry.queued.add(name)
            heapq.heappush(entry.heap, (created, name))

    def remove(self, key: Key) -> None:
        """``key`` is no longer pending (its heap entry is dropped lazily)."""
        required = self._where.pop(key, None)
        if required is None:
            return
        namespace, name = key
        entry = self._sets[namespace][required]
        entry.members.discard(name)
        entry.queued.discard(name)
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

    def head(self, namespace: str, required: frozenset[str]) -> tuple[str, str] | None:
        """The oldest dispatchable task of the set, without removing it."""
        entry = self._sets.get(namespace, {}).get(required)
        if entry is None:
            return None
        heap = entry.heap
        while heap and heap[0][1] not in entry.queued:
            heapq.heappop(heap)
        if len(heap) > 2 * len(entry.queued) + 64:  # stale entries dominate: compact
            entry.heap = [e for e in heap if e[1] in entry.queued]
            heapq.heapify(entry.heap)
            heap = entry.heap
        return heap[0] if heap else None

    def pop(self, namespace: str, required: frozenset[str]) -> None:
        """Take the head of the set off the queue (it stays a member until ``remove``)."""
        entry = self._sets[namespace][required]
        _, name = heapq.heappop(entry.heap)
        entry.queued.discard(name)

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
            self._sets[key[0]][required].queued.discard(key[1])

    def items(self) -> Iterator[tuple[Key, frozenset[str], bool]]:
        """Every member: (key, its capability set, queued)."""
        for namespace, sets in self._sets.items():
            for required, entry in sets.items():
                for name in entry.members:
                    yield (namespace, name), required, name in entry.queued

    def __len__(self) -> int:
        return len(self._where)
