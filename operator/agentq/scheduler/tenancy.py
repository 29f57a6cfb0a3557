"""Which queue is served next: hierarchical deficit round-robin by cost over a queue tree.

The first of the two dispatch levels of ``docs/tenancy.md``: siblings at every
level of the tree share by weight, within one maximum task cost; the
worker-level core (:mod:`agentq.scheduler.ledger`) then picks the worker for the
task the chosen queue offers. Pure: no I/O, no clock, no randomness.

State, in the notation of the docs: per queue ``i`` a weight ``w_i`` and a tag
``v_i`` (normalized served cost); per inner node ``P`` (and the implicit root) a
virtual time ``V_P``; ``C`` the largest cost charged so far. A queue is
*backlogged* when it is a leaf with dispatchable tasks or an inner queue with a
backlogged child.

- ``pick``: from the root down, the backlogged child with the least
  ``(v, name)``, past excluded leaves; changes nothing.
- ``charge``: per queue of the path, ``V_P := max(V_P, v_i)`` and
  ``v_i := max(v_i, V_P - 2C / w_i) + c / w_i``.
- a queue that becomes backlogged joins at ``max(v_i, V_P, m)``, ``m`` the least
  tag of its backlogged siblings: idle queues bank no credit.

:class:`QueueTree` keeps each node's backlogged children in a heap (a decision
costs O(depth log fan-out)); :class:`ReferenceQueueTree` scans them (O(n)).
Both share every transition, so a test can demand the same decisions.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

__all__ = [
    "CREDIT_CAP_TASKS",
    "Charge",
    "QueueCycleError",
    "QueueSpec",
    "QueueState",
    "QueueTree",
    "ReferenceQueueTree",
    "UnknownQueueError",
]

#: A backlogged queue passed over (no worker could take its head) keeps its place
#: but claims at most this many of the largest tasks' worth of credit afterwards.
CREDIT_CAP_TASKS = 2.0

_Entry = tuple[float, str, int]  # (tag, child name, child version)


class UnknownQueueError(KeyError):
    """A queue name the tree has never been told about (or that was removed)."""


class QueueCycleError(ValueError):
    """A parent that would make a queue its own ancestor: refused, nothing changed."""


@dataclass(frozen=True)
class QueueSpec:
    """What the core knows of one AgentQueue: its name, parent (None: top level), weight."""

    name: str
    parent: str | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a queue needs a name")
        if self.parent == self.name:
            raise QueueCycleError(f"queue {self.name!r} cannot be its own parent")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(
                f"queue {self.name!r}: weight must be a finite number > 0, got {self.weight!r}"
            )


@dataclass(frozen=True)
class QueueState:
    """A snapshot of one queue's bookkeeping (for status, metrics and tests).

    ``credit`` is ``w (V_parent - v)`` in cost units (negative: served ahead of
    the last queue served beside it); ``attached``: reachable from the root.
    """

    tag: float
    virtual_time: float
    credit: float
    served_cost: float
    pending: int
    backlogged: bool
    attached: bool


@dataclass(frozen=True)
class Charge:
    """One grant of ``cost`` charged on ``path``: the leaf ``queue`` and its ancestors."""

    queue: str
    cost: float
    path: tuple[str, ...]


class _Node:
    """The tree's record of one queue (or of the root, named '')."""

    __slots__ = (
        "backlogged",
        "children",
        "heap",
        "live",
        "parent",
        "pending",
        "served",
        "spec",
        "tag",
        "version",
        "vtime",
    )

    def __init__(self, spec: QueueSpec) -> None:
        self.spec = spec
        self.tag = 0.0  # v_i
        self.vtime = 0.0  # V_P, as a parent
        self.pending = 0
        self.served = 0.0
        self.parent: _Node | None = None  # None: top level under the root, or detached
        self.children: dict[str, _Node] = {}
        self.live = 0  # backlogged children
        self.backlogged = False
        self.heap: list[_Entry] = []  # fast index: backlogged children by (tag, name)
        self.version = 0


class _Tree(ABC):
    """State and transitions; subclasses supply the order of a node's backlogged children."""

    def __init__(self) -> None:
        self._root = _Node(QueueSpec("(root)"))
        self._nodes: dict[str, _Node] = {}
        self._waiting: dict[str, set[str]] = {}  # missing parent -> queues naming it
        self._max_cost = 0.0
        self._next_version = 0
        #: Children and heap entries looked at by decisions so far: the counted
        #: operation of the cost-per-decision test (not wall time).
        self.examined = 0

    # -- the two indexes ----------------------------------------------------------------

    @abstractmethod
    def _ordered(self, node: _Node, exclude: frozenset[str]) -> str | None:
        """The leaf to serve under ``node``: its backlogged children by (tag, name),
        each tried in turn, the first whose subtree has a leaf not in ``exclude``."""

    @abstractmethod
    def _least_tag(self, node: _Node) -> float:
        """The least tag of ``node``'s backlogged children (``-inf`` if none)."""

    @abstractmethod
    def _changed(self, parent: _Node, child: _Node) -> None:
        """``child``'s tag or backlog changed (hook for the heap index)."""

    # -- tree shape ---------------------------------------------------------------------

    def _parent_of(self, node: _Node) -> _Node | None:
        """The node ``node`` competes under: the root for a top-level queue, None if
        its parent is missing."""
        if node.spec.parent is None:
            return self._root
        return node.parent

    def _bump(self, node: _Node) -> None:
        self._next_version += 1
        node.version = self._next_version

    def _attached(self, node: _Node) -> bool:
        while node is not self._root:
            up = self._parent_of(node)
            if up is None:
                return False
            node = up
        return True

    def _recompute(self, node: _Node) -> None:
        """Make ``node``'s backlog agree with its children or pending count, upwards."""
        while node is not self._root:
            now = node.live > 0 if node.children else node.pending > 0
            if now == node.backlogged:
                return
            parent = self._parent_of(node)
            if parent is not None and now:
                # Joins even with the least served of its siblings: no banked credit.
                least = self._least_tag(parent)
                parent.vtime = max(parent.vtime, least)
                node.tag = max(node.tag, parent.vtime)
            node.backlogged = now
            self._bump(node)
            if parent is None:
                return
            parent.live += 1 if now else -1
            self._changed(parent, node)
            node = parent
        self._root.backlogged = self._root.live > 0

    def _link(self, node: _Node) -> None:
        """Hang ``node`` under its spec's parent (or on the waiting list)."""
        parent_name = node.spec.parent
        if parent_name is None:
            parent: _Node | None = self._root
        else:
            parent = self._nodes.get(parent_name)
            if parent is None:
                self._waiting.setdefault(parent_name, set()).add(node.spec.name)
        node.parent = parent if parent is not self._root else None
        if parent is None:
            return
        parent.children[node.spec.name] = node
        if node.backlogged:
            node.backlogged = False  # joins now, with the join rule
            self._recompute(node)
        self._recompute(parent)

    def _unlink(self, node: _Node) -> None:
        parent = self._parent_of(node)
        if parent is None:
            waiting = self._waiting.get(node.spec.parent or "")
            if waiting is not None:
                waiting.discard(node.spec.name)
                if not waiting:
                    del self._waiting[node.spec.parent or ""]
            return
        del parent.children[node.spec.name]
        if node.backlogged:
            parent.live -= 1
            self._bump(node)  # its entries in the parent's index are stale from now
        node.parent = None
        self._recompute(parent)
        # Detached now: keep its backlog as it is, to join with the rule when linked.

    def _would_cycle(self, name: str, parent: str | None) -> bool:
        seen = 0
        while parent is not None and seen <= len(self._nodes):
            if parent == name:
                return True
            node = self._nodes.get(parent)
            if node is None:
                return False
            parent = node.spec.parent
            seen += 1
        return False

    def upsert_queue(self, spec: QueueSpec) -> None:
        """Add a queue or apply a changed spec. A weight change keeps its credit; a
        parent that would close a cycle raises :class:`QueueCycleError` and changes
        nothing; a missing parent leaves the queue detached until it appears."""
        if self._would_cycle(spec.name, spec.parent):
            raise QueueCycleError(f"queue {spec.name!r}: parent {spec.parent!r} makes a cycle")
        node = self._nodes.get(spec.name)
        if node is None:
            node = _Node(spec)
            self._nodes[spec.name] = node
            parent = self._parent_of_spec(spec)
            if parent is not None:
                node.tag = parent.vtime
            self._link(node)
            for orphan in sorted(self._waiting.pop(spec.name, set())):
                self._link(self._nodes[orphan])
            return
        old = node.spec
        if old == spec:
            return
        if old.parent != spec.parent:
            self._unlink(node)
            node.spec = spec
            new_parent = self._parent_of_spec(spec)
            if new_parent is not None:
                node.tag = max(node.tag, new_parent.vtime)
            self._link(node)
            return
        parent = self._parent_of(node)
        if parent is not None and old.weight != spec.weight:
            credit = old.weight * (parent.vtime - node.tag)
            node.tag = parent.vtime - credit / spec.weight
        node.spec = spec
        self._bump(node)
        if parent is not None and node.backlogged:
            self._changed(parent, node)

    def _parent_of_spec(self, spec: QueueSpec) -> _Node | None:
        return self._root if spec.parent is None else self._nodes.get(spec.parent)

    def remove_queue(self, name: str) -> None:
        """Forget a queue; its children stay, detached until a queue of that name returns."""
        node = self._nodes.get(name)
        if node is None:
            raise UnknownQueueError(name)
        self._unlink(node)
        del self._nodes[name]
        for child in list(node.children.values()):
            if child.backlogged:
                self._bump(child)
            child.parent = None
            self._waiting.setdefault(name, set()).add(child.spec.name)

    def set_pending(self, name: str, count: int) -> None:
        """How many dispatchable tasks the queue holds now (level-triggered)."""
        node = self._nodes.get(name)
        if node is None:
            raise UnknownQueueError(name)
        if count < 0:
            raise ValueError(f"queue {name!r}: pending must be >= 0, got {count!r}")
        node.pending = count
        self._recompute(node)

    # -- decisions ----------------------------------------------------------------------

    def pick(self, exclude: frozenset[str] = frozenset()) -> str | None:
        """The leaf to serve next (None: no backlogged leaf outside ``exclude``).

        Changes nothing: a pass that places nothing leaves the shares as they were.
        """
        if not self._root.backlogged:
            return None
        return self._ordered(self._root, exclude)

    def _try(self, child: _Node, exclude: frozenset[str]) -> str | None:
        if not child.children:
            return None if child.spec.name in exclude else child.spec.name
        return self._ordered(child, exclude)

    def charge(self, name: str, cost: float) -> Charge:
        """A grant of ``cost`` was made from leaf ``name``: charge every queue on its path."""
        node = self._nodes.get(name)
        if node is None:
            raise UnknownQueueError(name)
        if not (math.isfinite(cost) and cost > 0):
            raise ValueError(f"cost must be a finite number > 0, got {cost!r}")
        self._max_cost = max(self._max_cost, cost)
        path: list[str] = []
        current: _Node | None = node
        while current is not None and current is not self._root:
            parent = self._parent_of(current)
            weight = current.spec.weight
            if parent is not None:
                parent.vtime = max(parent.vtime, current.tag)
                # Credit above the cap is forfeited first, then the cost is spent.
                floor = parent.vtime - CREDIT_CAP_TASKS * self._max_cost / weight
                current.tag = max(current.tag, floor)
            current.tag += cost / weight
            current.served += cost
            path.append(current.spec.name)
            self._bump(current)
            if parent is not None and current.backlogged:
                self._changed(parent, current)
            current = parent
        return Charge(queue=name, cost=cost, path=tuple(path))

    def refund(self, charge: Charge) -> None:
        """The grant's commit failed: give each queue on the path the cost back
        (credit forfeited to the cap at the charge stays forfeited)."""
        for name in charge.path:
            node = self._nodes.get(name)
            if node is None:
                continue
            node.tag -= charge.cost / node.spec.weight
            node.served = max(0.0, node.served - charge.cost)
            self._bump(node)
            parent = self._parent_of(node)
            if parent is not None and node.backlogged:
                self._changed(parent, node)

    # -- reading ------------------------------------------------------------------------

    def queue_state(self, name: str) -> QueueState:
        node = self._nodes.get(name)
        if node is None:
            raise UnknownQueueError(name)
        parent = self._parent_of(node)
        vtime = parent.vtime if parent is not None else node.tag
        return QueueState(
            tag=node.tag,
            virtual_time=node.vtime,
            credit=node.spec.weight * (vtime - node.tag),
            served_cost=node.served,
            pending=node.pending,
            backlogged=node.backlogged,
            attached=self._attached(node),
        )

    def queues(self) -> list[str]:
        """The names of the known queues, sorted."""
        return sorted(self._nodes)

    def children(self, name: str | None) -> list[str]:
        """The queues hanging under ``name`` (None: the top level), sorted."""
        node = self._root if name is None else self._nodes.get(name)
        if node is None:
            raise UnknownQueueError(name)
        return sorted(node.children)

    @property
    def max_cost(self) -> float:
        """``C``: the largest cost charged so far."""
        return self._max_cost


class ReferenceQueueTree(_Tree):
    """The rule as written, by a scan of every node's children (for tests)."""

    def _changed(self, parent: _Node, child: _Node) -> None:
        pass

    def _least_tag(self, node: _Node) -> float:
        self.examined += len(node.children)
        return min((c.tag for c in node.children.values() if c.backlogged), default=-math.inf)

    def _ordered(self, node: _Node, exclude: frozenset[str]) -> str | None:
        self.examined += len(node.children)
        live = sorted(
            ((c.tag, name) for name, c in node.children.items() if c.backlogged),
        )
        for _, name in live:
            found = self._try(node.children[name], exclude)
            if found is not None:
                return found
        return None


class QueueTree(_Tree):
    """Hierarchical DRR by cost on per-node heaps: O(depth log fan-out) per decision."""

    def _valid(self, node: _Node, entry: _Entry) -> bool:
        child = node.children.get(entry[1])
        return child is not None and child.version == entry[2] and child.backlogged

    def _clean(self, node: _Node) -> list[_Entry]:
        heap = node.heap
        while heap:
            self.examined += 1
            if self._valid(node, heap[0]):
                break
            heapq.heappop(heap)
        return heap

    def _changed(self, parent: _Node, child: _Node) -> None:
        if child.backlogged:
            heapq.heappush(parent.heap, (child.tag, child.spec.name, child.version))
            if len(parent.heap) > 4 * parent.live + 64:  # stale entries dominate
                parent.heap = [
                    (c.tag, name, c.version) for name, c in parent.children.items() if c.backlogged
                ]
                heapq.heapify(parent.heap)

    def _least_tag(self, node: _Node) -> float:
        heap = self._clean(node)
        return heap[0][0] if heap else -math.inf

    def _ordered(self, node: _Node, exclude: frozenset[str]) -> str | None:
        set_aside: list[_Entry] = []
        found: str | None = None
        while self._clean(node):
            entry = node.heap[0]
            found = self._try(node.children[entry[1]], exclude)
            if found is not None:
                break
            # Nothing but excluded leaves below: look past it, then put it back.
            set_aside.append(heapq.heappop(node.heap))
        for entry in set_aside:
            heapq.heappush(node.heap, entry)
        return found
