"""Bringing what is derived up to date: with the changes the store recorded, and with time.

- ``apply``: every index, core and readiness made to agree with each record
  that changed since the last step -- a task's queue entry, claim, phase and
  core load; a worker's coverage, place in the core and readiness; a Lease's
  worker readiness, or its task marked for a decision unless the change is a
  renewal of a healthy claim; an AgentQueue's or a namespace's labels: the queue
  tree, and every task that names a queue judged again;
- ``fire_timers``: each due timer's subject looked at;
- ``rebuild``: every index and core from scratch (a new leader, a resync).
"""

from __future__ import annotations

from collections.abc import Callable

from agentq import protocol
from agentq.models import TaskPhase
from agentq.operator.cleanup import Cleanup
from agentq.operator.cores import Cores
from agentq.operator.decide import Decider
from agentq.operator.indexes import Indexes
from agentq.operator.publish import Publisher
from agentq.operator.queue_status import QueueStatuses
from agentq.operator.readiness import WorkerReadiness
from agentq.operator.store import Store
from agentq.operator.tokens import TokenAllocator
from agentq.operator.work import (
    TIMER_BACKOFF,
    TIMER_PUBLISH,
    TIMER_QUEUES,
    TIMER_TASK,
    TIMER_WORKER,
    Agenda,
)
from agentq.views import Key, LeaseView, TaskView

__all__ = ["Follower"]


class Follower:
    """Keeps the derived state following the store and the clock (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        indexes: Indexes,
        cores: Cores,
        agenda: Agenda,
        readiness: WorkerReadiness,
        publisher: Publisher,
        queue_statuses: QueueStatuses,
        decider: Decider,
        tokens: TokenAllocator,
        cleanup: Cleanup,
        delete_lease: Callable[[Key, LeaseView], None],
        check_orphan: Callable[[Key, LeaseView], None] = lambda key, lease: None,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.cores = cores
        self.agenda = agenda
        self.readiness = readiness
        self.publisher = publisher
        self.queue_statuses = queue_statuses
        self.decider = decider
        self.tokens = tokens
        self.cleanup = cleanup
        # A claim Lease left over by a finished task (no record kept): deleted.
        self.delete_lease = delete_lease
        # A claim Lease in another namespace whose task the store does not hold after a
        # rebuild: its task read once (gone, or another object: the Lease deleted).
        self.check_orphan = check_orphan

    def apply(self) -> None:
        """Make the indexes, cores and readiness agree with every record that changed."""
        changed = self.store.changed
        while changed:
            workers, leases, tasks, finished, tenancy, budgets = (
                list(changed.workers),
                list(changed.leases.items()),
                list(changed.tasks.items()),
                list(changed.finished.items()),
                changed.tenancy,
                changed.budgets,
            )
            changed.clear()
            self._finished(finished)
            if tenancy:
                self.agenda.dirty.update(self.indexes.sync_tenancy())
                self.cores.queues.sync(self.indexes.topology, self.indexes.queue)
                self.queue_statuses.changed()
            if budgets:
                if self.cores.budgets.restored:
                    self.cores.budgets.sync_specs()
                self.agenda.dirty.update(self.indexes.sync_budgets())
            for key in workers:
                self._apply_worker(key)
            ended = dict(finished)
            for key, view_changed in tasks:
                self._apply_task(key, view_changed, ended.get(key))
            for _, (old, new) in leases:
                self._apply_lease(old, new)

    def drop_changes(self) -> None:
        """Forget what changed without applying it (a rebuild follows, or we do not lead):
        all but the finished tasks, which have no record -- the cleanup remembers them."""
        self._finished(list(self.store.changed.finished.items()))
        self.store.changed.clear()

    def _finished(self, finished: list[tuple[Key, TaskView | None]]) -> None:
        """Finished tasks seen (None: gone, or not finished): to the cleanup, and their
        tokens to the allocator's floor. A task gone whose claim Lease is in another
        namespace: that Lease deleted (no owner reference there to do it)."""
        xleases = self.store.xleases
        for key, view in finished:
            self.cleanup.saw(key, view)
            self.cores.budgets.saw_finished(key, view)
            if view is not None:
                self.tokens.observe(view.status.fencing_token)
            elif xleases and key in xleases and key not in self.store.tasks:
                # Every agentq Lease named after the task: it is gone, none is a claim.
                for lease_key in sorted(xleases[key]):
                    lease = self.store.leases.get(lease_key)
                    if lease is not None:
                        self.delete_lease(key, lease.view)

    def _apply_task(self, key: Key, view_changed: bool, finished: TaskView | None) -> None:
        """``finished``: the task's last view if it finished and left the store."""
        record = self.store.tasks.get(key)
        self.indexes.sync_task(key, record)
        succeeded = finished is not None and finished.phase is TaskPhase.SUCCEEDED
        for worker in self.cores.sync_load(key, record, succeeded=succeeded):
            if worker is not None:
                self.publisher.mark(worker)
        if record is None:
            self.agenda.dirty.discard(key)
            return
        self.tokens.observe(record.view.status.fencing_token)
        if view_changed:
            self.agenda.dirty.add(key)

    def _apply_worker(self, key: Key) -> None:
        record = self.store.workers.get(key)
        self.agenda.dirty.update(self.indexes.sync_worker(key, record))
        if record is None:
            self.agenda.dirty.update(self.cores.upsert_worker(key, None))
            self.publisher.forget(key)
            return
        self.readiness.evaluate(key)
        self.publisher.check(record)

    def _apply_lease(self, old: LeaseView | None, new: LeaseView | None) -> None:
        lease = new or old
        assert lease is not None
        if lease.kind == protocol.LEASE_KIND_WORKER:
            # (and looked at again when it would go stale)
            self.readiness.evaluate((lease.namespace, lease.subject))
            return
        subject = lease.task
        task = self.store.task(subject)
        if task is None:
            if new is not None and (
                self.cleanup.holds(subject, new.task_uid)
                or (new.task_namespace is not None and self._task_gone(subject, new))
            ):
                # The Lease of a finished task; or a claim across namespaces whose task
                # went (no owner reference: nobody else deletes it).
                self.delete_lease(subject, new)
            return
        if lease.task_namespace is not None and new is not None:
            claim = self.store.lease_of(task)
            if claim is None or claim.view.key != new.key:
                # Named after the task, but not where its claim is: someone else's Lease
                # (anyone with Lease rights in a namespace may create one of that name).
                # Nothing of the task follows from it.
                return
        self.cores.budgets.lease_seen(task, new)  # usage and throttles its agent reported
        if not self.decider.renewal_only(task, old, new):
            self.agenda.dirty.add(subject)

    def _task_gone(self, subject: Key, lease: LeaseView) -> bool:
        """Whether the task a Lease across namespaces names is gone (deleted), or is
        another object than the one whose UID the Lease carries. A task that finished
        and settled is tombstoned too, and is still there: a Lease of its name with no
        UID of another task is not ours to delete (anyone may name one after it)."""
        if not self.store.task_tombstones.holds(subject):
            return False
        entry = self.cleanup.entries.get(subject)
        return entry is None or (lease.task_uid is not None and entry.uid != lease.task_uid)

    def refresh_queues(self) -> None:
        """The queue level's count of each leaf's tasks that may be granted now, for the
        lanes that changed (dispatch reads them again as it pops)."""
        if self.indexes.queue.touched:
            self.cores.queues.refresh(self.indexes.queue)

    def fire_timers(self, now: float) -> None:
        for kind, key in self.agenda.timers.pop_due(now):
            if kind == TIMER_TASK:
                task = self.store.tasks.get(key)
                if task is not None:
                    if task.doubt is not None and task.doubt[1] <= now:
                        # A grant of unknown outcome, and no newer view of the task since:
                        # it did not land. Its slot is given back, the task queued again.
                        task.doubt = None
                        self._apply_task(key, False, None)
                    elif task.doubt is not None:
                        self.agenda.at(task.doubt[1], (TIMER_TASK, key))  # an earlier timer
                    self.decider.timer(task, now)
            elif kind == TIMER_BACKOFF:
                self.indexes.sync_task(key, self.store.tasks.get(key))  # queued if it may be
            elif kind == TIMER_PUBLISH:
                self.publisher.timer(key, now)
            elif kind == TIMER_QUEUES:
                self.queue_statuses.timer()
            elif kind == TIMER_WORKER:
                self.readiness.evaluate(key)  # renewed since: pushes the timer for the new expiry

    def rebuild(self, *, urgent: bool) -> None:
        """Every index and core from the records; every task decided and every worker
        evaluated again (``urgent``: its status compared at once, a new leader's way).
        Finished tasks have no record: what was seen of them goes to the cleanup first."""
        self.drop_changes()
        self.indexes.rebuild(self.store)
        self.cores.queues.sync(self.indexes.topology, self.indexes.queue)
        for namespace in {key[0] for key in self.store.workers}:
            self.cores.of(namespace)
        for key, task in self.store.tasks.items():
            self.cores.sync_load(key, task)
            self.tokens.observe(task.view.status.fencing_token)
        for key in self.store.workers:
            self.readiness.evaluate(key)  # with its staleness timer
            self.publisher.mark(key, urgent=urgent)
        self.agenda.dirty.update(self.store.tasks)
        self.store.rebuild_xleases()
        for task_key, lease_keys in list(self.store.xleases.items()):
            if task_key in self.store.tasks:
                continue
            for lease_key in sorted(lease_keys):
                lease = self.store.leases.get(lease_key)
                if (
                    lease is not None
                    and not lease.deleting
                    and lease.unjudged != lease.view.resource_version
                ):
                    # Never judged from the store alone: the Lease watch may run ahead of
                    # the task watch. One read of the task says.
                    self.check_orphan(task_key, lease.view)
