"""The controller: caches fed by watch events, one loop that decides, and its parts.

Kueue's split, as glue around pure decisions. This module owns the caches and
the loop; each other job has a module of its own:

- **cache** (here) -- ``observe_task`` / ``observe_worker`` / ``observe_lease``
  turn each watch event into a typed view (``agentq.views``) and update, in O(1)
  (O(log n) for a heap), the indexes decisions need: pending tasks per namespace
  and capability set (``cache.PendingQueue``), one timer heap for every deadline
  (lease expiry, grace, backoff, progress, worker staleness), each worker's
  claims in the scheduling core, the keys that changed (``dirty``). A renewal
  of a healthy claim only notes the time it was seen: no decision, no write.
- **decide** (here) -- each step takes the dirty keys and the due timers and
  asks ``agentq.claims`` what to do for each: work proportional to what
  changed, not to the fleet.
- **commit** (``commit.Committer``) -- a decision is applied through the narrow
  ``port.Kube`` with a compare-and-swap on the resourceVersion it was made on; a
  lost race, a 404 or an unknown outcome drops it and the next event decides
  again; a write the API server will never accept becomes a visible state.
- **dispatch** (``dispatch.Dispatcher``) -- the heads of the pending queues go
  into the DRR core (``agentq.scheduler``) while workers have room; each grant
  is written as a status CAS and the claim's Lease.
- **readiness** (``readiness.WorkerReadiness``) -- each worker's readiness from
  its worker Lease, and its place in the core.
- **publish** (``publish.Publisher``) -- worker status when it changes, within
  an interval per worker and a rate for all; the gauges of the indexes.
- **slots** (``slots.Slots``) -- API requests in flight, decisions first, then
  Events (``events.EventSink``) and tidying up.

A full re-decision of every task runs every ``RESYNC_INTERVAL`` as a safety net.
Expiry is never judged from a store that may be behind: not while a watch is
down (``health.WatchHealth``), not in the second after the process was stopped
(the stalled time is given back to every Lease), and never without re-reading
the Lease first (``confirm_expiry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from agentq import claims, protocol, views
from agentq.claims import Decision, LeaseOp
from agentq.clock import Clock, parse_time
from agentq.expiry import LeaseRecord, LeaseTracker
from agentq.models import TASK_PLURAL, WORKER_PLURAL, TaskPhase
from agentq.operator import metrics
from agentq.operator.cache import (
    TIMER_BACKOFF,
    TIMER_PUBLISH,
    TIMER_TASK,
    TIMER_WORKER,
    Dirty,
    Key,
    PendingQueue,
    Timers,
    Tombstones,
    newer,
)
from agentq.operator.commit import Committer, Grace
from agentq.operator.config import OperatorConfig
from agentq.operator.confirm import ExpiryConfirmer
from agentq.operator.dispatch import Dispatcher
from agentq.operator.events import EventSink
from agentq.operator.health import AlwaysHealthy, WatchHealth
from agentq.operator.port import Body, Kube, NotLeading, Reply
from agentq.operator.publish import Publisher
from agentq.operator.readiness import WorkerReadiness
from agentq.operator.slots import Slots
from agentq.operator.tokens import TokenAllocator
from agentq.scheduler import Assignment, Scheduler
from agentq.views import LeaseView, TaskView, WorkerView

log = logging.getLogger("agentq.controller")


@dataclass
class _Stats:
    """Counters of the controller's own work, for tests and the benchmark."""

    steps: int = 0
    decisions: int = 0
    grants: int = 0
    confirm_reads: int = 0  # expiries confirmed by reading the Lease again
    confirm_lists: int = 0  # LISTs that confirmed the expiries of one worker's claims
    expiries_dropped: int = 0  # expiries a re-read of the Lease proved wrong
    conflicts: int = 0
    unknown: int = 0
    worker_status_writes: int = 0
    stalls: int = 0
    stalled_seconds: float = 0.0
    api_silences: int = 0
    timer_entries: int = 0
    notes: list[str] = field(default_factory=list)


class Controller:
    """Caches, indexes and the decide/commit loop; decisions run only while leading."""

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
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.config = config
        self.rng = rng or random.Random()
        self.health = health or AlwaysHealthy()
        self.health.on_healthy(self._watches_recovered)
        # API requests in flight at once; decisions before Events and tidying up.
        self.slots = Slots(config.write_concurrency, clock=clock)
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
        self.policy = claims.Policy(
            max_reclaims=config.max_reclaims, progress_interval=config.progress_status_interval
        )
        self.leading = not config.leader_election
        self.stopping = False  # shutting down: never leads again (``drain``)
        # A new leader's first decision waits for ``catch_up`` (main: a fresh LIST of the
        # tasks into the cache): the standby's watch may be behind the grants the previous
        # leader made in its last moments, and deciding without them puts a worker over
        # its maxInFlight. None: nothing to wait for (tests, a single replica).
        self.catch_up: Callable[[], Awaitable[None]] | None = None
        self.caught_up = True
        # The leader elector's check that our lease is still ours by our own clock.
        self.lease_valid: Callable[[], bool] = lambda: True
        self.synced = False  # every watch has delivered its first full list
        self.stats = _Stats()
        # -- caches
        self.tasks: dict[Key, TaskView] = {}
        self.workers: dict[Key, WorkerView] = {}
        self.leases: dict[Key, LeaseView] = {}
        self.tracker = LeaseTracker()
        # Bumped each time every Lease is given time back (a stall of ours, a silence of
        # the API server): an expiry decided before that is decided again, not committed.
        self.credits = 0
        self._given_until = -math.inf  # time up to which it was given back
        self._tombstones = Tombstones()
        self._worker_tombstones = Tombstones()
        # -- indexes
        self.schedulers: dict[str, Scheduler] = {}
        self.queue = PendingQueue()
        self.timers = Timers()
        self.dirty = Dirty()  # tasks to decide again, first marked first decided
        self.busy: set[Key] = set()  # tasks with a write in flight
        self._waiting: set[Key] = set()  # busy tasks marked dirty: decided when the write ends
        self.claims_of: dict[Key, set[str]] = {}  # worker -> the tasks it holds (from status)
        self._timer_due: dict[tuple[str, Key], float] = {}  # earliest live timer per subject
        self._offered: dict[str, dict[Key, frozenset[str]]] = {}  # ns -> worker -> capabilities
        self.uncovered: dict[tuple[str, frozenset[str]], str | None] = {}
        self.phase_counts: dict[str, int] = {}
        # -- per-object memory, each dropped with its object
        self.grace: dict[Key, Grace] = {}
        self.refused: dict[Key, str] = {}  # lease key -> the report text refused
        self.progress_written: dict[Key, float] = {}
        self.pending_since: dict[Key, float] = {}
        self._backoff: dict[Key, tuple[str, float]] = {}  # task -> (notBefore, due monotonic)
        self.unwritable: dict[Key, float] = {}  # task -> until (monotonic)
        # -- loop
        self._changed = asyncio.Event()
        self.writes: set[asyncio.Task[Any]] = set()
        self._last_resync = clock.monotonic()
        self._last_tick = clock.monotonic()
        self._worked = 0.0  # seconds spent in steps since the watchdog's last tick
        self._watchdog: asyncio.Task[None] | None = None
        self.watchdog_period = 0.25
        # -- the parts with a job of their own
        self.publisher = Publisher(self)
        self.ready = WorkerReadiness(self)
        self.committer = Committer(self)
        self.confirmer = ExpiryConfirmer(self)
        self.dispatcher = Dispatcher(self)

    # == cache: feeding (from watch events; synchronous, never blocks) =================

    def poke(self) -> None:
        self._changed.set()

    def observe(self, plural: str, kind: str, body: Body, size: int = 0) -> None:
        """One watch event (``kind`` ADDED / MODIFIED / DELETED) of ``plural``."""
        deleted = kind == "DELETED"
        if plural == TASK_PLURAL:
            self.observe_task(body, deleted=deleted, size=size)
        elif plural == WORKER_PLURAL:
            self.observe_worker(body, deleted=deleted)
        elif plural == "leases":
            self.observe_lease(body, deleted=deleted)

    def observe_task(self, body: Body, *, deleted: bool = False, size: int = 0) -> None:
        key = views.key_of(body)
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        old = self.tasks.get(key)
        if deleted:
            self._tombstones.bury(key, rv)
            if old is not None:
                self._forget_task(old)
            return
        if old is not None and not newer(rv, old.resource_version):
            return  # our own write's reply told us this already (or more)
        if old is None and self._tombstones.buried(key, rv):
            return  # a late reply about a task deleted since
        self._tombstones.revive(key)
        view = views.task_view(body, size=size)
        if old is not None and old.uid != view.uid:
            self._forget_task(old)  # deleted and re-created while we were not watching
            old = None
        self.tasks[key] = view
        self.tokens.observe(view.status.fencing_token)
        self._index_task(old, view)
        self.dirty.add(key)
        self.poke()

    def observe_worker(self, body: Body, *, deleted: bool = False) -> None:
        key = views.key_of(body)
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        old = self.workers.get(key)
        if deleted:
            self._worker_tombstones.bury(key, rv)
            if old is not None:
                self._forget_worker(old)
            return
        if old is not None and not newer(rv, old.resource_version):
            return
        if old is None and self._worker_tombstones.buried(key, rv):
            return  # the reply to our status write, read after the worker was deleted
        self._worker_tombstones.revive(key)
        view = views.worker_view(body)
        self.workers[key] = view
        caps = view.spec.capabilities if view.spec is not None else frozenset()
        offered = self._offered.setdefault(key[0], {})
        if offered.get(key) != caps:
            offered[key] = caps
            self._coverage_changed(key[0])
        self.ready.evaluate(key, spec_changed=old is None or old.spec != view.spec)
        self.publisher.check(view)
        self.poke()

    def observe_lease(self, body: Body, *, deleted: bool = False) -> None:
        view = views.lease_view(body)
        key = view.key
        if view.kind not in (protocol.LEASE_KIND_TASK, protocol.LEASE_KIND_WORKER):
            if key not in self.leases:
                return  # not one of ours (the watch selects ours; a fake may not)
            deleted = True  # our label was removed: as good as gone for us
        now = self.clock.monotonic()
        if deleted:
            old = self.leases.pop(key, None)
            self.tracker.forget(key)
            self.refused.pop(key, None)
            if old is not None:
                self._lease_touched(old, None)
            return
        old = self.leases.get(key)
        if old is not None and not newer(view.resource_version, old.resource_version):
            return
        self.leases[key] = view
        age = 0.0
        if view.kind == protocol.LEASE_KIND_WORKER and self.tracker.record(key) is None:
            # A worker Lease seen for the first time proves readiness only if its holder
            # renewed it recently by our wall clock; otherwise it is stale until it changes.
            renewed = parse_time(view.renew_time)
            duration = float(view.duration or 0)
            if renewed is None or (self.clock.now() - renewed).total_seconds() > duration:
                age = duration
        record = LeaseRecord(
            holder=view.holder,
            renew_time=view.renew_time,
            duration=float(view.duration or 0),
            token=view.token_text,
            progress=view.progress,
        )
        self.tracker.observe(key, record, now, age=age)
        self._lease_touched(old, view)

    def _lease_touched(self, old: LeaseView | None, new: LeaseView | None) -> None:
        lease = new or old
        assert lease is not None
        if lease.kind == protocol.LEASE_KIND_WORKER:
            worker = (lease.namespace, lease.subject)
            self.ready.evaluate(worker)  # and looked at again when it would go stale
            return
        task_key = (lease.namespace, lease.subject)
        task = self.tasks.get(task_key)
        if task is None:
            return
        if (
            new is not None
            and old is not None
            and task.phase is TaskPhase.RUNNING
            and task.status.grace_until is None
            and (old.holder, old.token_text, old.report) == (new.holder, new.token_text, new.report)
        ):
            # A renewal of a healthy claim: the tracker noted when it was seen; the claim's
            # timer finds the new deadline when it fires. No decision, no write -- a changed
            # progress marker is copied into status when its interval allows.
            if old.progress != new.progress:
                self.push_timer(self._progress_due(task_key), (TIMER_TASK, task_key))
            return
        self.dirty.add(task_key)
        self.poke()

    def _progress_due(self, key: Key, now: float | None = None) -> float:
        """When the claim's progress marker may next be copied into status."""
        written = self.progress_written.get(key)
        now = self.clock.monotonic() if now is None else now
        return now if written is None else max(now, written + self.config.progress_status_interval)

    # -- indexes ------------------------------------------------------------------------

    def scheduler_for(self, namespace: str) -> Scheduler:
        scheduler = self.schedulers.get(namespace)
        if scheduler is None:
            scheduler = self.schedulers[namespace] = Scheduler()
            for key, worker in self.workers.items():
                if key[0] == namespace:
                    self.ready.upsert(scheduler, worker)
        return scheduler

    def _index_task(self, old: TaskView | None, new: TaskView) -> None:
        key = new.key
        # phase counts (agentq_tasks)
        if old is None or old.phase != new.phase:
            if old is not None:
                self._count_phase(old.phase, -1)
            self._count_phase(new.phase, +1)
        # each worker's claims, and the scheduling core's load: a claim counts on its
        # worker while Assigned/Running
        was = old.status.worker if old is not None and old.active else None
        now_worker = new.status.worker if new.active else None
        if was != now_worker:
            if was is not None:
                self.claims_of.get((key[0], was), set()).discard(key[1])
            if now_worker is not None:
                self.claims_of.setdefault((key[0], now_worker), set()).add(key[1])
        if self.leading:
            scheduler = self.scheduler_for(key[0])
            holder = scheduler.holder(key[1])
            if holder is not None and holder != now_worker:
                scheduler.release(key[1], completed=new.phase is TaskPhase.SUCCEEDED)
                self.publisher.mark((key[0], holder))
            if now_worker is not None and holder != now_worker:
                if scheduler.has_worker(now_worker):
                    scheduler.restore(
                        Assignment(task=key[1], worker=now_worker, cost=new.spec.cost)
                    )
                self.publisher.mark((key[0], now_worker))
        # the pending queue and retry backoff
        if new.pending and new.problem is None:
            due = self.backoff_due(new)
            if key not in self.pending_since:
                self.pending_since[key] = self.clock.monotonic()
            ready = due is None
            self.queue.add(key, new.spec.required_capabilities, new.created, ready=ready)
            if due is not None:
                self.push_timer(due, (TIMER_BACKOFF, key))
        else:
            self.queue.remove(key)
            self._backoff.pop(key, None)
            self.pending_since.pop(key, None)
        if not new.active:
            self.grace.pop(key, None)
            self.progress_written.pop(key, None)

    def requeue(self, key: Key) -> None:
        """A pending task whose grant was not sent: back into the pending queue."""
        task = self.tasks.get(key)
        if task is not None and task.pending:
            self._index_task(task, task)
            self.poke()

    def sync_load(self, key: Key) -> None:
        """Make the core's record of ``key`` equal what its status says."""
        scheduler = self.schedulers.get(key[0])
        task = self.tasks.get(key)
        if scheduler is None:
            return
        holder = scheduler.holder(key[1])
        worker = task.status.worker if task is not None and task.active else None
        if holder == worker:
            return
        if holder is not None:
            scheduler.release(key[1], completed=False)
        if worker is not None and task is not None and scheduler.has_worker(worker):
            scheduler.restore(Assignment(task=key[1], worker=worker, cost=task.spec.cost))

    def backoff_due(self, task: TaskView) -> float | None:
        """When (monotonic) a pending task's retry backoff ends; None if it has.

        ``status.notBefore`` is wall-clock time (for people); the operator converts it
        once to its monotonic clock, at most ``retryBackoff.maxSeconds`` ahead, so a
        wall clock stepped back cannot hold a retry for longer than its backoff.
        """
        not_before = task.status.not_before
        if not_before is None:
            self._backoff.pop(task.key, None)
            return None
        stamp = not_before.isoformat()
        known = self._backoff.get(task.key)
        now = self.clock.monotonic()
        if known is None or known[0] != stamp:
            wait = (not_before - self.clock.now()).total_seconds()
            wait = max(0.0, min(wait, task.spec.retry_backoff.max_seconds))
            known = (stamp, now + wait)
            self._backoff[task.key] = known
        return known[1] if known[1] > now else None

    def _count_phase(self, phase: TaskPhase | None, delta: int) -> None:
        name = (phase or TaskPhase.PENDING).value
        self.phase_counts[name] = self.phase_counts.get(name, 0) + delta

    def _forget_task(self, view: TaskView) -> None:
        key = view.key
        self.tasks.pop(key, None)
        if view.active and view.status.worker is not None:
            self.claims_of.get((key[0], view.status.worker), set()).discard(key[1])
        self._count_phase(view.phase, -1)
        self.queue.remove(key)
        for table in (
            self.grace,
            self.progress_written,
            self.pending_since,
            self._backoff,
            self.unwritable,
        ):
            table.pop(key, None)
        self.dirty.discard(key)
        self._waiting.discard(key)
        scheduler = self.schedulers.get(key[0])
        if scheduler is not None:
            holder = scheduler.holder(key[1])
            if holder is not None:
                scheduler.release(key[1], completed=False)
                self.publisher.mark((key[0], holder))
        self.poke()

    def _forget_worker(self, view: WorkerView) -> None:
        key = view.key
        self.workers.pop(key, None)
        self._offered.get(key[0], {}).pop(key, None)
        self._coverage_changed(key[0])
        self.ready.forget(key)
        self.publisher.forget(key)
        scheduler = self.schedulers.get(key[0])
        if scheduler is not None and scheduler.has_worker(key[1]):
            for task in scheduler.remove_worker(key[1]):
                self.dirty.add((key[0], task))
        self.poke()

    # -- workers ------------------------------------------------------------------------

    def _coverage_changed(self, namespace: str) -> None:
        """The capability sets offered in ``namespace`` changed: re-judge Unschedulable."""
        queued = self.queue.sets(namespace)
        for key in [k for k in self.uncovered if k[0] == namespace and k[1] not in queued]:
            # No task waits for this set now: judged afresh when one does (``missing``),
            # not from before this change.
            del self.uncovered[key]
        for required in list(queued):
            self._recheck_coverage(namespace, required)

    def _recheck_coverage(self, namespace: str, required: frozenset[str]) -> None:
        offered = list(self._offered.get(namespace, {}).values())
        missing = claims.missing_capabilities(required, offered, namespace)
        if self.uncovered.get((namespace, required), "unknown") != missing:
            self.uncovered[(namespace, required)] = missing
            for name in self.queue.members(namespace, required):
                self.dirty.add((namespace, name))

    def missing(self, namespace: str, required: frozenset[str]) -> str | None:
        key = (namespace, required)
        if key not in self.uncovered:
            self._recheck_coverage(namespace, required)
        return self.uncovered.get(key)

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
        due = self.timers.next_due()
        soonest = self.config.reconcile_interval
        if due is not None:
            soonest = min(soonest, due - now)
        return max(0.0, soonest)

    async def _watch_the_clock(self) -> None:
        while True:
            await asyncio.sleep(self.watchdog_period)
            self._check_stall()

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
        self.tracker.credit(given)
        for grace in self.grace.values():
            grace.deadline += given
        return given

    def step(self) -> None:
        """One step: timers, dirty tasks, dispatch, worker status. Never waits on I/O."""
        started = time.perf_counter()
        self.stats.steps += 1
        self._check_stall()
        now = self.clock.monotonic()
        if now - self._last_resync >= self.config.resync_interval:
            self._resync()
        self._fire_timers(now)
        if self.synced:
            self._decide_dirty()
            self.dispatcher.dispatch()
            self.publisher.publish()
        self.publisher.gauges()
        took = time.perf_counter() - started
        self._worked += took
        metrics.RECONCILE.observe(took)

    def _resync(self) -> None:
        """The safety net: decide every task again and rebuild the cores' load from the views."""
        self._last_resync = self.clock.monotonic()
        self.dirty.update(self.tasks)
        for key, task in self.tasks.items():
            scheduler = self.scheduler_for(key[0])
            holder = scheduler.holder(key[1])
            worker = task.status.worker if task.active else None
            if holder != worker:
                if holder is not None:
                    scheduler.release(key[1], completed=False)
                if worker is not None and scheduler.has_worker(worker):
                    scheduler.restore(Assignment(task=key[1], worker=worker, cost=task.spec.cost))
        for key in self.workers:
            self.ready.evaluate(key)
            self.publisher.mark(key)

    def push_timer(self, due: float, what: tuple[str, Key]) -> None:
        """One live entry per subject: a later deadline is found when the entry fires."""
        if not self.leading:
            return  # a new leader pushes every timer again
        scheduled = self._timer_due.get(what)
        if scheduled is not None and scheduled <= due:
            return
        self._timer_due[what] = due
        self.stats.timer_entries += 1
        self.timers.push(due, what)

    def _fire_timers(self, now: float) -> None:
        for what in self.timers.pop_due(now):
            kind, key = what
            if self._timer_due.get(what) is None or self._timer_due[what] > now:
                continue  # superseded by an earlier entry that already fired
            del self._timer_due[what]
            if kind == TIMER_TASK:
                task = self.tasks.get(key)
                if task is None:
                    continue
                if not task.active:
                    # A retry after a write's unknown outcome (a requeue, an Unschedulable
                    # condition, a Lease to delete): the task has no claim to time.
                    self.dirty.add(key)
                    continue
                due = self._next_deadline(task, now)
                if due is not None and due > now:
                    self.push_timer(due, what)  # renewed since: look again then
                else:
                    self.dirty.add(key)
            elif kind == TIMER_BACKOFF:
                task = self.tasks.get(key)
                if task is not None and task.pending and task.problem is None:
                    due = self.backoff_due(task)
                    if due is not None:
                        self.push_timer(due, what)
                    else:
                        self.queue.add(
                            key, task.spec.required_capabilities, task.created, ready=True
                        )
            elif kind == TIMER_PUBLISH:
                self.publisher.timer(key, now)
            elif kind == TIMER_WORKER:
                self.ready.evaluate(key)  # renewed since: pushes the timer for the new expiry

    def _next_deadline(self, task: TaskView, now: float) -> float | None:
        """The earliest time the claim needs a decision: its Lease's expiry, the end of its
        grace period, its progress deadline, the next copy of its progress marker."""
        lease = self.leases.get(self.task_lease_key(task))
        if lease is None:
            return now
        dues = []
        expires = self.claim_expires_at(task)
        if expires is not None:
            dues.append(expires)
        grace = self.grace.get(task.key)
        if grace is not None:
            dues.append(grace.deadline)
        if lease.progress is not None:
            marker = protocol.bounded_text(lease.progress, protocol.MAX_PROGRESS_CHARS)
            if marker != task.status.progress:
                dues.append(self._progress_due(task.key, now))
        deadline = task.spec.progress_deadline_seconds
        if deadline is not None and task.phase is TaskPhase.RUNNING:
            changed = self.tracker.progress_changed_at(lease.key)
            if changed is not None:
                dues.append(changed + deadline)
        return min(dues) if dues else None

    def claim_expires_at(self, task: TaskView) -> float | None:
        return self.tracker.expires_at(
            self.task_lease_key(task), float(task.spec.lease_duration_seconds)
        )

    @staticmethod
    def task_lease_key(task: TaskView) -> Key:
        return (task.namespace, protocol.task_lease_name(task.name))

    def _watches_recovered(self) -> None:
        """The watches are current again: look at every claim (expiry was not judged)."""
        for key, task in self.tasks.items():
            if task.active:
                self.dirty.add(key)
        self.poke()

    # -- decide -------------------------------------------------------------------------

    def _seen(self, task: TaskView, lease: LeaseView | None) -> claims.Seen:
        now = self.clock.monotonic()
        changed = progress = None
        if lease is not None:
            changed = self.tracker.last_change(lease.key)
            progress = self.tracker.progress_changed_at(lease.key)
        grace = self.grace.get(task.key)
        token = task.status.fencing_token or 0
        if grace is not None and grace.token != token:
            grace = None
        if grace is None and task.status.grace_until is not None and task.active:
            # A grace period started by an earlier leader: continue it, from its end in
            # status (wall clock), at most its length ahead of us.
            left = (task.status.grace_until - self.clock.now()).total_seconds()
            left = max(0.0, min(left, float(task.spec.grace_period_seconds or 0)))
            grace = self.grace[task.key] = Grace(token, now + left)
        refused = (
            lease is not None
            and lease.report is not None
            and (self.refused.get(lease.key) == lease.report)
        )
        return claims.Seen(
            now=now,
            wall=self.clock.now(),
            rand=self.rng.random(),
            changed_at=changed,
            progress_changed_at=progress,
            judgeable=self.health.healthy,
            grace_deadline=grace.deadline if grace is not None else None,
            progress_written_at=self.progress_written.get(task.key),
            report_refused=refused,
        )

    def _decide_dirty(self) -> None:
        # Decisions in flight, not every write: the Lease deletes and Events that follow a
        # storm of reclaims wait for low-priority slots and must not hold up the decisions.
        budget = max(1, self.config.write_concurrency * 4 - len(self.busy))
        while self.dirty and budget > 0:
            key = self.dirty.pop()
            if key in self.busy:
                # Decided again when its write is done (``_done``) -- not popped again every
                # step meanwhile: with hundreds of grants in flight that was O(n) per event.
                self._waiting.add(key)
                continue
            task = self.tasks.get(key)
            if task is None:
                continue
            until = self.unwritable.get(key)
            if until is not None and self.clock.monotonic() < until:
                self.push_timer(until, (TIMER_TASK, key))  # decided again when it ends
                continue
            self.stats.decisions += 1
            lease = self.leases.get(self.task_lease_key(task))
            decision = claims.decide(task, lease, self._seen(task, lease), self.policy)
            log.debug("decided %s/%s: %s", *key, decision)
            if decision.transition is None and decision.lease is LeaseOp.KEEP and task.pending:
                pending = claims.decide_pending(
                    task,
                    self.missing(task.namespace, task.spec.required_capabilities)
                    if task.problem is None
                    else None,
                    wall=self.clock.now(),
                )
                if pending is not None:
                    decision = Decision(transition=pending, refusal=decision.refusal)
            if decision.wake_at is not None:
                self.push_timer(decision.wake_at, (TIMER_TASK, key))
            elif task.active:
                # An expiry already past was not judged (the watches are not current):
                # the recovery of the watches asks again, not a timer spinning now.
                expires = self.claim_expires_at(task)
                if expires is not None and expires > self.clock.monotonic():
                    self.push_timer(expires, (TIMER_TASK, key))
            if (
                decision.transition is None
                and decision.lease is LeaseOp.KEEP
                and not decision.refusal
            ):
                continue
            budget -= 1
            self.busy.add(key)
            self.spawn(self.committer.apply(task, lease, decision, self.credits))

    # -- commit -------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.writes.add(task)
        task.add_done_callback(self._write_done)
        return task

    def _write_done(self, task: asyncio.Task[Any]) -> None:
        self.writes.discard(task)
        if (
            not task.cancelled()
            and task.exception() is not None
            and not isinstance(task.exception(), NotLeading)
        ):
            log.error("a write failed: %r", task.exception(), exc_info=task.exception())
        self.poke()

    def may_decide(self) -> bool:
        """Leading, and the leader Lease still ours by our own monotonic clock."""
        return self.leading and self.caught_up and not self.stopping and self.lease_valid()

    def may_send(self) -> bool:
        """A decision already made may go out: we lead (or are draining before we release
        the leader Lease), and the Lease is still ours by our own monotonic clock."""
        return (self.leading or self.stopping) and self.lease_valid()

    async def call(self, method: Callable[..., Awaitable[Reply]], *args: Any) -> Reply:
        """One API call a decision waits on, within WRITE_CONCURRENCY (made once a slot
        is free, before any low-priority request).

        Leadership is checked again as the call is about to go out, not only when the
        decision was made: a decision may wait for a slot, or the process may be stopped
        between deciding and sending, for longer than the renew deadline, and by then a
        standby may lead and have decided otherwise (a worker granted twice over its
        maxInFlight). Raises ``NotLeading`` (nothing was sent) in that case."""
        async with self.sending(getattr(method, "__name__", "call")):
            return await method(*args)

    @contextlib.asynccontextmanager
    async def sending(self, what: str) -> AsyncIterator[None]:
        """A decision slot, and leadership checked once it is ours (see ``call``): for a
        caller that must act at the moment its request goes out (``confirm``)."""
        async with self.slots.high():
            if not self.may_send():
                raise NotLeading(f"{what}: not sent, not leading")
            yield

    async def write_task_status(self, task: TaskView, patch: Body) -> Reply:
        """A decision's status write: a CAS on the resourceVersion it was decided on."""
        return await self.call(
            self.kube.patch_status,
            TASK_PLURAL,
            task.namespace,
            task.name,
            task.resource_version,
            patch,
        )

    async def call_low(self, method: Callable[..., Awaitable[Reply]], *args: Any) -> Reply:
        """One API call nothing waits on: only while no decision waits for a slot."""
        async with self.slots.low():
            return await method(*args)

    def done(self, key: Key) -> None:
        """The write about ``key`` ended: decide it again if something asked meanwhile."""
        self.busy.discard(key)
        if key in self._waiting:
            self._waiting.discard(key)
            self.dirty.add(key)
            self.poke()

    def redecide_if_changed(self, task: TaskView, lease: LeaseView | None) -> None:
        """After a write: decide again if what the decision was made on has changed (else a
        lost race would be retried on the same stale state; the watch event that tells us
        what changed marks the task again)."""
        key = task.key
        now_task = self.tasks.get(key)
        now_lease = self.leases.get(self.task_lease_key(task))
        if now_task is None:
            return
        if now_task.resource_version != task.resource_version or (
            (now_lease.resource_version if now_lease else None)
            != (lease.resource_version if lease else None)
        ):
            self.dirty.add(key)
            self.poke()

    # == leadership and lifecycle ======================================================

    def set_synced(self) -> None:
        """Every watch delivered its first list: the caches are complete."""
        if not self.synced:
            self.synced = True
            self.dirty.update(self.tasks)
            self.poke()

    def set_leading(self, leading: bool) -> None:
        if leading == self.leading or (leading and self.stopping):
            return
        metrics.LEADER_TRANSITIONS.inc()
        self.leading = leading
        metrics.LEADER.set(1 if leading else 0)
        if leading:
            # A new leader starts from what the API server says (its caches), not from
            # what it decided when it last led.
            self.schedulers.clear()
            self.grace.clear()
            self.busy.clear()
            self._waiting.clear()
            self.timers.clear()
            self._timer_due.clear()
            self.tokens.reset()
            self.publisher.reset()
            self.ready.reset()
            for namespace in {key[0] for key in self.workers}:
                self.scheduler_for(namespace)  # every worker, with the claims it holds
            for key in self.workers:
                self.publisher.mark(key, urgent=True)
            self.dirty.update(self.tasks)
            for task in self.tasks.values():
                if task.pending:
                    # Back in the queue (a grant cancelled with the lead had taken it off),
                    # its backoff timer re-armed.
                    self._index_task(task, task)
            for key in self.workers:
                self.ready.evaluate(key)  # with its staleness timer
            self._last_resync = self.clock.monotonic()
            if self.catch_up is not None:
                self.caught_up = False
                self.spawn(self._catch_up())
        else:
            self.stop_deciding()
        self.poke()

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

    def stop_deciding(self) -> None:
        """Leadership lost or shutting down: cancel every write in flight, decide nothing more."""
        self.leading = False
        metrics.LEADER.set(0)
        for task in list(self.writes):
            task.cancel()
        self.dirty.clear()
        self._waiting.clear()

    async def drain(self, timeout: float) -> None:
        """Shutting down: decide nothing more, but let the writes of decisions already made
        finish (at most ``timeout``, and only while the leader Lease is still ours) before
        the caller releases leadership. Cancelling them would not unsend the ones on the
        wire: the API server could apply one after the standby, told by the release, had
        started deciding; and a grant cut between its status and its Lease is half-made."""
        self.stopping = True
        self.leading = False
        metrics.LEADER.set(0)
        self.dirty.clear()
        self._waiting.clear()
        if self.writes:
            await asyncio.wait(list(self.writes), timeout=timeout)
        self.stop_deciding()  # whatever is left

    async def settle(self, *, rounds: int = 50) -> None:
        """Run steps until nothing is left to do (tests): no dirty key, no write in flight."""
        for _ in range(rounds):
            self.step()
            if self.writes:
                await asyncio.gather(*list(self.writes), return_exceptions=True)
                continue
            await self.events.flush()
            if not self.dirty and not self.writes and not self._waiting:
                due = self.timers.next_due()
                if due is None or due > self.clock.monotonic():
                    return
        raise AssertionError(f"the controller did not settle: dirty={self.dirty}")


__all__ = ["AlwaysHealthy", "Controller", "WatchHealth"]
