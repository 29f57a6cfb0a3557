"""The scheduling cores (one DRR ledger per namespace, and the queue level above them), kept
as the store says they should be.

A core holds what cannot be derived -- each worker's credit, served cost, the
virtual time -- and what can: which workers are in it (every worker whose spec
is readable, with its readiness) and which tasks load which worker. The latter
follow the records through two functions, the only places that change them:

- ``upsert_worker``: a worker's spec and readiness into the core (a worker that
  joins brings the claims it already holds, as the task statuses say);
- ``sync_load``: a task's hold equal to what its record says -- the worker a
  grant in flight goes to, else the worker its status names while Assigned or
  Running (``wanted_holder``).

``queues`` is the queue level (``tenants.QueueLevel``): which AgentQueue is served
next, over the namespaces' ledgers. ``budgets`` is the budget book
(``budgeting.Budgets``): ``sync_load`` keeps its grants as the records say too.

Cores exist only while leading: a new leader builds them afresh from the store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agentq import protocol
from agentq.claims import Readiness
from agentq.clock import Clock
from agentq.models import MIN_WEIGHT, TaskPhase
from agentq.operator.budgeting import Budgets
from agentq.operator.records import TaskRecord, WorkerRecord
from agentq.operator.store import Store
from agentq.operator.tenants import QueueLevel
from agentq.scheduler import Assignment, Scheduler, WorkerSpec
from agentq.views import Key, WorkerView

__all__ = ["Cores", "core_spec", "holder_namespace", "wanted_holder"]


def wanted_holder(record: TaskRecord) -> str | None:
    """The worker ``record``'s task should load in the core."""
    if record.granting is not None:
        return record.granting
    view = record.view
    if view.active:
        return view.status.worker
    return record.doubt[0] if record.doubt is not None else None


def holder_namespace(record: TaskRecord) -> str:
    """The namespace of the worker ``wanted_holder`` names (whose core loads the task):
    the task's own, or -- a claim across namespaces -- its worker's."""
    view = record.view
    if record.granting is not None or (not view.active and record.doubt is not None):
        return record.claim_ns or view.namespace
    return view.status.worker_namespace or view.namespace


def core_spec(worker: WorkerView, readiness: tuple[Readiness, str] | None) -> WorkerSpec | None:
    """What the core should hold for ``worker`` (None: its spec is unreadable: not in it)."""
    spec = worker.spec
    if spec is None:
        return None
    ready = (readiness or (Readiness.LEASE_MISSING, ""))[0]
    weight = spec.weight
    return WorkerSpec(
        name=worker.name,
        capabilities=spec.capabilities,
        weight=max(MIN_WEIGHT, weight) if math.isfinite(weight) else 1.0,
        max_in_flight=spec.max_in_flight,
        # A draining worker (its sidecar stopping) is held like a paused one: it keeps
        # its claims, earns nothing and gets no new task.
        paused=spec.paused or ready is Readiness.DRAINING,
        # Paused workers keep their readiness (Draining); the core reads paused.
        ready=ready in (Readiness.READY, Readiness.PAUSED, Readiness.DRAINING),
    )


class Cores:
    """The DRR core of each namespace (see the module docstring)."""

    def __init__(self, store: Store, claims: Mapping[Key, set[str]], clock: Clock) -> None:
        self.store = store
        # worker -> the claim ids of the tasks its status holds (indexes.claims)
        self.claims = claims
        self.by_namespace: dict[str, Scheduler] = {}
        # A task loaded in the core of another namespace than its own (a claim across
        # namespaces): that namespace, so its release finds the core whatever its status
        # says by then. Tasks of the worker's own namespace are not in it.
        self.loaded: dict[Key, str] = {}
        self.queues = QueueLevel()
        self.budgets = Budgets(store, clock)

    def get(self, namespace: str) -> Scheduler | None:
        return self.by_namespace.get(namespace)

    def of(self, namespace: str) -> Scheduler:
        """The core of ``namespace``, made (with every worker of it) if there is none."""
        core = self.by_namespace.get(namespace)
        if core is None:
            core = self.by_namespace[namespace] = Scheduler()
            for key, worker in self.store.workers.items():
                if key[0] == namespace:
                    self.upsert_worker(key, worker)
        return core

    def clear(self) -> None:
        self.by_namespace.clear()
        self.loaded.clear()
        self.queues.clear()
        self.budgets.clear()

    def upsert_worker(self, key: Key, record: WorkerRecord | None) -> list[Key]:
        """Make the core agree with the worker's record (None: deleted); returns the
        tasks it held if it left the core (to be decided again)."""
        core = self.of(key[0])
        spec = None if record is None else core_spec(record.view, record.readiness)
        if spec is None:
            if not core.has_worker(key[1]):
                return []
            released = [protocol.claim_task(key[0], c) for c in core.remove_worker(key[1])]
            for task in released:
                if task[0] != key[0]:
                    self.loaded.pop(task, None)
            return released
        assert record is not None
        joined = not core.has_worker(key[1])
        core.upsert_worker(spec)
        if joined:
            served = record.view.status.served_cost
            if served is not None and math.isfinite(served) and served >= 0:
                core.carry_over_served(key[1], served)
            # Claims the worker already holds (read back from the task statuses).
            for claim in sorted(self.claims.get(key, ())):
                task_key = protocol.claim_task(key[0], claim)
                held = self.store.tasks.get(task_key)
                if held is not None:
                    self.sync_load(task_key, held)
        return []

    def sync_load(
        self, key: Key, record: TaskRecord | None, *, succeeded: bool = False
    ) -> tuple[Key | None, Key | None]:
        """Make the core's hold of ``key`` what its record says; returns (the worker it
        left, the worker it joined) when it moved. ``succeeded``: the task left the store
        because it succeeded (its cost counts as served). The budget book's grant of the
        task follows the record too (``Budgets.sync``)."""
        self.budgets.sync(key, record)
        was = self.loaded.get(key, key[0]) if self.loaded else key[0]
        where = key[0] if record is None else holder_namespace(record)
        core = self.of(was)
        claim = key[1] if was == key[0] else protocol.cross_claim_id(*key)
        holder = core.holder(claim)
        wanted = wanted_holder(record) if record is not None else None
        target = core if where == was else self.of(where)
        if wanted is not None and not target.has_worker(wanted):
            wanted = None  # not in the core (deleted, or its spec is unreadable)
        if holder == wanted and where == was:
            return None, None
        if holder is not None:
            done = succeeded or (record is not None and record.view.phase is TaskPhase.SUCCEEDED)
            core.release(claim, completed=done)
        if was != key[0]:
            del self.loaded[key]
        if wanted is not None:
            assert record is not None
            if where != key[0]:
                self.loaded[key] = where
                claim = protocol.cross_claim_id(*key)
            else:
                claim = key[1]
            target.restore(Assignment(task=claim, worker=wanted, cost=record.view.spec.cost))
        return (
            None if holder is None else (was, holder),
            None if wanted is None else (where, wanted),
        )

    def rebuild(self) -> None:
        """Cores afresh from the store: every worker, with the claims it holds."""
        self.clear()
        for namespace in {key[0] for key in self.store.workers}:
            self.of(namespace)
