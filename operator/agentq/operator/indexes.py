"""The indexes decisions read, derived from the store's records (Kueue's cache/queue split).

Each index is a function of the records: ``sync_task`` / ``sync_worker`` make
the indexes agree with one record (or with its absence), in O(1) (O(log n) for
a heap), and ``rebuild`` makes them from scratch. ``agentq.operator.invariants``
builds them afresh and compares.

- ``queue``: pending tasks per lane (namespace, AgentQueue) and capability set,
  highest priority then oldest first; a
  member is *queued* (may be granted now) unless a grant of it is in flight or
  it waits out its retry backoff, a pause after a grant of unknown outcome, or a
  pause after writes refused for good -- each with a timer for its end;
- ``claims``: each worker's tasks, as the task statuses say (Assigned/Running);
- ``phases``: tasks by phase (``agentq_tasks``);
- ``offered``: the capabilities each worker offers, per namespace, and
  ``uncovered``: the verdict "no worker offers these" per capability set with
  a task waiting (``Unschedulable``);
- ``topology``, ``held``, ``queue_claims`` and ``queue_pending``: the AgentQueue
  tree the records describe; the verdict on each pending task whose queue does not
  admit it (it is no member of ``queue``: ``tenants.judge``); the claims
  (Assigned/Running) of each queue, as the task statuses say, and its pending
  tasks, whatever their verdict (both for the queue's status);
- ``budget_held``: the verdict on each pending task one of whose AgentBudgets can
  never admit it (missing, or a per-minute limit below its estimate: it is no
  member of ``queue``; ``budgeting.verdict_of``), judged again when a budget changes.

The scheduling core's load is kept by ``agentq.operator.cores``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from agentq import claims, protocol
from agentq.clock import Clock
from agentq.models import TaskPhase
from agentq.operator import budgeting
from agentq.operator.queue import PendingQueue
from agentq.operator.records import TaskRecord, WorkerRecord
from agentq.operator.store import Store
from agentq.operator.tenants import Topology, Verdict, judge, topology
from agentq.operator.work import TIMER_BACKOFF, Timers
from agentq.views import Key, TaskView

__all__ = [
    "Indexes",
    "backoff_end",
    "claim_holder",
    "claim_worker",
    "deadline_end",
    "grantable_from",
    "phase_name",
    "queue_member",
    "verdict_of",
]


def phase_name(view: TaskView) -> str:
    return (view.phase or TaskPhase.PENDING).value


def claim_worker(view: TaskView) -> str | None:
    """The worker a task's status says holds it (Assigned/Running), if any."""
    return view.status.worker if view.active else None


def claim_holder(view: TaskView) -> Key | None:
    """The worker (its namespace, its name) a task's status says holds it, if any."""
    worker = claim_worker(view)
    if worker is None:
        return None
    return (view.status.worker_namespace or view.namespace, worker)


def queue_member(view: TaskView, topo: Topology) -> Key:
    """Where an admitted pending task waits in the pending queue: (its lane's namespace,
    its claim id there). The lane's namespace is its workers' -- its queue's
    ``workerNamespace`` -- and a task of another namespace is ``<namespace>~<task>``
    in it (``protocol.claim_id``); a task of the workers' own namespace is as ever."""
    namespace = view.namespace
    if view.spec.queue is not None:
        spec = topo.specs.get(view.spec.queue)
        if spec is not None and spec.worker_namespace and spec.worker_namespace != namespace:
            return (
                spec.worker_namespace,
                protocol.cross_claim_id(namespace, view.name),
            )
    return view.key


def verdict_of(view: TaskView, topo: Topology, store: Store) -> Verdict | None:
    """The verdict on a pending task's spec.queue (None: none named, or admitted)."""
    queue = view.spec.queue
    if queue is None:
        return None
    return judge(
        view.namespace,
        queue,
        topo,
        store.namespace_labels(view.namespace),
        store.watched,
        view.name,
    )


def backoff_end(record: TaskRecord, *, now: float, wall: datetime) -> float | None:
    """When (monotonic) a pending task's retry backoff ends (None: no backoff).

    ``status.notBefore`` is wall-clock time (for people); it is converted once to
    our monotonic clock, at most ``retryBackoff.maxSeconds`` ahead, so a wall clock
    stepped back cannot hold a retry for longer than its backoff.
    """
    record.backoff = backoff_of(record, now=now, wall=wall)
    return None if record.backoff is None else record.backoff[1]


def backoff_of(record: TaskRecord, *, now: float, wall: datetime) -> tuple[str, float] | None:
    """``record``'s (notBefore, end of backoff) as ``backoff_end`` keeps it, unchanged."""
    not_before = record.view.status.not_before
    if not_before is None:
        return None
    stamp = not_before.isoformat()
    if record.backoff is not None and record.backoff[0] == stamp:
        return record.backoff
    wait = (not_before - wall).total_seconds()
    wait = max(0.0, min(wait, record.view.spec.retry_backoff.max_seconds))
    return stamp, now + wait


def deadline_end(record: TaskRecord, *, now: float, wall: datetime) -> float | None:
    """When (monotonic) the task's activeDeadlineSeconds passes (None: none, or not
    started). ``status.startTime`` is wall-clock time; it is converted once, at most the
    deadline ahead, as ``backoff_end`` does."""
    view = record.view
    seconds, start = view.spec.active_deadline_seconds, view.status.start_time
    if seconds is None or start is None:
        record.deadline = None
        return None
    stamp = f"{start.isoformat()}+{seconds}"
    if record.deadline is None or record.deadline[0] != stamp:
        left = (start - wall).total_seconds() + seconds
        record.deadline = (stamp, now + max(0.0, min(left, float(seconds))))
    return record.deadline[1]


def grantable_from(
    record: TaskRecord, *, now: float, wall: datetime, keep: bool = True
) -> float | None:
    """From when (monotonic) a pending task may be granted: its backoff, a pause after a
    refused grant, a pause after refused writes; None while a grant of it is in flight
    (looked at again when it ends), of unknown outcome (``doubt``), or lost its race on
    the view held (looked at again when a newer one comes). ``keep``: remember the backoff's end
    on the record (False: only read)."""
    if (
        record.granting is not None
        or record.doubt is not None
        or record.lost_race_at == record.view.resource_version
    ):
        # A grant in flight, or of unknown outcome (until a newer view or its timer), or
        # one that lost its race on this very view: a newer one is on its way (its event
        # re-queues the task).
        return None
    backoff = (backoff_end if keep else _backoff_read)(record, now=now, wall=wall)
    ends = [backoff, record.retry_at, record.unwritable_until]
    return max((end for end in ends if end is not None), default=now)


def _backoff_read(record: TaskRecord, *, now: float, wall: datetime) -> float | None:
    backoff = backoff_of(record, now=now, wall=wall)
    return None if backoff is None else backoff[1]


@dataclass(frozen=True, slots=True)
class _Entry:
    """What one task contributes to the indexes."""

    phase: str
    claim: Key | None  # the worker (namespace, name) it counts on in ``claims``
    queue: frozenset[str] | None  # the capability set it is a member of
    queue_claim: str | None = None  # the AgentQueue it counts on in ``queue_claims``
    queue_pending: str | None = None  # the AgentQueue it counts on in ``queue_pending``
    member: Key | None = None  # its key in ``queue`` (``queue_member``), if a member


class Indexes:
    """Every index derived from the task and worker records (see the module docstring)."""

    def __init__(self, *, timers: Timers, clock: Clock, store: Store) -> None:
        self.timers = timers
        self.clock = clock
        self.store = store  # (the namespaces' labels, for the verdicts)
        self.queue = PendingQueue()
        self.topology = Topology()
        self.held: dict[Key, Verdict] = {}  # pending tasks their queue does not admit
        self.naming: set[Key] = set()  # pending tasks that name a queue (judged again)
        self.budget_held: dict[Key, Verdict] = {}  # pending tasks a budget never admits
        self.budget_naming: set[Key] = set()  # pending tasks that name budgets
        self.queue_claims: Counter[str] = Counter()  # AgentQueue -> its claims
        # AgentQueue -> the pending tasks naming it, whatever their verdict (its status)
        self.queue_pending: Counter[str] = Counter()
        # worker -> the claim ids of the tasks it holds (from status): a task of the
        # worker's namespace by name, another's as <namespace>~<task>
        self.claims: dict[Key, set[str]] = {}
        self.phases: Counter[str] = Counter()
        self.offered: dict[str, dict[Key, frozenset[str]]] = {}  # ns -> worker -> capabilities
        self.uncovered: dict[tuple[str, frozenset[str]], str | None] = {}
        self._entries: dict[Key, _Entry] = {}

    # -- tasks ---------------------------------------------------------------------------

    def sync_task(self, key: Key, record: TaskRecord | None) -> None:
        """Make every task index agree with ``record`` (None: the task is gone)."""
        old = self._entries.pop(key, None)
        new: _Entry | None = None
        verdict: Verdict | None = None
        barred: Verdict | None = None
        if record is not None:
            view = record.view
            member = view.pending and view.problem is None
            if view.spec.queue is not None:
                if member:
                    self.naming.add(key)
                    verdict = verdict_of(view, self.topology, self.store)
                    member = verdict is None
                else:
                    self.naming.discard(key)
            if view.spec.budgets:
                if member:
                    self.budget_naming.add(key)
                    barred = budgeting.verdict_of(view, self.store)
                    member = barred is None
                else:
                    self.budget_naming.discard(key)
            new = _Entry(
                phase_name(view),
                claim_holder(view),
                view.spec.required_capabilities if member else None,
                view.spec.queue if view.active else None,
                view.spec.queue if view.pending else None,
                queue_member(view, self.topology) if member else None,
            )
            self._entries[key] = new
            if not view.active:
                record.grace = None
                record.progress_written = None
        else:
            self.naming.discard(key)
            self.budget_naming.discard(key)
        if verdict is None:
            self.held.pop(key, None)
        else:
            self.held[key] = verdict
        if barred is None:
            self.budget_held.pop(key, None)
        else:
            self.budget_held[key] = barred
        if old is not None:
            self.phases[old.phase] -= 1
            if old.queue_claim is not None:
                self.queue_claims[old.queue_claim] -= 1
                if not self.queue_claims[old.queue_claim]:
                    del self.queue_claims[old.queue_claim]
            if old.queue_pending is not None:
                self.queue_pending[old.queue_pending] -= 1
                if not self.queue_pending[old.queue_pending]:
                    del self.queue_pending[old.queue_pending]
        if new is not None:
            self.phases[new.phase] += 1
            if new.queue_claim is not None:
                self.queue_claims[new.queue_claim] += 1
            if new.queue_pending is not None:
                self.queue_pending[new.queue_pending] += 1
        was = old.claim if old is not None else None
        now_worker = new.claim if new is not None else None
        if was != now_worker:
            if was is not None:
                held = self.claims.get(was)
                if held is not None:
                    held.discard(protocol.claim_id(key[0], key[1], was[0]))
                    if not held:
                        del self.claims[was]
            if now_worker is not None:
                claim = protocol.claim_id(key[0], key[1], now_worker[0])
                self.claims.setdefault(now_worker, set()).add(claim)
        place = new.member if new is not None else None
        if old is not None and old.member is not None and old.member != place:
            self.queue.remove(old.member)  # (its lane moved: its queue's workerNamespace)
        if new is None or new.queue is None:
            self.queue.remove(key)
            if record is not None:
                record.pending_since = None
                record.backoff = None
                record.retry_at = None
            return
        assert record is not None
        now = self.clock.monotonic()
        if record.pending_since is None:
            record.pending_since = now
        start = grantable_from(record, now=now, wall=self.clock.now())
        ready = start is not None and start <= now
        assert place is not None
        self.queue.add(
            place,
            new.queue,
            record.view.created,
            ready=ready,
            priority=record.view.spec.priority,
            queue=record.view.spec.queue or "",
            budgets=budgeting.signature(record.view),
        )
        if start is not None and not ready:
            self.timers.push(start, (TIMER_BACKOFF, key))

    # -- workers and coverage ------------------------------------------------------------

    def sync_worker(self, key: Key, record: WorkerRecord | None) -> list[Key]:
        """Make the coverage agree with ``record``; returns the pending tasks whose
        Unschedulable verdict changed (to be decided again)."""
        namespace = key[0]
        offered = self.offered.setdefault(namespace, {})
        if record is None:
            if key not in offered:
                return []
            del offered[key]
        else:
            spec = record.view.spec
            record.offered = spec.capabilities if spec is not None else frozenset()
            if offered.get(key) == record.offered:
                return []
            offered[key] = record.offered
        if not offered:
            del self.offered[namespace]
        return self._coverage_changed(namespace)

    # -- AgentQueues and the namespaces' labels ------------------------------------------

    def sync_tenancy(self) -> list[Key]:
        """The queue tree from the AgentQueue records, and every pending task that names a
        queue judged again; returns those whose verdict changed (to be decided again)."""
        self.topology = topology(self.store.queues)
        redecide: list[Key] = []
        for key in list(self.naming):
            before = self.held.get(key)
            self.sync_task(key, self.store.tasks.get(key))
            if self.held.get(key) != before:
                redecide.append(key)
        return redecide

    def verdict(self, key: Key) -> Verdict | None:
        return self.held.get(key)

    def sync_budgets(self) -> list[Key]:
        """Every pending task that names budgets judged again (an AgentBudget changed);
        returns those whose verdict changed (to be decided again)."""
        redecide: list[Key] = []
        for key in list(self.budget_naming):
            before = self.budget_held.get(key)
            self.sync_task(key, self.store.tasks.get(key))
            if self.budget_held.get(key) != before:
                redecide.append(key)
        return redecide

    def _coverage_changed(self, namespace: str) -> list[Key]:
        queued = self.queue.required_sets(namespace)
        for key in [k for k in self.uncovered if k[0] == namespace and k[1] not in queued]:
            # No task waits for this set now: judged afresh when one does (``missing``),
            # not from before this change.
            del self.uncovered[key]
        redecide: list[Key] = []
        for required in list(queued):
            redecide.extend(self._recheck(namespace, required))
        return redecide

    def _recheck(self, namespace: str, required: frozenset[str]) -> list[Key]:
        offered = list(self.offered.get(namespace, {}).values())
        missing = claims.missing_capabilities(required, offered, namespace)
        if self.uncovered.get((namespace, required), "unknown") == missing:
            return []
        self.uncovered[(namespace, required)] = missing
        return [
            protocol.claim_task(namespace, name)
            for lane in self.queue.lanes_of(namespace)
            for name in self.queue.members(lane, required)
        ]

    def lane_namespace(self, key: Key) -> str:
        """The namespace of the workers a pending task waits for (its lane's)."""
        entry = self._entries.get(key)
        return entry.member[0] if entry is not None and entry.member is not None else key[0]

    def missing(self, namespace: str, required: frozenset[str]) -> str | None:
        """What no worker of ``namespace`` offers of ``required`` (None: all offered)."""
        key = (namespace, required)
        if key not in self.uncovered:
            self._recheck(namespace, required)
        return self.uncovered.get(key)

    # -- all at once ---------------------------------------------------------------------

    def clear(self) -> None:
        self.queue = PendingQueue()
        self.held.clear()
        self.naming.clear()
        self.budget_held.clear()
        self.budget_naming.clear()
        self.queue_claims.clear()
        self.queue_pending.clear()
        self.claims.clear()
        self.phases.clear()
        self.offered.clear()
        self.uncovered.clear()
        self._entries.clear()

    def rebuild(self, store: Store) -> None:
        """Every index from scratch, from the records."""
        self.clear()
        self.topology = topology(store.queues)
        for key, worker in store.workers.items():
            self.sync_worker(key, worker)
        for key, task in store.tasks.items():
            self.sync_task(key, task)
