"""Deciding: each dirty task, with its claim's Lease, through ``agentq.claims.decide``.

Each step takes the dirty tasks (first marked, first decided) and asks the pure
core what to do; a decision that changes nothing sets a timer for the task's
next deadline, any other is handed to the ``Committer`` as a write of its own.
Work is proportional to what changed, not to the fleet: a renewal of a healthy
claim is no decision at all (``renewal_only``), its timer finds the new
deadline when it fires (``next_deadline``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from agentq import claims, protocol
from agentq.claims import Decision, LeaseOp
from agentq.clock import Clock
from agentq.models import TaskPhase
from agentq.operator.budgeting import WAIT_REPORT_SECONDS
from agentq.operator.commit import Committer
from agentq.operator.gate import RequestGate
from agentq.operator.health import WatchHealth
from agentq.operator.indexes import Indexes, deadline_end
from agentq.operator.records import Grace, LeaseRecord, TaskRecord
from agentq.operator.store import Store, renews
from agentq.operator.work import TIMER_TASK, Agenda, Stats
from agentq.views import LeaseView, TaskView

__all__ = ["Decider"]

log = logging.getLogger("agentq.controller")


class Decider:
    """Decides dirty tasks (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        indexes: Indexes,
        agenda: Agenda,
        gate: RequestGate,
        committer: Committer,
        health: WatchHealth,
        clock: Clock,
        rng: random.Random,
        policy: claims.Policy,
        stats: Stats,
        write_concurrency: int,
        credits: Callable[[], int],
        token_ceiling: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.agenda = agenda
        self.gate = gate
        self.committer = committer
        self.health = health
        self.clock = clock
        self.rng = rng
        self.policy = policy
        self.stats = stats
        self.write_concurrency = write_concurrency
        self.credits = credits
        self.token_ceiling = token_ceiling  # the highest fencing token issued, if known

    def decide_dirty(self) -> None:
        # Decisions in flight, not every write: the Lease deletes and Events that follow a
        # storm of reclaims wait for low-priority slots and must not hold up the decisions.
        dirty = self.agenda.dirty
        budget = max(1, self.write_concurrency * 4 - self.store.busy)
        while dirty and budget > 0:
            key = dirty.pop()
            record = self.store.tasks.get(key)
            if record is None:
                continue
            if record.busy:
                # Decided again when its write is done -- not popped again every step
                # meanwhile: with hundreds of grants in flight that was O(n) per event.
                record.waiting = True
                continue
            now = self.clock.monotonic()
            until = record.unwritable_until
            if until is not None and now < until:
                self.agenda.at(until, (TIMER_TASK, key))  # decided again when it ends
                continue
            if self._decide(record, now):
                budget -= 1

    def _decide(self, record: TaskRecord, now: float) -> bool:
        """Decide one task; True if a write was started."""
        task, key = record.view, record.key
        self.stats.decisions += 1
        lease_record = self.store.lease_of(task)
        lease = lease_record.view if lease_record is not None else None
        decision = claims.decide(task, lease, self._seen(record, lease_record, now), self.policy)
        log.debug("decided %s/%s: %s", *key, decision)
        if decision.transition is None and decision.lease is LeaseOp.KEEP and task.pending:
            verdict = self.indexes.verdict(key)
            pending = claims.decide_pending(
                task,
                self.indexes.missing(
                    self.indexes.lane_namespace(key), task.spec.required_capabilities
                )
                if task.problem is None and verdict is None
                else None,
                wall=self.clock.now(),
                verdict=verdict,
                budget=self.indexes.budget_held.get(key),
                budget_wait=_reported_wait(record, now),
            )
            if pending is not None:
                decision = Decision(transition=pending, refusal=decision.refusal)
        if decision.wake_at is not None:
            self.agenda.at(decision.wake_at, (TIMER_TASK, key))
        elif task.active:
            # An expiry already past was not judged (the watches are not current): the
            # recovery of the watches asks again, not a timer spinning now.
            expires = self.store.claim_expires_at(task)
            if expires is not None and expires > now:
                self.agenda.at(expires, (TIMER_TASK, key))
        if decision.transition is None and decision.lease is LeaseOp.KEEP and not decision.refusal:
            return False
        ticket = self.store.start_write(record)
        self.gate.spawn(self.committer.apply(task, lease, decision, self.credits(), ticket))
        return True

    def _seen(self, record: TaskRecord, lease: LeaseRecord | None, now: float) -> claims.Seen:
        task = record.view
        changed = progress = None
        if lease is not None:
            changed = lease.seen.changed_at
            progress = lease.seen.progress_changed_at
        grace = record.grace
        token = task.status.fencing_token or 0
        if grace is not None and grace.token != token:
            grace = None
        if grace is None and task.status.grace_until is not None and task.active:
            # A grace period started by an earlier leader: continue it, from its end in
            # status (wall clock), at most its length ahead of us.
            left = (task.status.grace_until - self.clock.now()).total_seconds()
            left = max(0.0, min(left, float(task.spec.grace_period_seconds or 0)))
            grace = record.grace = Grace(token, now + left)
        refused = (
            lease is not None
            and lease.view.report is not None
            and lease.refused_report == lease.view.report
        )
        wall = self.clock.now()
        unwritable = record.lease_unwritable
        if unwritable is not None and (
            unwritable[0] != token or now < unwritable[1] + task.spec.lease_duration_seconds
        ):
            unwritable = None
        return claims.Seen(
            now=now,
            wall=wall,
            rand=self.rng.random(),
            changed_at=changed,
            progress_changed_at=progress,
            judgeable=self.health.healthy,
            grace_deadline=grace.deadline if grace is not None else None,
            progress_written_at=record.progress_written,
            report_refused=refused,
            deadline_at=deadline_end(record, now=now, wall=wall),
            revoked_at=lease.revoked_at if lease is not None else None,
            token_ceiling=self.token_ceiling(),
            lease_unwritable=unwritable[2] if unwritable is not None else None,
            revoke_refused=(
                record.revoke_refused[1]
                if record.revoke_refused is not None and record.revoke_refused[0] == token
                else None
            ),
        )

    # -- deadlines ----------------------------------------------------------------------

    def progress_due(self, record: TaskRecord, now: float) -> float:
        """When the claim's progress marker may next be copied into status."""
        written = record.progress_written
        return now if written is None else max(now, written + self.policy.progress_interval)

    def next_deadline(self, record: TaskRecord, now: float) -> float | None:
        """The earliest time the claim needs a decision: its Lease's expiry, the end of its
        grace period, its progress deadline, the next copy of its progress marker."""
        task = record.view
        lease = self.store.lease_of(task)
        if lease is None:
            return now
        dues = []
        expires = self.store.claim_expires_at(task)
        grace = record.grace
        if grace is not None and grace.token != (task.status.fencing_token or 0):
            grace = None
        if expires is not None and (expires > now or grace is None):
            dues.append(expires)  # (once expired in a grace period, its end is the deadline)
        if grace is not None:
            dues.append(grace.deadline)
        if lease.view.progress is not None:
            marker = protocol.bounded_text(lease.view.progress, protocol.MAX_PROGRESS_CHARS)
            if marker != task.status.progress:
                dues.append(self.progress_due(record, now))
        deadline = task.spec.progress_deadline_seconds
        revoked = claims.revoked_by_operator(task, lease.view)
        if deadline is not None and task.phase is TaskPhase.RUNNING and revoked is None:
            dues.append(lease.seen.progress_changed_at + deadline)
        if lease.revoked_at is not None:
            dues.append(lease.revoked_at + task.spec.lease_duration_seconds)
        active = deadline_end(record, now=now, wall=self.clock.now())
        if active is not None and (active > now or revoked is None):
            dues.append(active)  # (once revoked for it, the revocation's own deadlines)
        return min(dues) if dues else None

    def renewal_only(self, task: TaskView, old: LeaseView | None, new: LeaseView | None) -> bool:
        """Whether a change of ``task``'s claim Lease from ``old`` to ``new`` is a renewal of
        a healthy claim: the holder, token and report unchanged. No decision, no write:
        the claim's timer finds the new deadline when it fires, and a changed progress
        marker is copied into status when its interval allows (a timer for that)."""
        if not renews(task, old, new):
            return False
        assert old is not None and new is not None
        if old.progress != new.progress:
            record = self.store.tasks[task.key]
            now = self.clock.monotonic()
            self.agenda.at(self.progress_due(record, now), (TIMER_TASK, task.key))
        return True

    def timer(self, record: TaskRecord, now: float) -> None:
        """A task timer fired: decide it if its claim's next deadline has come."""
        key = record.key
        if record.redecide_at is not None and record.redecide_at <= now:
            # The retry it asked for is this one: decided again, whatever the claim's next
            # deadline (a report whose commit had an unknown outcome, a revocation that
            # lost a race: the holder's renewals are no decision, so nothing else would).
            record.redecide_at = None
            self.agenda.dirty.add(key)
            return
        if record.redecide_at is not None:
            self.agenda.at(record.redecide_at, (TIMER_TASK, key))  # another timer fired first
        if not record.view.active:
            # A retry after a write's unknown outcome (a requeue, an Unschedulable
            # condition, a Lease to delete): the task has no claim to time.
            self.agenda.dirty.add(key)
            return
        due = self.next_deadline(record, now)
        if due is not None and due > now:
            self.agenda.at(due, (TIMER_TASK, key))  # renewed since: look again then
        else:
            self.agenda.dirty.add(key)


def _reported_wait(record: TaskRecord, now: float) -> tuple[str, str] | None:
    """The budget wait the task's condition should say: once it lasted a while."""
    wait = record.budget_wait
    if wait is None or now - wait[2] < WAIT_REPORT_SECONDS:
        return None
    return wait[0], wait[1]
