"""The indexes the controller decides from, kept current by events (Kueue's cache/queue split).

- ``PendingQueue``: pending tasks per namespace and required-capability set, oldest
  first. Dispatch pops heads instead of sorting every task: a capability set no
  available worker covers is skipped whole, in O(1) per set.
- ``Timers``: one heap of deadlines (lease expiry, grace end, retry backoff,
  progress deadline, worker-Lease staleness), entries invalidated lazily: a
  renewal costs no heap operation; when an entry fires, the caller checks the
  current deadline and pushes a new entry if it moved.
- ``Tombstones``: recently deleted objects by resourceVersion, bounded, so a late
  write reply cannot resurrect a deleted task or worker.
- ``Dirty``: the tasks to decide again, first marked first decided: when more are
  marked than a step may decide (500 claims expiring in the same second), the
  earliest expiry is decided first instead of an arbitrary one.

Pure data structures: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

Key = tuple[str, str]
Subject = tuple[str, Key]  # (what kind of deadline, whose)

# Timer kinds: what a due entry asks to look at.
TIMER_TASK = "task"  # a task's claim (lease expiry, grace, progress deadline, progress copy)
TIMER_BACKOFF = "backoff"  # a pending task's retry backoff ends
TIMER_WORKER = "worker"  # a worker Lease may have gone stale
TIMER_PUBLISH = "publish"  # worker status deferred by its interval or the rate limit


def rv_int(resource_version: str) -> int | None:
    """resourceVersions are etcd revisions (increasing integers) on every supported API
    server; a non-numeric one is taken as newer than anything (None)."""
    try:
        return int(resource_version)
    except ValueError:
        return None


def newer(new: str, old: str) -> bool:
    """Whether ``new`` is a later version than ``old`` (equal is not newer)."""
    a, b = rv_int(new), rv_int(old)
    if a is None or b is None:
        return new != old
    return a > b


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
        """``key`` is pending; ``ready``: dispatchable now (not waiting out a backoff)."""
        namespace, name = key
        old = self._where.get(key)
        if old is not None and old != required:
            self.remove(key)
        entry = self._sets.setdefault(namespace, {}).setdefault(required, _Set())
        entry.members.add(name)
        self._where[key] = required
        if ready and name not in entry.queued:
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

    def __len__(self) -> int:
        return len(self._where)


class Timers:
    """Deadlines on the monotonic clock, as one heap; stale entries are dropped by the caller."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Subject]] = []
        self._seq = itertools.count()

    def push(self, due: float, what: Subject) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), what))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Iterator[Subject]:
        """Every entry due at ``now``, earliest first (each popped once)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            yield heapq.heappop(heap)[2]

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)


class Dirty:
    """A set of keys that pops them in the order they were marked (a key marked again
    while waiting keeps its place)."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: OrderedDict[Key, None] = OrderedDict()

    def add(self, key: Key) -> None:
        self._keys.setdefault(key, None)

    def update(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._keys.setdefault(key, None)

    def discard(self, key: Key) -> None:
        self._keys.pop(key, None)

    def pop(self) -> Key:
        """The key marked first; KeyError when empty."""
        return self._keys.popitem(last=False)[0]

    def clear(self) -> None:
        self._keys.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Dirty({list(self._keys)!r})"


class Tombstones:
    """The resourceVersion at which recently deleted objects went, at most ``limit`` of them."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._gone: OrderedDict[Key, str] = OrderedDict()

    def bury(self, key: Key, resource_version: str) -> None:
        self._gone[key] = resource_version
        self._gone.move_to_end(key)
        while len(self._gone) > self.limit:
            self._gone.popitem(last=False)

    def buried(self, key: Key, resource_version: str) -> bool:
        """A body at ``resource_version`` is older than the deletion we saw."""
        gone = self._gone.get(key)
        return gone is not None and not newer(resource_version, gone)

    def revive(self, key: Key) -> None:
        self._gone.pop(key, None)

    def __len__(self) -> int:
        return len(self._gone)
