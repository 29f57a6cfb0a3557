"""Pending tasks per lane and set, by priority then age (Kueue's queues).

A *lane* is ``(namespace, queue)``: the tasks of a namespace without
``spec.queue`` are its lane ``(namespace, "")``; the tasks admitted to a leaf
AgentQueue are the lane ``(namespace, queue)`` (``docs/tenancy.md``).

A *set* is keyed ``(required capabilities, budget names)`` (``SetKey``): the tasks
of a lane that need the same capabilities and name the same AgentBudgets
(docs/budgets.md). Dispatch pops heads instead of sorting every task: a set no
available worker covers, or whose head a budget refuses now, is skipped whole,
in O(1) per set. ``members`` are every pending
task of a set; ``queued`` those that may be granted now, each with a heap entry
(entries of tasks no longer queued, or queued since under another key -- a
changed priority -- are dropped lazily). The order is ``spec.priority``
highest first, then creation time, then name: ``docs/tenancy.md``.

``touched``: the queue lanes whose queued tasks changed since the queue level
last read their counts (``tenants.QueueLevel.refresh``).

Pure data structure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from agentq.views import Key

__all__ = ["Lane", "PendingQueue", "QueueKey", "SetKey"]

#: A task's place: (-priority, created, name); the least goes first.
QueueKey = tuple[int, str, str]
#: (namespace, AgentQueue name; "" for the namespace's tasks without spec.queue)
Lane = tuple[str, str]
#: (required capabilities, the names of the AgentBudgets its tasks name)
SetKey = tuple[frozenset[str], frozenset[str]]


@dataclass
class _Set:
    """Pending tasks of one (lane, capability set, budget names)."""

    heap: list[QueueKey] = field(default_factory=list)
    members: set[str] = field(default_factory=set)  # every pending task of the set
    queued: dict[str, QueueKey] = field(default_factory=dict)  # those queued: live entry


class PendingQueue:
    """Pending tasks, per lane and set (capabilities, budgets): highest priority, then
    oldest (created, name), first."""

    def __init__(self) -> None:
        self._sets: dict[Lane, dict[SetKey, _Set]] = {}
        self._where: dict[Key, tuple[Lane, SetKey]] = {}
        self._lanes_of: dict[str, set[Lane]] = {}  # namespace -> its lanes
        self.touched: set[Lane] = set()  # queue lanes whose queued tasks changed

    def add(
        self,
        key: Key,
        required: frozenset[str],
        created: str,
        *,
        ready: bool,
        priority: int = 0,
        queue: str = "",
        budgets: frozenset[str] = frozenset(),
    ) -> None:
        """``key`` is pending; ``ready``: it may be granted now (else it waits, a member)."""
        namespace, name = key
        lane = (namespace, queue)
        where = (required, budgets)
        old = self._where.get(key)
        if old is not None and old != (lane, where):
            self.remove(key)
        sets = self._sets.get(lane)
        if sets is None:
            sets = self._sets[lane] = {}
            self._lanes_of.setdefault(namespace, set()).add(lane)
        entry = sets.get(where)
        if entry is None:
            entry = sets[where] = _Set()
        entry.members.add(name)
        self._where[key] = (lane, where)
        place = (-priority, created, name)
        if not ready:
            if entry.queued.pop(name, None) is not None and queue:
                self.touched.add(lane)
        elif entry.queued.get(name) != place:
            entry.queued[name] = place
            heapq.heappush(entry.heap, place)
            if queue:
                self.touched.add(lane)

    def remove(self, key: Key) -> None:
        """``key`` is no longer pending (its heap entry is dropped lazily)."""
        where = self._where.pop(key, None)
        if where is None:
            return
        lane, required = where
        sets = self._sets[lane]
        entry = sets[required]
        entry.members.discard(key[1])
        if entry.queued.pop(key[1], None) is not None and lane[1]:
            self.touched.add(lane)
        if not entry.members:
            del sets[required]
            if not sets:
                del self._sets[lane]
                lanes = self._lanes_of[lane[0]]
                lanes.discard(lane)
                if not lanes:
                    del self._lanes_of[lane[0]]

    def contains(self, key: Key) -> bool:
        return key in self._where

    def lanes(self) -> list[Lane]:
        return list(self._sets)

    def namespaces(self) -> list[str]:
        return list(self._lanes_of)

    def lanes_of(self, namespace: str) -> set[Lane]:
        return self._lanes_of.get(namespace, set())

    def sets(self, lane: Lane) -> dict[SetKey, _Set]:
        return self._sets.get(lane, {})

    def required_sets(self, namespace: str) -> set[frozenset[str]]:
        """The capability sets some pending task of ``namespace`` (any lane) requires."""
        return {where[0] for lane in self.lanes_of(namespace) for where in self._sets[lane]}

    def members(self, lane: Lane, required: frozenset[str]) -> set[str]:
        """The pending tasks of ``lane`` that require ``required`` (whatever budgets)."""
        sets = self._sets.get(lane, {})
        found = [entry.members for where, entry in sets.items() if where[0] == required]
        return found[0] if len(found) == 1 else set().union(*found)

    def queued_count(self, lane: Lane) -> int:
        """How many tasks of ``lane`` may be granted now."""
        return sum(len(entry.queued) for entry in self._sets.get(lane, {}).values())

    def head(self, lane: Lane, required: SetKey) -> QueueKey | None:
        """The first dispatchable task of the set (its place; the name is last), without
        removing it."""
        entry = self._sets.get(lane, {}).get(required)
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

    def pop(self, lane: Lane, required: SetKey) -> None:
        """Take the head of the set off the queue (it stays a member until ``remove``)."""
        entry = self._sets[lane][required]
        if self.head(lane, required) is None:
            return
        name = heapq.heappop(entry.heap)[2]
        entry.queued.pop(name, None)
        if lane[1]:
            self.touched.add(lane)

    def queued(self, key: Key) -> bool:
        """Whether ``key`` may be granted now (has a live heap entry)."""
        where = self._where.get(key)
        if where is None:
            return False
        return key[1] in self._sets[where[0]][where[1]].queued

    def unqueue(self, key: Key) -> None:
        """``key`` stays pending but may not be granted now (its heap entry goes lazily)."""
        where = self._where.get(key)
        if where is not None:
            lane, required = where
            if self._sets[lane][required].queued.pop(key[1], None) is not None and lane[1]:
                self.touched.add(lane)

    def items(self) -> Iterator[tuple[Key, Lane, frozenset[str], bool]]:
        """Every member: (key, its lane, its capability set, queued)."""
        for lane, sets in self._sets.items():
            for (required, _), entry in sets.items():
                for name in entry.members:
                    yield (lane[0], name), lane, required, name in entry.queued

    def set_of(self, key: Key) -> SetKey | None:
        """The set ``key`` is a member of (None: not pending)."""
        where = self._where.get(key)
        return None if where is None else where[1]

    def __len__(self) -> int:
        return len(self._where)
