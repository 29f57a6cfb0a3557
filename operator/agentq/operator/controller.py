"""The controller: the loop that turns what the watches recorded into decisions.

The data path (docs/architecture.md):

    watch event -> ``observe`` -> store (record, mark changed) -> ``step``:
      1. apply the changes: indexes, scheduling cores, readiness (``_apply``)
      2. fire the timers that are due
      3. decide the dirty tasks (``decide.Decider``) -> writes (``commit.Committer``)
      4. grant pending tasks (``dispatch.Dispatcher``) -> writes
      5. publish worker status and gauges (``publish.Publisher``), AgentQueue
         status (``queue_status.QueueStatuses``) and AgentBudget status
         (``budget_status.BudgetStatuses``)
    -> the request gate (slots, leadership) -> the ``port.Kube`` -> the API server

Watch callbacks only record; everything else runs in the step, which never
waits on I/O. The parts take the collaborators they need (store, indexes,
cores, agenda, gate), never the controller. A new leader rebuilds every index
from the store (one rebuild); every ``RESYNC_INTERVAL`` the indexes are built
afresh, compared with the live ones (``invariants``) and replaced, and every
task decided again.

Expiry is never judged from a store that may be behind: not while a watch is
down (``health.WatchHealth``), not in the second after the process was stopped
(the stalled time is given back to every Lease), and never without re-reading
the Lease first (``confirm.ExpiryConfirmer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentq import protocol
from agentq.clock import Clock, parse_time
from agentq.models import BUDGET_PLURAL, QUEUE_PLURAL, TASK_PLURAL, WORKER_PLURAL
from agentq.operator import invariants, metrics
from agentq.operator.claim_api import ClaimRef
from agentq.operator.config import OperatorConfig
from agentq.operator.events import EventSink
from agentq.operator.health import AlwaysHealthy, WatchHealth
from agentq.operator.leader import LeaderElector
from agentq.operator.parts import Parts, wire
from agentq.operator.port import Body, Kube
from agentq.operator.records import TOMBSTONE_SECONDS
from agentq.operator.tokens import TokenAllocator
from agentq.operator.work import TIMER_TASK, Stats

__all__ = ["AlwaysHealthy", "Controller", "WatchHealth"]

log = logging.getLogger("agentq.controller")


class Controller:
    """The store, its indexes and the step; decisions run only while leading."""

    def __init__(
        self,
        *,
        kube: Kube,
        clock: Clock,
        config: OperatorConfig,
        rng: random.Random | None = None,
        health: WatchHealth | None = None,
        events: EventSink | None = None,
        tokens: TokenAllocator | None = None,
        strict: bool = False,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.config = config
        self.health = health or AlwaysHealthy()
        self.health.on_healthy(self._watches_recovered)
        # ``strict`` (tests): every step ends with ``check_invariants``; a violation raises.
        self.strict = strict
        self.leading = not config.leader_election
        self.stopping = False  # shutting down: never leads again (``drain``)
        # A new leader's first decision waits for ``catch_up`` (main: a fresh LIST of the
        # tasks into the store): the standby's watch may be behind the grants the previous
        # leader made in its last moments, and deciding without them puts a worker over
        # its maxInFlight. None: nothing to wait for (tests, a single replica).
        self.catch_up: Callable[[], Awaitable[None]] | None = None
        self.caught_up = True
        # The leader elector's check that our lease is still ours by our own clock, how
        # long it still is (bounds each decision's request), and the epoch our grants
        # carry (``use_elector``).
        self.lease_valid: Callable[[], bool] = lambda: True
        self.lease_remaining: Callable[[], float] = lambda: math.inf
        self.leader_epoch: Callable[[], int | None] = lambda: None
        self.leader_epoch_refused: Callable[[int], None] = self._epoch_floor
        self._no_election_epoch: int | None = None
        self.synced = False  # every watch has delivered its first full list
        self.stats = Stats()
        self._rebuild = self.leading  # a new leader rebuilds at its next step
        self._changed = asyncio.Event()
        self._last_resync = clock.monotonic()
        self._last_check = clock.monotonic()
        # A late reply comes within a request timeout: its tombstone is kept longer.
        self._tombstone_seconds = max(TOMBSTONE_SECONDS, 2 * config.request_seconds)

        # -- the state, what is derived from it, and the parts (parts.py)
        self.parts: Parts = wire(
            kube=kube,
            clock=clock,
            config=config,
            rng=rng or random.Random(),
            health=self.health,
            events=events,
            tokens=tokens,
            stats=self.stats,
            poke=self.poke,
            may_send=self.may_send,
            remaining=lambda: self.lease_remaining(),
            epoch=lambda: self.leader_epoch(),
            epoch_refused=lambda floor: self.leader_epoch_refused(floor),
        )
        parts = self.parts
        parts.agenda.timers.active = self.leading
        self.store, self.agenda, self.indexes = parts.store, parts.agenda, parts.indexes
        self.cores, self.gate, self.blind = parts.cores, parts.gate, parts.blind
        self.events, self.tokens, self.slots = parts.events, parts.tokens, parts.slots
        self.publisher, self.readiness = parts.publisher, parts.readiness
        self.queue_statuses = parts.queue_statuses
        self.budget_statuses = parts.budget_statuses
        self.confirmer, self.leases = parts.confirmer, parts.leases
        self.committer, self.decider = parts.committer, parts.decider
        self.dispatcher, self.follower = parts.dispatcher, parts.follower
        self.cleanup = parts.cleanup

    # == recording (watch callbacks: synchronous, never block, never decide) ============

    def poke(self) -> None:
        self._changed.set()

    def observe(self, plural: str, kind: str, body: Body, size: int = 0) -> None:
        """One watch event (``kind`` ADDED / MODIFIED / DELETED) of ``plural``."""
        deleted = kind == "DELETED"
        if plural == TASK_PLURAL:
            self.store.observe_task(body, deleted=deleted, size=size)
        elif plural == WORKER_PLURAL:
            self.store.observe_worker(body, deleted=deleted)
        elif plural == QUEUE_PLURAL:
            self.store.observe_queue(body, deleted=deleted)
        elif plural == BUDGET_PLURAL:
            self.store.observe_budget(body, deleted=deleted)
        elif plural == "namespaces":
            self.store.observe_namespace(body, deleted=deleted)
        elif plural == "leases":
            now = self.clock.monotonic()
            if not self.store.observe_lease(
                body, deleted=deleted, now=now, wall_age=self._age(body)
            ):
                return  # a renewal: noted by the store, applied whenever the step runs
        self.poke()

    def _age(self, body: Body) -> float:
        """How old a Lease's renewTime is by our wall clock (inf: unknown)."""
        renewed = parse_time(str((body.get("spec") or {}).get("renewTime") or ""))
        if renewed is None:
            return math.inf
        return (self.clock.now() - renewed).total_seconds()

    def _watches_recovered(self) -> None:
        """The watches are current again: look at every claim (expiry was not judged)."""
        for record in self.store.active_tasks():
            self.agenda.dirty.add(record.key)
        self.poke()

    # == the step ========================================================================

    def step(self) -> None:
        """One step: changes, timers, dirty tasks, dispatch, worker status. Never waits."""
        started = time.perf_counter()
        self.stats.steps += 1
        self.blind.check()
        now = self.clock.monotonic()
        if self._rebuild:
            self._take_lead(now)
        self.follower.apply()
        if self.caught_up:  # a catch-up LIST may still deliver bodies older than a deletion
            self.store.expire_tombstones(now, self._tombstone_seconds)
        self.follower.fire_timers(now)
        self.follower.refresh_queues()
        if now - self._last_resync >= self.config.resync_interval:
            self._resync(now)  # compared once the changes are applied, then rebuilt
        if self.synced:
            self.decider.decide_dirty()
            self.dispatcher.dispatch()
            self.publisher.publish()
            self.queue_statuses.publish()
            self.budget_statuses.publish()
            self.cleanup.run()
        self.publisher.gauges()
        if self.strict:
            violations = self.check_invariants(now)
            assert not violations, "\n".join(map(str, violations))
        elif now - self._last_check >= self.config.invariant_interval:
            self._last_check = now
            self._report(self.check_invariants(now))
        took = time.perf_counter() - started
        self.blind.worked(took)
        metrics.RECONCILE.observe(took)

    def check_invariants(self, now: float | None = None) -> list[invariants.Violation]:
        """Every index built afresh from the store and compared with the live one (after a
        step: ``now`` is the step's)."""
        if not self.leading or self._rebuild:
            return []  # a standby keeps no indexes; a new leader rebuilds them first
        self.stats.invariant_checks += 1
        later = self.clock.monotonic()
        return invariants.check(
            store=self.store,
            indexes=self.indexes,
            cores=self.cores,
            agenda=self.agenda,
            publishing=self.publisher.now,
            next_deadline=self.decider.next_deadline,
            healthy=self.health.healthy,
            now=later if now is None else now,
            later=later,
            wall=self.clock.now(),
        )

    def _report(self, violations: list[invariants.Violation]) -> None:
        for violation in violations:
            self.stats.invariant_violations += 1
            metrics.INVARIANT_VIOLATIONS.labels(violation.index).inc()
            log.error("invariant violated: %s", violation)
        checks = self.stats.invariant_checks
        if checks == 1 or checks % 100 == 0:
            log.info(
                "invariants: %d checks, %d violations since start",
                checks,
                self.stats.invariant_violations,
            )

    def _resync(self, now: float) -> None:
        """The safety net: build every index afresh (saying what differed), and decide
        every task and worker again."""
        self._last_resync = now
        self._report(self.check_invariants(now))
        self.follower.rebuild(urgent=False)

    # == leadership and lifecycle ======================================================

    def use_elector(self, elector: LeaderElector) -> None:
        """Decide only as ``elector`` says: while its Lease is ours by our clock, each
        request bounded by what is left of it, each grant with its epoch."""
        self.lease_valid = elector.valid
        self.lease_remaining = elector.remaining
        self.leader_epoch = lambda: elector.epoch
        self.leader_epoch_refused = elector.epoch_refused

    def _epoch_floor(self, floor: int) -> None:
        """Without leader election no Lease is ours to raise; the policy refused our
        grants for an epoch it read from an election Lease of an earlier install (a stale
        policy parameter: see ``LeaderElector.epoch_refused``): grants carry that one."""
        if self._no_election_epoch is None or floor > self._no_election_epoch:
            log.error(
                "the admission policy %s refused a grant for leader epoch %s: it reads an "
                "election Lease this replica (no leader election) never wrote; grants now "
                "carry epoch %s (docs/operator.md, 'A stale policy parameter')",
                protocol.LEADER_EPOCH_POLICY,
                floor,
                floor,
            )
            self._no_election_epoch = floor
            metrics.LEADER_EPOCH_POLICY_STALE.set(1)
        self.leader_epoch = lambda: self._no_election_epoch

    def set_synced(self) -> None:
        """Every watch delivered its first list: the store is complete."""
        if not self.synced:
            self.synced = True
            self.agenda.dirty.update(self.store.tasks)
            self.poke()

    def set_leading(self, leading: bool) -> None:
        if leading == self.leading or (leading and self.stopping):
            return
        metrics.LEADER_TRANSITIONS.inc()
        self.leading = leading
        metrics.LEADER.set(1 if leading else 0)
        if leading:
            self._rebuild = True  # the next step starts from what the API server says
            self.agenda.timers.active = True
            self.tokens.reset()  # never the remainder of a block reserved when we last led
            if self.catch_up is not None:
                self.caught_up = False
                self.gate.spawn(self._catch_up())
        else:
            self.stop_deciding()
        self.poke()

    def _take_lead(self, now: float) -> None:
        """A new leader starts from what the API server says (its store), not from what it
        decided when it last led: every index and core rebuilt, every timer pushed again,
        the leader's memory of each object reset."""
        self._rebuild = False
        self.agenda.timers.clear()
        self.agenda.dirty.clear()
        self.store.reset_writes()
        for record in self.store.tasks.values():
            record.grace = None  # recovered from status.graceUntil when decided
            record.retry_at = record.redecide_at = record.lost_race_at = None
            record.budget_wait = None
            if record.doubt is not None:  # a grant of unknown outcome: still held till then
                self.agenda.at(record.doubt[1], (TIMER_TASK, record.key))
        for worker in self.store.workers.values():
            worker.diagnosed_at = -math.inf  # a read cancelled with the lead: read again
        self.publisher.reset()
        self.queue_statuses.reset()
        self.budget_statuses.reset()
        self.cleanup.reset()
        self.cores.clear()
        self.follower.rebuild(urgent=True)
        self._last_resync = now

    async def _catch_up(self) -> None:
        assert self.catch_up is not None
        while self.leading:
            try:
                await self.catch_up()
            except Exception as err:  # the API server is away: no decision until it is back
                log.warning("a new leader could not read the tasks yet: %s", err)
                await asyncio.sleep(1.0)
                continue
            self.caught_up = True
            log.info("caught up with the API server; deciding")
            self.poke()
            return

    def may_decide(self) -> bool:
        """Leading, and the leader Lease still ours by our own monotonic clock."""
        return self.leading and self.caught_up and not self.stopping and self.lease_valid()

    def may_send(self) -> bool:
        """A decision already made may go out: we lead (or are draining before we release
        the leader Lease), and the Lease is still ours by our own monotonic clock."""
        return (self.leading or self.stopping) and self.lease_valid()

    def stop_deciding(self) -> None:
        """Leadership lost or shutting down: cancel every write in flight, decide nothing more."""
        self.leading = False
        metrics.LEADER.set(0)
        self.agenda.timers.active = False
        self.gate.cancel_all()
        self.agenda.dirty.clear()

    async def drain(self, timeout: float) -> None:
        """Shutting down: decide nothing more, but let the writes of decisions already made
        finish (at most ``timeout``, and only while the leader Lease is still ours) before
        the caller releases leadership. Cancelling them would not unsend the ones on the
        wire: the API server could apply one after the standby, told by the release, had
        started deciding; and a grant cut between its status and its Lease is half-made."""
        self.stopping = True
        self.leading = False
        metrics.LEADER.set(0)
        self.agenda.dirty.clear()
        if self.gate.writes:
            await asyncio.wait(list(self.gate.writes), timeout=timeout)
        self.stop_deciding()  # whatever is left

    # == the loop ======================================================================

    async def run(self, stop: asyncio.Event) -> None:
        self.events.start()
        self.blind.start()
        try:
            while not stop.is_set():
                await self._wait(self._next_wakeup())
                if stop.is_set():
                    return
                if not self.may_decide():
                    self.standby()
                    continue
                try:
                    self.step()
                except Exception:  # a step must never kill the loop; the next one retries
                    log.exception("controller step failed")
                    await asyncio.sleep(1.0)
        finally:
            self.blind.stop()
            await self.events.stop()

    async def _wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, timeout))
        self._changed.clear()

    def standby(self) -> None:
        """Not deciding (a standby, a leader catching up): what the watches recorded is
        not applied -- a new leader rebuilds everything from the records -- except the
        finished tasks, which have no record: the cleanup remembers them (its small,
        bounded entries). So the changes do not pile up while we wait, one per task ever
        seen, with a full view of every finished one. A leader that may not decide for
        a moment (its leader Lease not yet renewed) keeps them: its indexes are live."""
        if self.leading and not self._rebuild:
            return
        self.follower.drop_changes()

    def _next_wakeup(self) -> float:
        if not self.may_decide():
            # Timers are a leader's (left over from a lead, they are all past): a standby
            # wakes when poked (a change, the lead) or every reconcile interval.
            return self.config.reconcile_interval
        now = self.clock.monotonic()
        soonest = self.config.reconcile_interval
        for due in (self.agenda.timers.next_due(), self.cleanup.next_due()):
            if due is not None:
                soonest = min(soonest, due - now)
        return max(0.0, soonest)

    def note_stall(self, seconds: float) -> None:
        self.blind.note_stall(seconds)

    def note_api_silence(self, seconds: float) -> None:
        """The API server answered nothing for ``seconds`` while we waited (``silence``)."""
        self.blind.note_api_silence(seconds)

    async def settle(self, *, rounds: int = 50) -> None:
        """Run steps until nothing is left to do (tests): no dirty key, no write in flight."""
        for _ in range(rounds):
            self.step()
            if self.gate.writes:
                await asyncio.gather(*list(self.gate.writes), return_exceptions=True)
                continue
            await self.events.flush()
            if not self.agenda.dirty and not self.gate.writes and not self.store.changed:
                due = self.agenda.timers.next_due()
                if due is None or due > self.clock.monotonic():
                    return
        raise AssertionError(f"the controller did not settle: dirty={self.agenda.dirty}")

    # == the claim API's lookup (any replica: its watches fill the store) ================

    def claim_ref(self, lease_namespace: str, lease_name: str) -> ClaimRef | None:
        """The current claim across namespaces whose Lease is ``lease_namespace``/
        ``lease_name``, as the store shows it: an ``agentq-xtask-`` Lease, its task's
        status naming that worker in that namespace with that Lease, and the Lease's
        holder, worker label, token and task UID the claim's (docs/tenancy.md). None:
        no such claim (or not seen yet: the sidecar asks again)."""
        if not lease_name.startswith(protocol.XTASK_LEASE_PREFIX):
            return None
        lease = self.store.leases.get((lease_namespace, lease_name))
        if lease is None or lease.view.kind != protocol.LEASE_KIND_TASK:
            return None
        view = lease.view
        task = self.store.task(view.task)
        if task is None or not task.active or view.task_namespace is None:
            return None
        status = task.status
        worker = status.worker
        if (
            worker is None
            or status.worker_namespace != lease_namespace
            or status.lease_name != lease_name
            or status.fencing_token is None
            or view.token != status.fencing_token
            or view.holder != worker
            or view.worker_label != protocol.label_value(worker)
            or (view.task_uid is not None and view.task_uid != task.uid)
        ):
            return None
        record = self.store.workers.get((lease_namespace, worker))
        return ClaimRef(
            task_namespace=task.namespace,
            task_name=task.name,
            task_uid=task.uid,
            worker=worker,
            token=status.fencing_token,
            worker_pod_uid=record.view.owner_pod_uid if record is not None else None,
        )

    # -- for tests and the benchmark ----------------------------------------------------

    @property
    def writes(self) -> set[asyncio.Task[Any]]:
        writes: set[asyncio.Task[Any]] = self.gate.writes
        return writes
