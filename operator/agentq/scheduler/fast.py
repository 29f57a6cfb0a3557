"""The scheduler the operator uses: the dispatch rule on an index, no scan of the fleet.

Workers are grouped by their exact capability set (fleets use a handful of
coarse capability sets). A task can go to any group whose set covers its
requirement; within a group the best worker is the top of a heap, so a decision
costs O(G log n) for G matching groups instead of O(n).

The rule orders available workers by ``(max(tag, V - K) + load / weight, name)``
(see :mod:`agentq.scheduler.ledger`). The parts of that key are kept where
their order does not change as rounds pass:

- ``open``: uncapped workers by ``tag + load / weight``. Earning credit moves
  every tag's distance to ``V`` by the same amount, so this order only changes
  when a worker is charged, refunded or its load changes -- and then the
  worker is re-pushed.
- ``watch``: the same workers by ``tag``, to find those that fell more than
  ``K`` rounds behind (``tag < V - K``): their credit is at the cap, so their
  key becomes ``V - K + load / weight``.
- ``capped``: those workers by ``load / weight`` -- among capped workers only
  the load tells them apart, whatever ``V`` is.

``V - K`` only rises between aborts and cap changes, so a worker moves from
``open`` to ``capped`` at most once per charge. When it falls (an abort steps
``V`` back, or a larger task raises the adaptive cap) every capped worker goes
back to ``open`` and is re-examined. Heap entries are invalidated lazily by a
version number and the heaps are rebuilt when stale entries dominate.

A task's ``avoid`` set (the workers of its failed attempts) costs nothing unless
a group's best worker is in it; then the group looks past at most ``len(avoid)``
entries per heap (popped and pushed back), so a decision stays
O(G (1 + |avoid|) log n).
"""

from __future__ import annotations

import heapq
import math

from agentq.scheduler.ledger import Ledger, _Worker

__all__ = ["Scheduler"]

# Cache of "requirement -> matching groups" kept below this many entries.
_MATCH_CACHE_LIMIT = 4096

_Entry = tuple[float, str, int]  # (key, worker name, worker version)


class _Group:
    """The available workers sharing one capability set, in three heaps."""

    __slots__ = ("capabilities", "capped", "members", "open", "watch")

    def __init__(self, capabilities: frozenset[str]) -> None:
        self.capabilities = capabilities
        self.members: dict[str, _Worker] = {}
        self.open: list[_Entry] = []  # uncapped: (tag + load / weight, name, version)
        self.watch: list[_Entry] = []  # uncapped: (tag, name, version)
        self.capped: list[_Entry] = []  # capped: (load / weight, name, version)

    def push(self, worker: _Worker) -> None:
        name, version = worker.spec.name, worker.version
        heapq.heappush(self.open, (worker.tag + worker.load / worker.spec.weight, name, version))
        heapq.heappush(self.watch, (worker.tag, name, version))
        if len(self.open) + len(self.watch) + len(self.capped) > 6 * len(self.members) + 192:
            self.rebuild()

    def rebuild(self) -> None:
        """Drop every stale entry (amortized: runs after O(members) pushes)."""
        self.open, self.watch, self.capped = [], [], []
        for name, worker in self.members.items():
            if not worker.available:
                continue
            version, weight = worker.version, worker.spec.weight
            if worker.capped:
                self.capped.append((worker.load / weight, name, version))
            else:
                self.open.append((worker.tag + worker.load / weight, name, version))
                self.watch.append((worker.tag, name, version))
        for heap in (self.open, self.watch, self.capped):
            heapq.heapify(heap)

    def _top(
        self, heap: list[tuple[float, str, int]], *, capped: bool
    ) -> list[tuple[float, str, int]]:
        """Pop stale entries (a left worker, an older version, the other heap's
        worker) until the top is current; returns ``heap``."""
        members = self.members
        while heap:
            _, name, version = heap[0]
            worker = members.get(name)
            if worker is None or worker.version != version or worker.capped != capped:
                heapq.heappop(heap)
            else:
                break
        return heap

    def _first_outside(
        self, heap: list[tuple[float, str, int]], *, capped: bool, avoid: frozenset[str]
    ) -> tuple[float, str, int] | None:
        """The heap's least current entry of a worker not in ``avoid`` (None if there is
        none). Current entries of avoided workers are popped to look past them and pushed
        back: at most ``len(avoid)`` of them."""
        set_aside: list[tuple[float, str, int]] = []
        found: tuple[float, str, int] | None = None
        while self._top(heap, capped=capped):
            if heap[0][1] not in avoid:
                found = heap[0]
                break
            set_aside.append(heapq.heappop(heap))
        for entry in set_aside:
            heapq.heappush(heap, entry)
        return found

    def best(
        self, threshold: float, avoid: frozenset[str]
    ) -> tuple[tuple[float, str] | None, tuple[float, str] | None, float]:
        """The least ``(key, name)`` among this group's available workers outside
        ``avoid``, the least among all of them, and their least ``max(tag, threshold)``."""
        members = self.members
        watch = self.watch
        while watch:
            tag, name, version = watch[0]
            worker = members.get(name)
            if worker is None or worker.version != version or worker.capped:
                heapq.heappop(watch)
            elif tag < threshold:
                heapq.heappop(watch)
                worker.capped = True
                heapq.heappush(self.capped, (worker.load / worker.spec.weight, name, version))
            else:
                break
        # Every uncapped worker's tag is now >= threshold: its open key is the rule's key.
        opened = self._top(self.open, capped=False)
        capped = self._top(self.capped, capped=True)
        best: tuple[float, str] | None = None
        floor = math.inf
        if opened:
            best = (opened[0][0], opened[0][1])
            floor = watch[0][0]  # every uncapped worker has an entry in both heaps
        if capped:
            # Same arithmetic as the reference: max(tag, threshold) + load / weight.
            candidate = (threshold + capped[0][0], capped[0][1])
            if best is None or candidate < best:
                best = candidate
            floor = threshold
        if best is None or best[1] not in avoid:
            return best, best, floor
        # The group's best is to be avoided: look past the avoided workers.
        preferred: tuple[float, str] | None = None
        entry = self._first_outside(self.open, capped=False, avoid=avoid)
        if entry is not None:
            preferred = (entry[0], entry[1])
        entry = self._first_outside(self.capped, capped=True, avoid=avoid)
        if entry is not None:
            candidate = (threshold + entry[0], entry[1])
            if preferred is None or candidate < preferred:
                preferred = candidate
        return preferred, best, floor


class Scheduler(Ledger):
    """Weighted deficit round-robin with capability matching, on a capability-group index.

    Makes exactly the decisions of :class:`agentq.scheduler.reference.ReferenceScheduler`
    (a test proves it) at a cost per decision that does not grow with the fleet
    beyond a logarithm per matching capability set.
    """

    def __init__(self, *, credit_cap: float | None = None) -> None:
        super().__init__(credit_cap=credit_cap)
        self._groups: dict[frozenset[str], _Group] = {}
        self._matching: dict[frozenset[str], tuple[_Group, ...]] = {}
        self._next_version = 0
        # The highest V - K at which workers were moved to a "capped" heap since the
        # last time they were all moved back; below it those moves may be wrong.
        self._cap_level = -math.inf

    def _on_added(self, worker: _Worker) -> None:
        capabilities = worker.spec.capabilities
        group = self._groups.get(capabilities)
        if group is None:
            group = self._groups[capabilities] = _Group(capabilities)
            self._matching.clear()
        group.members[worker.spec.name] = worker

    def _on_removed(self, worker: _Worker) -> None:
        capabilities = worker.spec.capabilities
        group = self._groups[capabilities]
        del group.members[worker.spec.name]
        if not group.members:
            del self._groups[capabilities]
            self._matching.clear()

    def _on_changed(self, worker: _Worker) -> None:
        self._next_version += 1
        worker.version = self._next_version
        worker.capped = False
        if worker.available:
            self._groups[worker.spec.capabilities].push(worker)

    def _uncap_all(self) -> None:
        for group in self._groups.values():
            entries, group.capped = group.capped, []
            for _, name, version in entries:
                worker = group.members.get(name)
                if worker is not None and worker.version == version and worker.capped:
                    self._on_changed(worker)

    def _groups_for(self, required: frozenset[str]) -> tuple[_Group, ...]:
        groups = self._matching.get(required)
        if groups is None:
            if len(self._matching) >= _MATCH_CACHE_LIMIT:
                self._matching.clear()
            groups = tuple(g for g in self._groups.values() if required <= g.capabilities)
            self._matching[required] = groups
        return groups

    def _select(
        self, required: frozenset[str], threshold: float, avoid: frozenset[str]
    ) -> tuple[_Worker | None, float]:
        if threshold < self._cap_level:
            self._uncap_all()
        self._cap_level = threshold
        best: tuple[float, str] | None = None  # the least key outside ``avoid``
        best_group: _Group | None = None
        fallback: tuple[float, str] | None = None  # the least key of all
        fallback_group: _Group | None = None
        floor = math.inf
        for group in self._groups_for(required):
            preferred, candidate, group_floor = group.best(threshold, avoid)
            if group_floor < floor:
                floor = group_floor
            if preferred is not None and (best is None or preferred < best):
                best, best_group = preferred, group
            if candidate is not None and (fallback is None or candidate < fallback):
                fallback, fallback_group = candidate, group
        if best is not None and best_group is not None:
            return best_group.members[best[1]], floor
        # Every eligible worker is avoided: the least of them (nothing starves).
        if fallback is not None and fallback_group is not None:
            return fallback_group.members[fallback[1]], floor
        return None, floor
