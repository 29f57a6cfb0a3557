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
next, over the namespaces' ledgers.

Cores exist only while leading: a new leader builds them afresh from the store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from agentq.claims import Readiness
from agentq.models import MIN_WEIGHT, TaskPhase
from agentq.operator.records import TaskRecord, WorkerRecord
from agentq.operator.store import Store
from agentq.operator.tenants import QueueLevel
from agentq.scheduler import Assignment, Scheduler, WorkerSpec
from agentq.views import Key, WorkerView

__all__ = ["Cores", "core_spec", "wanted_holder"]


def wanted_holder(record: TaskRecord) -> str | None:
    """The worker ``record``'s task should load in the core."""
    if record.granting is not None:
        return record.granting
    view = record.view
    if view.active:
        return view.status.worker
    return record.doubt[0] if record.doubt is not None else None


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

    def __init__(self, store: Store, claims: Mapping[Key, set[str]]) -> None:
        self.store = store
        self.claims = claims  # worker -> the tasks its status-held claims (indexes.claims)
        self.by_namespace: dict[str, Scheduler] = {}
        self.queues = QueueLevel()

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
        self.queues.clear()

    def upsert_worker(self, key: Key, record: WorkerRecord | None) -> list[str]:
        """Make the core agree with the worker's record (None: deleted); returns the
        tasks it held if it left the core (to be decided again)."""
        core = self.of(key[0])
        spec = None if record is None else core_spec(record.view, record.readiness)
        if spec is None:
            return core.remove_worker(key[1]) if core.has_worker(key[1]) else []
        assert record is not None
        joined = not core.has_worker(key[1])
        core.upsert_worker(spec)
        if joined:
            served = record.view.status.served_cost
            if served is not None and math.isfinite(served) and served >= 0:
                core.carry_over_served(key[1], served)
            # Claims the worker already holds (read back from the task statuses).
            for name in sorted(self.claims.get(key, ())):
                task = self.store.tasks.get((key[0], name))
                if task is not None:
                    self.sync_load((key[0], name), task)
        return []

    def sync_load(
        self, key: Key, record: TaskRecord | None, *, succeeded: bool = False
    ) -> tuple[str | None, str | None]:
        """Make the core's hold of ``key`` what its record says; returns (the worker it
        left, the worker it joined) when it moved. ``succeeded``: the task left the store
        because it succeeded (its cost counts as served)."""
        core = self.of(key[0])
        holder = core.holder(key[1])
        wanted = wanted_holder(record) if record is not None else None
        if wanted is not None and not core.has_worker(wanted):
            wanted = None  # not in the core (deleted, or its spec is unreadable)
        if holder == wanted:
            return None, None
        if holder is not None:
            done = succeeded or (record is not None and record.view.phase is TaskPhase.SUCCEEDED)
            core.release(key[1], completed=done)
        if wanted is not None:
            assert record is not None
            core.restore(Assignment(task=key[1], worker=wanted, cost=record.view.spec.cost))
        return holder, wanted

    def rebuild(self) -> None:
        """Cores afresh from the store: every worker, with the claims it holds."""
        self.clear()
        for namespace in {key[0] for key in self.store.workers}:
            self.of(namespace)
