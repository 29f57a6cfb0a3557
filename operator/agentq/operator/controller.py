"""The controller: the loop that turns what the watches recorded into decisions.

The data path (docs/architecture.md):

    watch event -> ``observe`` -> store (record, mark changed) -> ``step``:
      1. apply the changes: indexes, scheduling cores, readiness (``_apply``)
      2. fire the timers that are due
      3. decide the dirty tasks (``decide.Decider``) -> writes (``commit.Committer``)
      4. grant pending tasks (``dispatch.Dispatcher``) -> writes
      5. publish worker status and gauges (``publish.Publisher``)
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

from agentq import claims, protocol
from agentq.clock import Clock, parse_time
from agentq.models import TASK_PLURAL, WORKER_PLURAL
from agentq.operator import invariants, metrics
from agentq.operator.commit import Committer
from agentq.operator.config import OperatorConfig
from agentq.operator.confirm import ExpiryConfirmer
from agentq.operator.cores import Cores
from agentq.operator.decide import Decider
from agentq.operator.dispatch import Dispatcher
from agentq.operator.events import EventSink
from agentq.operator.gate import RequestGate
from agentq.operator.health import AlwaysHealthy, WatchHealth
from agentq.operator.indexes import Indexes
from agentq.operator.port import Body, Kube
from agentq.operator.publish import Publisher
from agentq.operator.readiness import WorkerReadiness
from agentq.operator.slots import Slots
from agentq.operator.store import Store
from agentq.operator.tokens import TokenAllocator
from agentq.operator.work import (
    TIMER_BACKOFF,
    TIMER_PUBLISH,
    TIMER_TASK,
    TIMER_WORKER,
    Agenda,
    Stats,
)
from agentq.views import Key, LeaseView

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
        # The leader elector's check that our lease is still ours by our own clock.
        self.lease_valid: Callable[[], bool] = lambda: True
        self.synced = False  # every watch has delivered its first full list
        self.stats = Stats()
        # Bumped each time every Lease is given time back (a stall of ours, a silence of
        # the API server): an expiry decided before that is decided again, not committed.
        self.credits = 0
        self._given_until = -math.inf  # time up to which it was given back
        self._rebuild = self.leading  # a new leader rebuilds at its next step
        self._changed = asyncio.Event()
        self._last_resync = clock.monotonic()
        self._last_check = clock.monotonic()
        self._last_tick = clock.monotonic()
        self._worked = 0.0  # seconds spent in steps since the watchdog's last tick
        self._watchdog: asyncio.Task[None] | None = None
        self.watchdog_period = 0.25

        # -- state, and what is derived from it
        self.store = Store()
        self.agenda = Agenda(self.poke)
        self.agenda.timers.active = self.leading
        self.indexes = Indexes(timers=self.agenda.timers, clock=clock)
        self.cores = Cores(self.store, self.indexes.claims)
        # -- API requests: decisions first, then Events and tidying up
        self.slots = Slots(config.write_concurrency, clock=clock)
        self.gate = RequestGate(self.slots, may_send=self.may_send, on_done=self.poke)
        self.events = events or EventSink(
            kube, clock, component="agentq-operator", slots=self.slots
        )
        self.tokens = tokens or TokenAllocator(
            kube,
            clock,
            namespace=config.leader_namespace,
            name=config.token_lease,
            block=config.token_block,
        )
        # -- the parts
        self.publisher = Publisher(
            store=self.store,
            indexes=self.indexes,
            cores=self.cores,
            agenda=self.agenda,
            gate=self.gate,
            kube=kube,
            clock=clock,
            config=config,
            stats=self.stats,
        )
        self.readiness = WorkerReadiness(
            store=self.store,
            cores=self.cores,
            agenda=self.agenda,
            gate=self.gate,
            kube=kube,
            clock=clock,
            publisher=self.publisher,
            redecide=self.agenda.dirty.update,
        )
        self.confirmer = ExpiryConfirmer(
            gate=self.gate, kube=kube, cores=self.cores, stats=self.stats
        )
        self.committer = Committer(
            store=self.store,
            agenda=self.agenda,
            gate=self.gate,
            kube=kube,
            events=self.events,
            clock=clock,
            confirmer=self.confirmer,
            readiness=self.readiness,
            stats=self.stats,
            credits=lambda: self.credits,
        )
        self.decider = Decider(
            store=self.store,
            indexes=self.indexes,
            agenda=self.agenda,
            gate=self.gate,
            committer=self.committer,
            health=self.health,
            clock=clock,
            rng=rng or random.Random(),
            policy=claims.Policy(
                max_reclaims=config.max_reclaims,
                progress_interval=config.progress_status_interval,
            ),
            stats=self.stats,
            write_concurrency=config.write_concurrency,
            credits=lambda: self.credits,
        )
        self.dispatcher = Dispatcher(
            store=self.store,
            indexes=self.indexes,
            cores=self.cores,
            tokens=self.tokens,
            gate=self.gate,
            committer=self.committer,
            publisher=self.publisher,
            clock=clock,
            stats=self.stats,
            batch=config.dispatch_batch,
        )

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
        self._check_stall()
        now = self.clock.monotonic()
        if self._rebuild:
            self._take_lead(now)
        elif now - self._last_resync >= self.config.resync_interval:
            self._resync(now)
        self._apply()
        self._fire_timers(now)
        if self.synced:
            self.decider.decide_dirty()
            self.dispatcher.dispatch()
            self.publisher.publish()
        self.publisher.gauges()
        if self.strict:
            violations = self.check_invariants(now)
            assert not violations, "\n".join(map(str, violations))
        elif now - self._last_check >= self.config.invariant_interval:
            self._last_check = now
            self._report(self.check_invariants(now))
        took = time.perf_counter() - started
        self._worked += took
        metrics.RECONCILE.observe(took)

    def _apply(self) -> None:
        """Make the indexes, cores and readiness agree with every record that changed."""
        changed = self.store.changed
        while changed:
            workers, leases, tasks = (
                list(changed.workers),
                list(changed.leases.items()),
                list(changed.tasks.items()),
            )
            changed.clear()
            for key in workers:
                self._apply_worker(key)
            for key, view_changed in tasks:
                self._apply_task(key, view_changed)
            for _, (old, new) in leases:
                self._apply_lease(old, new)

    def _apply_task(self, key: Key, view_changed: bool) -> None:
        record = self.store.tasks.get(key)
        self.indexes.sync_task(key, record)
        for worker in self.cores.sync_load(key, record):
            if worker is not None:
                self.publisher.mark((key[0], worker))
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
            self.agenda.dirty.update((key[0], task) for task in self.cores.upsert_worker(key, None))
            self.publisher.forget(key)
            return
        self.readiness.evaluate(key)
        self.publisher.check(record)

    def _apply_lease(self, old: LeaseView | None, new: LeaseView | None) -> None:
        lease = new or old
        assert lease is not None
        subject = (lease.namespace, lease.subject)
        if lease.kind == protocol.LEASE_KIND_WORKER:
            self.readiness.evaluate(subject)  # and looked at again when it would go stale
            return
        task = self.store.task(subject)
        if task is not None and not self.decider.renewal_only(task, old, new):
            self.agenda.dirty.add(subject)

    def _fire_timers(self, now: float) -> None:
        for kind, key in self.agenda.timers.pop_due(now):
            if kind == TIMER_TASK:
                task = self.store.tasks.get(key)
                if task is not None:
                    self.decider.timer(task, now)
            elif kind == TIMER_BACKOFF:
                self.indexes.sync_task(key, self.store.tasks.get(key))  # queued if it may be
            elif kind == TIMER_PUBLISH:
                self.publisher.timer(key, now)
            elif kind == TIMER_WORKER:
                self.readiness.evaluate(key)  # renewed since: pushes the timer for the new expiry

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

    def _resync(self, now: float) -> None:
        """The safety net: build every index afresh (saying what differed), and decide
        every task and worker again."""
        self._last_resync = now
        self._report(self.check_invariants(now))
        self._rebuild_indexes(urgent=False)

    def _rebuild_indexes(self, *, urgent: bool) -> None:
        """Every index and core from the records; every task decided and every worker
        evaluated again (``urgent``: its status compared at once, a new leader's way)."""
        self.store.changed.clear()
        self.indexes.rebuild(self.store)
        for namespace in {key[0] for key in self.store.workers}:
            self.cores.of(namespace)
        for key, task in self.store.tasks.items():
            self.cores.sync_load(key, task)
            self.tokens.observe(task.view.status.fencing_token)
        for key in self.store.workers:
            self.readiness.evaluate(key)  # with its staleness timer
            self.publisher.mark(key, urgent=urgent)
        self.agenda.dirty.update(self.store.tasks)

    # == leadership and lifecycle ======================================================

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
            record.retry_at = None
        for worker in self.store.workers.values():
            worker.diagnosed_at = -math.inf  # a read cancelled with the lead: read again
        self.publisher.reset()
        self.cores.clear()
        self._rebuild_indexes(urgent=True)
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
        self._last_tick = self.clock.monotonic()
        self._watchdog = asyncio.create_task(self._watch_the_clock(), name="watchdog")
        try:
            while not stop.is_set():
                await self._wait(self._next_wakeup())
                if stop.is_set():
                    return
                if not self.may_decide():
                    continue
                try:
                    self.step()
                except Exception:  # a step must never kill the loop; the next one retries
                    log.exception("controller step failed")
                    await asyncio.sleep(1.0)
        finally:
            self._watchdog.cancel()
            await self.events.stop()

    async def _wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, timeout))
        self._changed.clear()

    def _next_wakeup(self) -> float:
        now = self.clock.monotonic()
        due = self.agenda.timers.next_due()
        soonest = self.config.reconcile_interval
        if due is not None:
            soonest = min(soonest, due - now)
        return max(0.0, soonest)

    async def _watch_the_clock(self) -> None:
        while True:
            await asyncio.sleep(self.watchdog_period)
            try:
                self._check_stall()
            except Exception:  # the watchdog must outlive anything it meets
                log.exception("the stall watchdog failed; it goes on")

    def _check_stall(self) -> None:
        """Running much later than due means this process did not run (SIGSTOP, a starved
        host): give that time back to every Lease instead of counting it against them.
        Called by the watchdog every ``watchdog_period`` and before every step."""
        if self._watchdog is None:
            return
        now = self.clock.monotonic()
        lag = now - self._last_tick - self.watchdog_period
        # Time the loop spent in our own steps is not a stall: a step deciding 500
        # reclaims at once must not credit every Lease (and delay those very reclaims).
        lag -= self._worked
        self._worked = 0.0
        self._last_tick = now
        metrics.LOOP_LAG.set(max(0.0, lag))
        if lag > self.config.stall_seconds:
            self.note_stall(lag)

    def note_stall(self, seconds: float) -> None:
        log.warning(
            "the operator did not run for %.1fs; that time is not counted against leases",
            seconds,
        )
        self.stats.stalls += 1
        self.stats.stalled_seconds += seconds
        self._give_back(seconds)

    def note_api_silence(self, seconds: float) -> None:
        """The API server answered nothing for ``seconds`` while we waited (``silence``):
        the holders could not renew either. (A request out while this process itself was
        stopped waited through that stop too: that part was given back as a stall.)"""
        given = self._give_back(seconds, at_least=self.config.api_silence_seconds)
        if not given:
            return
        log.warning(
            "the API server answered nothing for %.1fs; that time is not counted against leases",
            given,
        )
        metrics.API_SILENCE.inc(given)
        self.stats.api_silences += 1

    def _give_back(self, seconds: float, *, at_least: float = 0.0) -> float:
        """Every Lease (and grace period) gets back the last ``seconds``, less what was
        given back already (a stall of ours and a silence of the API server may be the
        same time, seen twice), if that is ``at_least``; returns what was given. An expiry
        decided before this and not yet committed is decided again (``credits`` moved)."""
        now = self.clock.monotonic()
        given = now - max(now - seconds, self._given_until)
        if given <= 0 or given < at_least:
            return 0.0
        self._given_until = now
        self.credits += 1
        self.store.credit(given)
        return given

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

    # -- for tests and the benchmark ----------------------------------------------------

    @property
    def writes(self) -> set[asyncio.Task[Any]]:
        return self.gate.writes
