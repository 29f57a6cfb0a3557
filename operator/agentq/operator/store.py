"""The store: one record per watched object, holding everything the operator knows of it.

A ``TaskRecord``, ``WorkerRecord`` or ``LeaseRecord`` holds the object's typed
view (``agentq.views``) and the operator's own memory of it: grace period,
retry backoff, when it became pending, a write in flight, readiness, publish
state, when its Lease was last seen to change... So forgetting an object is one
removal, and taking the lead is one rebuild of the indexes from the records.

Watch events only *record* here (``observe_*``): they replace a record's view
(newer resourceVersions only; tombstones keep a late reply from bringing back
a deleted object) and note the key as changed. Everything that follows from a
change -- the indexes, readiness, the scheduling core, decisions -- runs in the
controller's step, which drains ``changed``.

Pure data: no I/O; the clock's readings are passed in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from agentq import claims, protocol, views
from agentq.claims import Readiness
from agentq.expiry import LeaseRecord as Renewal
from agentq.expiry import Observation
from agentq.models import FINAL_PHASES, TaskPhase
from agentq.operator.port import Body
from agentq.operator.records import (
    LeaseRecord,
    TaskRecord,
    Tombstones,
    WorkerRecord,
    newer,
)
from agentq.views import BudgetView, Key, LeaseView, QueueView, TaskView

__all__ = ["Changes", "Store", "finished", "renews", "task_lease_key"]


class Changes:
    """The keys whose records changed since the step last looked, in the order marked."""

    def __init__(self) -> None:
        # Task key -> whether its view changed (decide it again), not only our memory of it.
        self.tasks: dict[Key, bool] = {}
        self.workers: dict[Key, None] = {}
        # Lease key -> (the view before the change, the record after; None: deleted).
        self.leases: dict[Key, tuple[LeaseView | None, LeaseView | None]] = {}
        # Finished tasks seen (settled: no record kept), or gone (None): for the cleanup.
        self.finished: dict[Key, TaskView | None] = {}
        # An AgentQueue, or a namespace's labels, changed: every queue verdict judged again.
        self.tenancy = False
        # An AgentBudget's spec changed (or it came or went): the budget book and every
        # budget verdict judged again.
        self.budgets = False

    def task(self, key: Key, *, view: bool = True) -> None:
        self.tasks[key] = self.tasks.get(key, False) or view

    def lease(self, key: Key, old: LeaseView | None, new: LeaseView | None) -> None:
        first = self.leases.get(key)
        self.leases[key] = (first[0] if first is not None else old, new)

    def __bool__(self) -> bool:
        return bool(
            self.tasks
            or self.workers
            or self.leases
            or self.finished
            or self.tenancy
            or self.budgets
        )

    def clear(self) -> None:
        self.tenancy = False
        self.budgets = False
        self.tasks.clear()
        self.workers.clear()
        self.leases.clear()
        self.finished.clear()


class Store:
    """Every AgentTask, AgentWorker and agentq Lease the watches show, one record each;
    every AgentQueue and AgentBudget (its view) and every namespace's labels."""

    def __init__(self) -> None:
        self.tasks: dict[Key, TaskRecord] = {}
        self.workers: dict[Key, WorkerRecord] = {}
        self.leases: dict[Key, LeaseRecord] = {}
        # task -> the keys of every ``agentq-xtask-`` Lease named after it, in any
        # namespace: derived from the Lease records (their names), so an earlier claim's
        # Lease is found after a reclaim cleared the task's status.workerNamespace, and a
        # task's Leases are deleted with it. Only one of them can be its claim's (the one
        # in status.workerNamespace): anyone with Lease rights in another namespace may
        # create one of that name (``lease_of``).
        self.xleases: dict[Key, set[Key]] = {}
        self.queues: dict[str, QueueView] = {}  # cluster-scoped: by name
        self.budgets: dict[str, BudgetView] = {}  # cluster-scoped: by name
        self.namespaces: dict[str, tuple[str, dict[str, str]]] = {}  # (resourceVersion, labels)
        # The namespaces the operator watches (empty: every one): a queue whose workers
        # are elsewhere cannot be served (``tenants.judge``).
        self.watched: tuple[str, ...] = ()
        self.task_tombstones = Tombstones()
        self.worker_tombstones = Tombstones()
        self.changed = Changes()
        self.busy = 0  # task records with a write in flight (``start_write``/``end_write``)
        self._writes = itertools.count(1)
        self._aged: float | None = None  # when the tombstones last aged (our clock)

    # -- reading -------------------------------------------------------------------------

    def task(self, key: Key) -> TaskView | None:
        record = self.tasks.get(key)
        return None if record is None else record.view

    def lease_of(self, task: TaskView) -> LeaseRecord | None:
        """The claim Lease of ``task`` (by name: it may belong to an earlier task): in its
        own namespace, or (a claim across namespaces) exactly the one its status names,
        ``agentq-xtask-<namespace>.<task>`` in ``status.workerNamespace`` -- a Lease of
        that name anywhere else is someone else's. A task that holds no claim (a reclaim
        cleared its worker) may still have an earlier claim's Lease across namespaces to
        delete: one of its name that carries its UID (``leftover_of``)."""
        status = task.status
        worker_namespace = status.worker_namespace
        if worker_namespace is not None and worker_namespace != task.namespace:
            return self.leases.get(
                (worker_namespace, protocol.cross_task_lease_name(task.namespace, task.name))
            )
        lease = self.leases.get(task_lease_key(task))
        if lease is not None or status.worker is not None or not self.xleases:
            return lease  # (a claim in its own namespace: never another namespace's Lease)
        return self.leftover_of(task)

    def leftover_of(self, task: TaskView) -> LeaseRecord | None:
        """An earlier cross-namespace claim's Lease of ``task``, which holds none now: one
        named after it that carries its UID (the operator writes it on every grant)."""
        keys = self.xleases.get(task.key)
        if not keys:
            return None
        for key in sorted(keys):
            lease = self.leases.get(key)
            if lease is not None and lease.view.task_uid == task.uid:
                return lease
        return None

    def rebuild_xleases(self) -> None:
        """The index of ``agentq-xtask-`` Leases, from the Lease records."""
        self.xleases = {}
        for key, lease in self.leases.items():
            self._index_xlease(key, lease.view)

    def _index_xlease(self, key: Key, view: LeaseView) -> None:
        if view.task_namespace is not None and view.kind == protocol.LEASE_KIND_TASK:
            self.xleases.setdefault(view.task, set()).add(key)

    def _unindex_xlease(self, key: Key, view: LeaseView) -> None:
        keys = self.xleases.get(view.task)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.xleases[view.task]

    def _settle(self, key: Key) -> None:
        """A finished task kept only for its Lease (to delete it): that Lease is gone, so
        no record is kept any more (the cleanup times its deletion)."""
        record = self.tasks.get(key)
        if record is None or record.busy or not claims.settled(record.view):
            return
        if self.lease_of(record.view) is not None:
            return
        self.task_tombstones.bury(key, record.view.resource_version)
        del self.tasks[key]
        self.changed.task(key)
        self.changed.finished[key] = record.view

    def claim_expires_at(self, task: TaskView) -> float | None:
        """When (monotonic) the task's claim expires unless renewed: its Lease judged by
        the task's own lease duration, never the Lease's field (its holder can edit it)."""
        lease = self.lease_of(task)
        if lease is None:
            return None
        return lease.seen.expires_at(float(task.spec.lease_duration_seconds))

    def worker_lease(self, key: Key) -> LeaseRecord | None:
        return self.leases.get((key[0], protocol.worker_lease_name(key[1])))

    def __len__(self) -> int:
        return len(self.tasks) + len(self.workers) + len(self.leases)

    # -- recording (watch events and write replies) --------------------------------------

    def observe_task(self, body: Body, *, deleted: bool = False, size: int = 0) -> TaskView | None:
        """Record a task as the API server showed it; returns the view now held."""
        key = views.key_of(body)
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        record = self.tasks.get(key)
        if deleted:
            if record is not None and newer(record.view.resource_version, rv):
                # The deletion of an earlier object of this name, delivered late (a new
                # leader's fresh LIST showed us the one re-created since): not this one.
                return record.view
            self.task_tombstones.bury(key, rv)
            self.changed.finished[key] = None
            if record is not None:
                self.busy -= record.busy
                del self.tasks[key]
                self.changed.task(key)
            return None
        if record is not None and not newer(rv, record.view.resource_version):
            return record.view  # our own write's reply told us this already (or more)
        if record is None and self.task_tombstones.buried(key, rv):
            if finished(body):
                # Settled before and shown again (a relist): the cleanup may have let it go.
                view = views.task_view(body, size=size)
                if claims.settled(view):
                    self.changed.finished[key] = view
            return None  # a late reply about a task deleted since (or settled)
        self.task_tombstones.revive(key)
        view = views.task_view(body, size=size)
        if claims.settled(view) and self.lease_of(view) is None:
            # Finished, nothing to decide: no record kept, whatever the number of finished
            # tasks; the cleanup keeps when to delete it. A late reply older than this
            # view is refused by the tombstone.
            self.task_tombstones.bury(key, rv)
            self.changed.finished[key] = view
            if record is not None:
                self.busy -= record.busy
                del self.tasks[key]
                self.changed.task(key)
            return view
        if record is None:
            self.changed.finished[key] = None  # not finished (again): no deletion due
        if record is None or record.view.uid != view.uid:
            # New, or deleted and re-created while we were not watching: nothing carries
            # over but a write in flight (it ends as usual).
            self.tasks[key] = fresh = TaskRecord(view)
            if record is not None:
                fresh.busy, fresh.granting, fresh.write = record.busy, record.granting, record.write
        else:
            record.view = view
            record.doubt = None  # a newer view says whether a grant in doubt landed
        self.changed.task(key)
        return view

    def observe_worker(self, body: Body, *, deleted: bool = False) -> None:
        key = views.key_of(body)
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        record = self.workers.get(key)
        if deleted:
            if record is not None and newer(record.view.resource_version, rv):
                return  # the deletion of an earlier worker of this name, delivered late
            self.worker_tombstones.bury(key, rv)
            if record is not None:
                del self.workers[key]
                self.changed.workers[key] = None
            return
        if record is not None and not newer(rv, record.view.resource_version):
            return
        if record is None and self.worker_tombstones.buried(key, rv):
            return  # the reply to our status write, read after the worker was deleted
        self.worker_tombstones.revive(key)
        view = views.worker_view(body)
        if record is None:
            self.workers[key] = WorkerRecord(view)
        else:
            record.view = view
        self.changed.workers[key] = None

    def observe_queue(self, body: Body, *, deleted: bool = False) -> None:
        """An AgentQueue as the watch showed it (cluster-scoped: keyed by name)."""
        name = views.key_of(body)[1]
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        old = self.queues.get(name)
        if deleted:
            if old is not None and not newer(old.resource_version, rv):
                del self.queues[name]
                self.changed.tenancy = True
            return
        if old is not None and not newer(rv, old.resource_version):
            return
        view = views.queue_view(body)
        self.queues[name] = view
        if old is None or (old.spec, old.problem) != (view.spec, view.problem):
            self.changed.tenancy = True  # (a status write of ours changes no verdict)

    def observe_budget(self, body: Body, *, deleted: bool = False) -> None:
        """An AgentBudget as the watch showed it (cluster-scoped: keyed by name)."""
        name = views.key_of(body)[1]
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        old = self.budgets.get(name)
        if deleted:
            if old is not None and not newer(old.resource_version, rv):
                del self.budgets[name]
                self.changed.budgets = True
            return
        if old is not None and not newer(rv, old.resource_version):
            return
        view = views.budget_view(body)
        self.budgets[name] = view
        if old is None or (old.spec, old.problem) != (view.spec, view.problem):
            self.changed.budgets = True  # (a status write of ours changes no verdict)

    def observe_namespace(self, body: Body, *, deleted: bool = False) -> None:
        """A Namespace's labels (an AgentQueue's namespaceSelector reads them)."""
        name = views.key_of(body)[1]
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        old = self.namespaces.get(name)
        if deleted:
            if old is not None and not newer(old[0], rv):
                del self.namespaces[name]
                self.changed.tenancy = True
            return
        if old is not None and not newer(rv, old[0]):
            return
        labels = views.namespace_labels(body)
        self.namespaces[name] = (rv, labels)
        if old is None or old[1] != labels:
            self.changed.tenancy = True

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        known = self.namespaces.get(namespace)
        return known[1] if known is not None else {}

    def observe_lease(self, body: Body, *, deleted: bool, now: float, wall_age: float) -> bool:
        """``now``: our monotonic clock; ``wall_age``: how old the Lease's renewTime is by
        our wall clock (for a worker Lease seen for the first time). Returns False for a
        change nothing need wait for: a renewal of a task claim (holder, token and report
        as they were: ``renews``), or of a worker Lease whose worker is Ready (the step
        notes it when it next runs)."""
        view = views.lease_view(body)
        key = view.key
        if view.kind not in (protocol.LEASE_KIND_TASK, protocol.LEASE_KIND_WORKER):
            if key not in self.leases:
                return False  # not one of ours (the watch selects ours; a fake may not)
            deleted = True  # our label was removed: as good as gone for us
        record = self.leases.get(key)
        if deleted:
            if record is not None and newer(record.view.resource_version, view.resource_version):
                return False  # the deletion of an earlier Lease of this name, delivered late
            if record is not None:
                del self.leases[key]
                self.changed.lease(key, record.view, None)
                if record.view.task_namespace is not None:
                    self._unindex_xlease(key, record.view)
                # The record's kind and subject: the body of a deletion may carry no
                # labels (our own delete's, ``leases.gone``), and a finished task kept
                # for this Lease must still be let go (its TTL then runs).
                if record.view.kind == protocol.LEASE_KIND_TASK:
                    self._settle(record.view.task)
            return record is not None
        if record is not None and not newer(view.resource_version, record.view.resource_version):
            return False
        renewal = Renewal(
            holder=view.holder,
            renew_time=view.renew_time,
            duration=float(view.duration or 0),
            token=view.token_text,
            progress=view.progress,
        )
        if record is None:
            age = 0.0
            if view.kind == protocol.LEASE_KIND_WORKER and wall_age > renewal.duration:
                # A worker Lease seen for the first time proves readiness only if its holder
                # renewed it recently by our wall clock; else it is stale until it changes.
                age = renewal.duration
            self.leases[key] = LeaseRecord(
                view,
                Observation.first(renewal, now, age=age),
                revoked_at=now if view.revoked is not None else None,
            )
            self._index_xlease(key, view)
            self.changed.lease(key, None, view)
            return True
        old = record.view
        record.view = view
        record.seen.observe(renewal, now)
        if view.revoked is None:
            record.revoked_at = None
        elif record.revoked_at is None:
            record.revoked_at = now
        self.changed.lease(key, old, view)
        if view.kind == protocol.LEASE_KIND_WORKER:
            worker = self.workers.get((view.namespace, view.subject))
            return (
                worker is None
                or worker.suspect_since is not None
                or worker.readiness is None
                or worker.readiness[0] is not Readiness.READY
            )
        return not renews(self.task(view.task), old, view)

    def expire_tombstones(self, now: float, period: float) -> None:
        """Age the tombstones once a ``period`` (monotonic ``now``): each is kept one period
        at least, two at most (``Tombstones``)."""
        if self._aged is None:
            self._aged = now
        elif now - self._aged >= period:
            self._aged = now
            self.task_tombstones.age()
            self.worker_tombstones.age()

    def start_write(
        self, record: TaskRecord, *, granting: str | None = None, namespace: str | None = None
    ) -> int:
        """A write about the task is going out (``granting``: a grant to that worker, of
        ``namespace`` when it is not the task's); returns its ticket, for ``end_write``."""
        if not record.busy:
            record.busy = True
            self.busy += 1
        record.granting = granting
        if granting is not None:
            record.claim_ns = namespace
        record.write = next(self._writes)
        return record.write

    def end_write(self, key: Key, ticket: int) -> bool:
        """The write ``ticket`` about task ``key`` ended; returns whether it was marked
        meanwhile (to be decided again now). A write about a task deleted since ends
        nothing: its name may be a new task's by now, with a write of its own out."""
        record = self.tasks.get(key)
        if record is None or record.write != ticket:
            return False
        if record.busy:
            record.busy = False
            self.busy -= 1
        record.granting = None
        self.changed.task(key, view=False)  # may be queued again
        waiting, record.waiting = record.waiting, False
        self._settle(key)
        return waiting and key in self.tasks

    def reset_writes(self) -> None:
        """No write is in flight (they were cancelled with the lead)."""
        for record in self.tasks.values():
            record.busy = record.waiting = False
            record.granting = None
        self.busy = 0

    def credit(self, seconds: float) -> None:
        """Every Lease and grace period gets back ``seconds`` (we were blind that long)."""
        for lease in self.leases.values():
            lease.seen.credit(seconds)
        for task in self.tasks.values():
            if task.grace is not None:
                task.grace.deadline += seconds

    def active_tasks(self) -> Iterator[TaskRecord]:
        return (t for t in self.tasks.values() if t.view.active)


def finished(body: Body) -> bool:
    """Whether a task body shows a final phase (a cheap look, before any parsing)."""
    status = body.get("status")
    return isinstance(status, dict) and status.get("phase") in FINAL_PHASE_NAMES


FINAL_PHASE_NAMES = frozenset(phase.value for phase in FINAL_PHASES)


def renews(task: TaskView | None, old: LeaseView | None, new: LeaseView | None) -> bool:
    """Whether a change of ``task``'s claim Lease from ``old`` to ``new`` is a renewal of a
    healthy Running claim: its holder, token and report as they were, no grace period.
    Such a change needs no decision (the claim's timer finds the new deadline)."""
    return (
        task is not None
        and new is not None
        and old is not None
        and task.phase is TaskPhase.RUNNING
        and task.status.grace_until is None
        and (old.holder, old.token_text, old.report, old.revoked)
        == (new.holder, new.token_text, new.report, new.revoked)
    )


def task_lease_key(task: TaskView) -> Key:
    return (task.namespace, protocol.task_lease_name(task.name))
