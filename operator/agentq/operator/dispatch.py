"""Dispatch: the first pending tasks into the DRR core, and each grant it decides.

Each step pops the heads of the pending queues (``queue.PendingQueue``, highest
``spec.priority`` then oldest first per lane and capability set) into the
scheduling core for as long as workers have room and fewer than ``DISPATCH_BATCH``
grants are in flight; a capability set no available worker covers is skipped whole.
Two levels where AgentQueues are used (docs/tenancy.md): the queue level
(``tenants.QueueLevel``, hierarchical DRR by cost) picks the leaf served next --
an AgentQueue, or a namespace's tasks without ``spec.queue`` as one implicit
leaf while queued tasks share its workers -- then its head goes to the
worker-level core; the leaf is charged at the grant and refunded when the grant
is not made. A namespace no queue uses is served as before, apart. A re-dispatch
prefers another worker than the ones its failed attempts ran on (the task's
avoid set, ``claims.workers_to_avoid``).

A set whose tasks name AgentBudgets (docs/budgets.md) is asked of the budget book
(``budgeting.Budgets``) before the worker-level core: a refusal skips that set
for the pass -- other sets and lanes go past it -- and puts the time room may
come back on the agenda; an admitted grant is debited in the same step. What
follows (a refund when the grant did not land, a release when its claim ends)
follows the task's record (``Budgets.sync``). Tasks naming no budget never reach
the book.

A grant is the status compare-and-swap (phase Assigned, worker, attempt, a new
fencing token from ``TokenAllocator``), then the claim's Lease, then its Event.
A lost race (409) or a refusal gives the decision back to the core (``abort``),
and a task whose writes are refused for good back to the queue when its pause ends;
an unknown outcome keeps the worker's slot held and the task out of the queue until
a newer view of the task says whether it landed (``TaskRecord.doubt``, at most
``DOUBT_SECONDS``). A
grant that finds this replica no longer sure to lead when its turn to be sent
comes (``Controller.call``) is not sent: the decision goes back to the core and
the task back to the queue. Each grant carries the epoch of the leadership it was
decided under (``status.leaderEpoch``); one the admission policy refuses for an old
epoch (another replica leads) goes back the same way, after a pause.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from agentq import claims, lifecycle, protocol
from agentq.clock import Clock
from agentq.operator import metrics
from agentq.operator.budgeting import WAIT_REPORT_SECONDS, wait_message
from agentq.operator.commit import Committer
from agentq.operator.cores import Cores
from agentq.operator.gate import RequestGate
from agentq.operator.indexes import Indexes
from agentq.operator.leases import ClaimLeases
from agentq.operator.port import KubeError, NotLeading, Status
from agentq.operator.publish import Publisher
from agentq.operator.queue import Lane, QueueKey, SetKey
from agentq.operator.records import TaskRecord
from agentq.operator.store import Store
from agentq.operator.tokens import TokenAllocator
from agentq.operator.work import (
    REFUSED_SECONDS,
    RETRY_SECONDS,
    TIMER_BUDGET,
    TIMER_TASK,
    Agenda,
    Retries,
    Stats,
)
from agentq.scheduler import Assignment, Scheduler, TaskSpec
from agentq.scheduler.budgets import Wait
from agentq.scheduler.tenancy import Charge
from agentq.views import TaskView

__all__ = ["Dispatcher"]

# How long a grant of unknown outcome holds its worker's slot if no newer view of its
# task comes: past the longest a request may take (the request timeout, 10 s at most
# by default) with a margin for a slow watch.
DOUBT_SECONDS = 30.0

log = logging.getLogger("agentq.controller")
# The leaseTransitions the policy agentq-leader-epoch compared our epoch with, from its
# refusal's message (manifests/leader-epoch-policy.yaml, the chart's copy).
_POLICY_EPOCH = re.compile(r"older than the leaseTransitions \((\d+)\)")

# What ``Dispatcher._one`` did with a lane.
_GRANTED, _NONE, _STOP = object(), object(), object()


class Dispatcher:
    """Grants pending tasks to workers (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        indexes: Indexes,
        cores: Cores,
        tokens: TokenAllocator,
        gate: RequestGate,
        committer: Committer,
        leases: ClaimLeases,
        retries: Retries,
        publisher: Publisher,
        agenda: Agenda,
        clock: Clock,
        stats: Stats,
        batch: int,
        epoch: Callable[[], int | None] = lambda: None,
        on_granted: Callable[[Charge], None] = lambda charge: None,
        epoch_refused: Callable[[int], None] = lambda floor: None,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.cores = cores
        self.tokens = tokens
        self.gate = gate
        self.committer = committer
        self.leases = leases
        self.retries = retries
        self.publisher = publisher
        self.agenda = agenda
        self.clock = clock
        self.stats = stats
        self.batch = batch  # most grants in flight at once (DISPATCH_BATCH)
        self.epoch = epoch  # the leader's epoch, which each grant carries
        # The policy refused our epoch as older than the leaseTransitions it reads: told to
        # the elector, which knows whether that is a takeover or a stale policy parameter.
        self.epoch_refused = epoch_refused
        self.on_granted = on_granted  # a grant charged on a queue was committed
        self.grants: set[asyncio.Task[Any]] = set()  # grants in flight
        self._refill: asyncio.Task[None] | None = None  # the token refill in flight

    def dispatch(self) -> None:
        """Pop the first dispatchable heads (priority, then age) into the DRR core while
        workers have room: first the queue level's turns (the lanes of AgentQueues and of
        the namespaces whose workers they share), then every other namespace as before."""
        queue = self.indexes.queue
        if queue.touched:
            self.cores.queues.refresh(queue)
        if not self.cores.budgets.restored:
            # A new leader's budget book, from what the API server shows, before its
            # first grant (the store is complete: dispatch runs once it is synced).
            self.cores.budgets.restore()
        budget = self.batch - len(self.grants)
        if budget <= 0:
            return
        lanes = queue.lanes()
        shared = {lane[0] for lane in lanes if lane[1]}
        if shared or self.cores.queues.implicit:
            budget = self._dispatch_queues(budget, shared)
            if budget <= 0 and self._refill is not None and not self._refill.done():
                return  # the fencing tokens ran out: wait for the refill
        for lane in lanes:
            if budget <= 0:
                return
            if lane[1] or lane[0] in shared:
                continue  # served by the queue level's turns
            scheduler = self.cores.get(lane[0])
            if scheduler is None:
                continue
            blocked: set[SetKey] = set()
            while budget > 0:
                outcome = self._one(lane, scheduler, blocked, None)
                if outcome is _GRANTED:
                    budget -= 1
                elif outcome is _STOP:
                    return
                else:
                    break

    def _dispatch_queues(self, budget: int, shared: set[str]) -> int:
        """The queue level's turns (docs/tenancy.md): pick the leaf the hierarchical DRR
        serves next, offer its head to the worker-level core of its namespace, charge the
        leaf on a grant; a leaf whose head no worker can take now (or at its cap, or whose
        head's write is in flight) is passed over for the rest of the pass."""
        level = self.cores.queues
        queue = self.indexes.queue
        level.share_namespaces(queue, shared)
        exclude: set[str] = set()
        blocked: dict[tuple[str, str], set[SetKey]] = {}
        while budget > 0:
            level.refresh(queue)
            leaf = level.tree.pick(frozenset(exclude))
            if leaf is None:
                break
            if level.capped(leaf, self.indexes.queue_claims):
                exclude.add(leaf)
                continue
            lane = level.lane_of(leaf)
            scheduler = self.cores.get(lane[0])
            if scheduler is None:
                exclude.add(leaf)
                continue
            outcome = self._one(lane, scheduler, blocked.setdefault(lane, set()), leaf)
            if outcome is _GRANTED:
                budget -= 1
            elif outcome is _STOP:
                budget = 0
                break
            else:
                exclude.add(leaf)
        level.refresh(queue)
        return budget

    def _one(
        self,
        lane: Lane,
        scheduler: Scheduler,
        blocked: set[SetKey],
        leaf: str | None,
    ) -> object:
        """Grant the first head of ``lane`` (over its sets not ``blocked``) its budgets
        admit and some worker can take: ``_GRANTED``; ``_NONE`` when none can (or the head's write
        is in flight: the lane waits for the next step); ``_STOP`` when the fencing tokens
        ran out. ``leaf``: the queue level's leaf to charge."""
        queue = self.indexes.queue
        namespace = lane[0]
        while True:
            # The first head of all sets: highest priority, then oldest.
            best: tuple[QueueKey, SetKey] | None = None
            for where in queue.sets(lane):
                if where in blocked:
                    continue
                head = queue.head(lane, where)
                if head is not None and (best is None or head < best[0]):
                    best = (head, where)
            if best is None:
                return _NONE
            name, where = best[0][2], best[1]
            required, named = where
            # ``name`` is the claim id: a task of another namespace is <namespace>~<task>.
            key = protocol.claim_task(namespace, name)
            record = self.store.tasks.get(key)
            if record is not None and record.busy:
                # A write about it is in flight (its Unschedulable condition cleared,
                # say): it stays at the head and the lane waits for the next step (the
                # write's end makes one). Skipping only its set let a younger task of
                # another set take the slot this one was about to get.
                return _NONE
            if record is None or not record.view.pending:
                # Not grantable after all (the invariants say this never happens):
                # off the queue; the record's next change puts it back if it should.
                queue.pop(lane, where)
                continue
            task = record.view
            if self.tokens.forged(task.status.fencing_token or 0):
                queue.pop(lane, where)  # decided (Failed): not granted
                self.agenda.decide(key)
                continue
            current = task.status.fencing_token or 0
            if not self.tokens.ready(current):
                self._refill_tokens()
                return _STOP
            now = self.clock.monotonic() if named else 0.0  # (only a budget reads it)
            if named:
                wait = self.cores.budgets.admits(task, now)
                if wait is not None:
                    # No room in a budget it names: this set waits (no overtaking inside
                    # it); the lane's other sets, and other lanes, go past it.
                    blocked.add(where)
                    self._budget_refused(record, wait, now)
                    continue
            planned = scheduler.plan(
                [
                    TaskSpec(
                        name=name,
                        required=required,
                        cost=task.spec.cost,
                        # A re-dispatch prefers another worker than the failed ones.
                        avoid=claims.workers_to_avoid(task.status),
                    )
                ]
            )
            if not planned:
                # No worker can take this set now: skip it whole. No token is taken until
                # the core has placed the task (taken first, every step of a backlog used
                # one up, and the grants soon waited for a refill of the block).
                blocked.add(where)
                continue
            token = self.tokens.take(current)
            assert token is not None  # ready() said so, and nothing ran in between
            queue.pop(lane, where)
            if named:
                self.cores.budgets.debit(task, token, now)  # before the grant is sent
                record.budget_wait = None
            charge = None if leaf is None else self.cores.queues.charge(leaf, task.spec.cost)
            foreign = key[0] != namespace  # a claim across namespaces (docs/tenancy.md)
            ticket = self.store.start_write(
                record, granting=planned[0].worker, namespace=namespace if foreign else None
            )
            if foreign:
                self.cores.loaded[key] = namespace  # the core that holds it now
            self.publisher.mark((namespace, planned[0].worker))
            # The epoch the decision was made under, not the one of its sending.
            grant = self.gate.spawn(
                self._grant(
                    scheduler,
                    task,
                    planned[0],
                    token,
                    ticket,
                    self.epoch(),
                    charge,
                    namespace if foreign else None,
                )
            )
            # Counted until done, even if cancelled before it ran (leadership lost).
            self.grants.add(grant)
            grant.add_done_callback(self.grants.discard)
            return _GRANTED

    def _budget_refused(self, record: TaskRecord, wait: Wait, now: float) -> None:
        """The head of a set refused by ``wait``'s budget: a step when room may come back
        by time alone, and the task's condition once it has waited a while."""
        if wait.until is not None:
            self.agenda.at(wait.until, (TIMER_BUDGET, ("", wait.budget)))
        message = wait_message(wait, now)
        held = record.budget_wait
        since = now if held is None else held[2]
        if held is None or held[:2] != (wait.reason, message):
            record.budget_wait = (wait.reason, message, since)
        due = since + WAIT_REPORT_SECONDS
        if due > now:
            self.agenda.at(due, (TIMER_TASK, record.key))  # decided then: its condition
        elif lifecycle.condition(record.view.status, lifecycle.BUDGETED) != (False, message):
            self.agenda.dirty.add(record.key)  # its condition says so now

    def _refill_tokens(self) -> None:
        """Reserve the next block of fencing tokens, once at a time. In flight is judged by
        the task itself, not a flag its body clears: a refill cancelled before it ran
        (leadership lost in the step that spawned it) never runs a ``finally``, and a
        flag left set would stop every dispatch for good after the lead came back."""
        if self._refill is not None and not self._refill.done():
            return

        async def refill() -> None:
            try:
                await self.tokens.refill()
            except KubeError as err:
                log.warning("could not reserve fencing tokens: %s", err)
                await asyncio.sleep(RETRY_SECONDS)

        self._refill = self.gate.spawn(refill())

    async def _grant(
        self,
        scheduler: Scheduler,
        task: TaskView,
        assignment: Assignment,
        token: int,
        ticket: int,
        epoch: int | None,
        charge: Charge | None = None,
        worker_namespace: str | None = None,
    ) -> None:
        """``worker_namespace``: the worker's, when it is not the task's."""
        key = task.key
        committer = self.committer
        committed = False
        refund = charge is not None
        try:
            transition = lifecycle.grant(
                task.status,
                worker=assignment.worker,
                lease_name=(
                    protocol.task_lease_name(task.name)
                    if worker_namespace is None
                    else protocol.cross_task_lease_name(task.namespace, task.name)
                ),
                token=token,
                now=self.clock.now(),
                epoch=epoch,
                worker_namespace=worker_namespace,
            )
            reply = await committer.write_status(task, transition.patch)
            if reply.status is Status.INVALID:
                scheduler.abort(assignment)
                await committer.refused_for_good(task, transition, reply.message)
                return
            if reply.status is Status.FORBIDDEN:
                scheduler.abort(assignment)
                if protocol.LEADER_EPOCH_POLICY in reply.message:
                    # A deposed leader's grant, refused for its old epoch: another replica
                    # leads (ours will know at its next round). Nothing was written.
                    self.stats.deposed += 1
                    metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()  # a race lost
                    log.warning(
                        "grant of %s/%s refused: epoch %s is not the leader's (deposed)",
                        *key,
                        epoch,
                    )
                    policy_epoch = _POLICY_EPOCH.search(reply.message)
                    if policy_epoch is not None:
                        self.epoch_refused(int(policy_epoch.group(1)))
                    # Not again at once: our elector learns of the new leader within a round.
                    self.retries.not_granted_for(key, RETRY_SECONDS)
                else:
                    committer.refused_by_rbac(task, reply.message)
                    self.retries.not_granted_for(key, REFUSED_SECONDS)
                return
            if not reply.ok or reply.body is None:
                # 409 / 404: the task changed or went; its event decides again.
                scheduler.abort(assignment)
                self.stats.conflicts += 1
                metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
                record = self.store.tasks.get(key)
                if record is not None:
                    record.lost_race_at = task.resource_version
                return
            committed = True
            refund = False
            if charge is not None:
                self.on_granted(charge)  # the queues' served cost (their status)
            updated = self.store.observe_task(reply.body)
            if updated is None or updated.uid != task.uid:
                return  # deleted meanwhile (and maybe re-created): no Lease for it
            lease = self.store.lease_of(updated)
            await self.leases.write_grant(updated, lease.view if lease is not None else None)
            self.stats.grants += 1
            committer.record(updated, transition)
            metrics.DISPATCHES.labels(task.namespace).inc()
            record = self.store.tasks.get(key)
            if record is not None and record.pending_since is not None:
                metrics.DISPATCH_LATENCY.observe(self.clock.monotonic() - record.pending_since)
        except NotLeading:
            # Not sent: our lease may have passed to a standby while this grant waited.
            if committed:  # the status is written, its Lease not: a leader repairs it
                self.retries.later(key)
            else:
                scheduler.abort(assignment)
        except KubeError as err:
            if not committed:
                # Unknown outcome: the grant may still land (a request cut at our timeout
                # is not withdrawn from the API server). Giving its slot back at once let
                # the next step grant the worker another task while this one landed too:
                # one worker over its maxInFlight. The slot stays held and the task is not
                # granted again until a newer view of it says what happened (the store
                # clears the doubt), or DOUBT_SECONDS later (the timer below).
                record = self.store.tasks.get(key)
                if record is not None and record.view.uid == task.uid:
                    refund = False  # it may have landed: its queue stays charged
                    until = self.clock.monotonic() + DOUBT_SECONDS
                    record.doubt = (assignment.worker, until)
                    self.agenda.at(until, (TIMER_TASK, key))
                else:
                    scheduler.abort(assignment)
            self.stats.unknown += 1
            log.warning("grant of %s/%s had an unknown outcome: %s", *key, err)
            self.retries.later(key)
        finally:
            if charge is not None:
                # A grant not made (its compare-and-swap lost, refused, not sent) gives
                # its queue the cost back, as the worker level's abort does.
                self.cores.queues.ended(charge, refund=refund)
            committer.write_ended(task, None, ticket)
