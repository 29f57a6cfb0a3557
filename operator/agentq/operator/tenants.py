"""AgentQueues in the operator: which queue a pending task may use, and the queue level.

- ``Topology``: the queue tree as the AgentQueue records say -- each readable
  queue's spec, its children, whether it is attached (every ancestor exists, no
  cycle) and why not (``ParentNotFound``, ``Cycle``: the reason of the queue's
  ``Attached`` condition). Rebuilt whenever a queue changes (queues are few, and
  change rarely).
- ``judge``: a pending task's verdict on the queue it names (``docs/tenancy.md``):
  None (admitted: it waits in the lane ``(namespace, queue)``) or why it may not
  be dispatched (``QueueNotFound``, ``QueueForbidden``, ``QueueNotLeaf``,
  ``QueueNotAttached``, ``NoWorkerNamespace``, ``NamespaceNotWatched``,
  ``TaskNameTooLong``).
  ``Indexes`` keeps the verdicts; ``invariants`` judges them again from the
  records with this same rule.
- ``QueueLevel``: the first level of dispatch, a ``scheduler.tenancy.QueueTree``
  fed from the topology and from the pending queue's lanes (each leaf's count of
  tasks that may be granted now), with a namespace's tasks without
  ``spec.queue`` as one implicit leaf (``namespace/<name>``, weight 1) while
  queued tasks share its workers. Its tags are soft state, like a worker's
  credit: a new leader starts afresh.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentq import protocol
from agentq.models import AgentQueueSpec
from agentq.operator.queue import Lane, PendingQueue
from agentq.scheduler.tenancy import Charge, QueueSpec, QueueTree
from agentq.views import QueueView

__all__ = [
    "CROSS_NAMESPACE",
    "CYCLE",
    "IMPLICIT_PREFIX",
    "NAMESPACE_NOT_WATCHED",
    "NO_WORKER_NAMESPACE",
    "PARENT_NOT_FOUND",
    "QUEUE_FORBIDDEN",
    "QUEUE_NOT_ATTACHED",
    "QUEUE_NOT_FOUND",
    "QUEUE_NOT_LEAF",
    "TASK_NAME_TOO_LONG",
    "QueueLevel",
    "Topology",
    "Verdict",
    "judge",
    "owned",
    "topology",
]

QUEUE_NOT_FOUND = "QueueNotFound"
QUEUE_FORBIDDEN = "QueueForbidden"
QUEUE_NOT_LEAF = "QueueNotLeaf"
QUEUE_NOT_ATTACHED = "QueueNotAttached"
NO_WORKER_NAMESPACE = "NoWorkerNamespace"
# Said by operators before cross-namespace claims (kept for the CLI's hints).
CROSS_NAMESPACE = "CrossNamespaceNotSupported"
NAMESPACE_NOT_WATCHED = "NamespaceNotWatched"
# A task whose claim's Lease name across namespaces would not fit whole (253
# characters): only a task named past its CRD's 63-character rule.
TASK_NAME_TOO_LONG = "TaskNameTooLong"

# Why a queue is detached (its Attached condition's reason).
PARENT_NOT_FOUND = "ParentNotFound"
CYCLE = "Cycle"

#: The implicit leaf of a namespace's tasks without spec.queue ("/" is in no queue name).
IMPLICIT_PREFIX = "namespace/"

#: Why a task may not be dispatched through the queue it names: (reason, message).
Verdict = tuple[str, str]


@dataclass(frozen=True)
class Topology:
    """The queue tree the records describe (see the module docstring)."""

    specs: Mapping[str, AgentQueueSpec] = field(default_factory=dict)
    children: Mapping[str, frozenset[str]] = field(default_factory=dict)
    depth: Mapping[str, int] = field(default_factory=dict)  # attached queues: 0 top level
    detached: Mapping[str, str] = field(default_factory=dict)  # queue -> why
    # queue -> PARENT_NOT_FOUND or CYCLE (of the queue whose parent is missing, or the
    # cycle, above it)
    detached_reason: Mapping[str, str] = field(default_factory=dict)

    def ancestors(self, name: str) -> list[str]:
        """``name`` and its ancestors, leaf first (an attached queue's path)."""
        path = [name]
        parent = self.specs[name].parent
        while parent is not None and parent not in path:
            path.append(parent)
            parent = self.specs[parent].parent if parent in self.specs else None
        return path

    def leaves_under(self, name: str) -> list[str]:
        out, stack = [], [name]
        while stack:
            node = stack.pop()
            kids = self.children.get(node)
            if kids:
                stack.extend(kids)
            else:
                out.append(node)
        return out


def topology(queues: Mapping[str, QueueView]) -> Topology:
    """The tree of the readable queues: children, depth of the attached, why the others
    are detached (a missing parent, a cycle)."""
    specs = {name: view.spec for name, view in queues.items() if view.spec is not None}
    children: dict[str, set[str]] = {}
    for name, spec in specs.items():
        if spec.parent is not None:
            children.setdefault(spec.parent, set()).add(name)
    depth: dict[str, int] = {}
    detached: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for start in sorted(specs):
        path: list[str] = []
        node: str | None = start
        base, why, reason = -1, "", ""
        while node is not None:
            if node in depth:
                base = depth[node]
                break
            if node in detached:
                why, reason = detached[node], reasons[node]
                break
            if node in path:
                why = f"its parents form a cycle ({' -> '.join([*path[path.index(node) :], node])})"
                reason = CYCLE
                break
            path.append(node)
            parent = specs[node].parent
            if parent is not None and parent not in specs:
                why = f"its ancestor AgentQueue {parent} does not exist"
                reason = PARENT_NOT_FOUND
                break
            node = parent
        for i, name in enumerate(reversed(path)):
            if why:
                detached[name] = why
                reasons[name] = reason
            else:
                depth[name] = base + 1 + i
    return Topology(
        specs=specs,
        children={name: frozenset(kids) for name, kids in children.items()},
        depth=depth,
        detached=detached,
        detached_reason=reasons,
    )


def owned(name: str, topo: Topology, namespaces: tuple[str, ...]) -> bool:
    """Whether an operator watching ``namespaces`` (empty: every one) speaks for queue
    ``name`` (writes its status and metrics): every leaf of its subtree draws its
    workers from a namespace it watches. AgentQueues are cluster-scoped; an operator
    confined to some namespaces would otherwise write counts of queues it cannot see."""
    if not namespaces:
        return True
    leaves = topo.leaves_under(name) if name in topo.specs else []
    return bool(leaves) and all(
        leaf in topo.specs and topo.specs[leaf].worker_namespace in namespaces for leaf in leaves
    )


def judge(
    namespace: str,
    queue: str,
    topo: Topology,
    labels: Mapping[str, str],
    watched: tuple[str, ...] = (),
    task: str = "",
) -> Verdict | None:
    """May a pending task ``task`` of ``namespace`` (whose labels are ``labels``) be
    dispatched through ``queue``, by an operator watching ``watched`` (empty: every
    namespace)? None: yes; else (reason, message)."""
    spec = topo.specs.get(queue)
    if spec is None:
        return QUEUE_NOT_FOUND, f"AgentQueue {queue} does not exist (or its spec is invalid)"
    if not spec.admits(labels):
        return (
            QUEUE_FORBIDDEN,
            f"AgentQueue {queue}'s namespaceSelector does not select namespace {namespace}",
        )
    if topo.children.get(queue):
        return (
            QUEUE_NOT_LEAF,
            f"AgentQueue {queue} has child queues ({', '.join(sorted(topo.children[queue]))}); "
            "only leaves hold tasks",
        )
    if queue in topo.detached:
        return QUEUE_NOT_ATTACHED, f"AgentQueue {queue} is not attached: {topo.detached[queue]}"
    if spec.worker_namespace is None:
        return NO_WORKER_NAMESPACE, f"AgentQueue {queue} names no workerNamespace"
    if watched and spec.worker_namespace not in watched:
        return (
            NAMESPACE_NOT_WATCHED,
            f"AgentQueue {queue}'s workers are in namespace {spec.worker_namespace}, which "
            f"this operator does not watch (it watches {', '.join(watched)})",
        )
    if (
        task
        and spec.worker_namespace != namespace
        and not protocol.cross_task_lease_fits(namespace, task)
    ):
        return (
            TASK_NAME_TOO_LONG,
            f"the name of its claim's Lease in namespace {spec.worker_namespace} "
            f"({protocol.XTASK_LEASE_PREFIX}{namespace}.<task>) would be over 253 characters: "
            "name the task with at most 63 characters (the AgentTask CRD's rule)",
        )
    return None


class QueueLevel:
    """The queue level of dispatch (see the module docstring)."""

    def __init__(self) -> None:
        self.tree = QueueTree()
        self.topology = Topology()
        self._specs: dict[str, QueueSpec] = {}  # what the tree holds of each AgentQueue
        self.implicit: set[str] = set()  # namespaces with an implicit leaf in the tree
        self.granting: Counter[str] = Counter()  # grants in flight per leaf queue

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    # -- the tree follows the records --------------------------------------------------

    def sync(self, topo: Topology, queue: PendingQueue) -> None:
        """The tree holds the attached queues with their parents and weights; detached
        and deleted ones leave it. Parents first, so no update closes a cycle. Then
        every queue's count of tasks that may be granted now, from its lane."""
        self.topology = topo
        wanted = {
            name: QueueSpec(name, parent=topo.specs[name].parent, weight=topo.specs[name].weight)
            for name in sorted(topo.depth, key=lambda n: (topo.depth[n], n))
        }
        for name in [n for n in self._specs if n not in wanted]:
            self.tree.remove_queue(name)
            del self._specs[name]
        for name, spec in wanted.items():
            if self._specs.get(name) != spec:
                self.tree.upsert_queue(spec)
                self._specs[name] = spec
        for name in self._specs:
            self.tree.set_pending(name, queue.queued_count(self.lane_of(name)))

    def refresh(self, queue: PendingQueue) -> None:
        """Each leaf's count of tasks that may be granted now, for the lanes touched: from
        the leaf's lane of now -- a lane of its earlier workerNamespace (its tasks moved
        out) is touched too, and its count must not be the last word, whatever the
        order."""
        leaves = {lane[1] for lane in queue.touched if lane[1] in self._specs}
        for leaf in leaves:
            self.tree.set_pending(leaf, queue.queued_count(self.lane_of(leaf)))
        queue.touched.clear()

    def share_namespaces(self, queue: PendingQueue, shared: set[str]) -> None:
        """``shared``: the namespaces whose workers serve queued tasks now. Their tasks
        without spec.queue take turns as one implicit leaf; the others' leave the tree's
        turns (their lane is served as before, apart)."""
        for namespace in shared | self.implicit:
            leaf = IMPLICIT_PREFIX + namespace
            if namespace not in self.implicit:
                self.tree.upsert_queue(QueueSpec(leaf))
                self.implicit.add(namespace)
            count = queue.queued_count((namespace, "")) if namespace in shared else 0
            self.tree.set_pending(leaf, count)
            if namespace not in shared:
                self.tree.remove_queue(leaf)
                self.implicit.discard(namespace)

    # -- one decision ------------------------------------------------------------------

    @staticmethod
    def leaf_of(lane: Lane) -> str:
        return lane[1] or IMPLICIT_PREFIX + lane[0]

    def lane_of(self, leaf: str) -> Lane:
        if leaf.startswith(IMPLICIT_PREFIX):
            return (leaf[len(IMPLICIT_PREFIX) :], "")
        namespace = self.topology.specs[leaf].worker_namespace
        return (namespace or "", leaf)

    def capped(self, leaf: str, claims: Mapping[str, int]) -> bool:
        """Whether ``leaf`` or one of its ancestors holds its ``maxInFlight`` claims (the
        status-held ``claims`` per leaf queue and the grants in flight)."""
        if leaf.startswith(IMPLICIT_PREFIX):
            return False
        topo = self.topology
        for name in topo.ancestors(leaf):
            cap = topo.specs[name].max_in_flight if name in topo.specs else None
            if cap is None:
                continue
            held = sum(claims.get(q, 0) + self.granting[q] for q in topo.leaves_under(name))
            if held >= cap:
                return True
        return False

    def charge(self, leaf: str, cost: float) -> Charge:
        self.granting[leaf] += 1
        return self.tree.charge(leaf, cost)

    def ended(self, charge: Charge, *, refund: bool) -> None:
        """The grant charged ``charge`` ended (``refund``: it did not happen)."""
        self.granting[charge.queue] -= 1
        if self.granting[charge.queue] <= 0:
            del self.granting[charge.queue]
        if refund:
            self.tree.refund(charge)  # (a queue gone since is skipped)
