"""The controller: caches fed by watch events, one loop that decides and commits.

Kueue's split, in one module of glue around pure decisions:

- **cache** -- ``observe_task`` / ``observe_worker`` / ``observe_lease`` turn each
  watch event into a typed view (``agentq.views``) and update, in O(1) (O(log n)
  for a heap), the indexes decisions need: pending tasks per namespace and
  capability set (``cache.PendingQueue``), one timer heap for every deadline
  (lease expiry, grace, backoff, progress, worker staleness), each worker's
  claims in the scheduling core, the keys that changed (``_dirty``). A renewal
  of a healthy claim only notes the time it was seen: no decision, no write.
- **decide** -- each step takes the dirty keys and the due timers, asks
  ``agentq.claims`` what to do for each, and pops the heads of the pending
  queues into the DRR core (``agentq.scheduler``) for as long as workers have
  room: work proportional to what changed, not to the fleet.
- **commit** -- a decision is applied through the narrow ``port.Kube`` with a
  compare-and-swap on the resourceVersion it was made on; a lost race (409), a
  404 or an unknown outcome (timeout) drops it, and the next event decides
  again. A write the API server will never accept (422, too large) becomes a
  visible state instead of a retry loop.
- **publish** -- worker status when it changes (readiness at once, counts at most
  every ``WORKER_STATUS_INTERVAL``, all workers within ``WORKER_STATUS_QPS``), and
  gauges kept by the indexes.

A full re-decision of every task runs every ``RESYNC_INTERVAL`` as a safety net.
Expiry is never judged from a store that may be behind: not while a watch is
down (``WatchHealth``), not in the second after the process was stopped (the
stalled time is given back to every Lease), and never without re-reading the
Lease first (``confirm_expiry``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentq import claims, lifecycle, protocol, views
from agentq.claims import Decision, LeaseOp, Readiness
from agentq.clock import Clock, micro_rfc3339, parse_time, rfc3339
from agentq.expiry import LeaseRecord, LeaseTracker
from agentq.models import MIN_WEIGHT, TASK_PLURAL, WORKER_PLURAL, TaskPhase
from agentq.operator import metrics
from agentq.operator.cache import Key, PendingQueue, Timers, Tombstones, newer
from agentq.operator.config import OperatorConfig
from agentq.operator.events import EventSink, Involved
from agentq.operator.port import Body, Kube, KubeError, Reply, Status
from agentq.operator.tokens import TokenAllocator
from agentq.scheduler import Assignment, Scheduler, TaskSpec, WorkerSpec
from agentq.views import LeaseView, TaskView, WorkerView

log = logging.getLogger("agentq.controller")

# Timer kinds: what a due entry asks to look at.
_TASK = "task"  # a task's claim (lease expiry, grace, progress deadline, progress copy)
_BACKOFF = "backoff"  # a pending task's retry backoff ends
_WORKER = "worker"  # a worker Lease may have gone stale
_PUBLISH = "publish"  # worker status deferred by its interval or the rate limit
_DIAGNOSE_SECONDS = 30.0  # least time between two reads of a worker's unlabelled Lease
_RETRY_SECONDS = 1.0  # after an unknown outcome, look again this much later
_UNWRITABLE_SECONDS = 600.0  # after a write the API server refuses for good


class WatchHealth:
    """Whether the watches are connected and current; expiry is judged only while they are."""

    def __init__(self, resources: Iterable[str] = ()) -> None:
        self._healthy = dict.fromkeys(resources, False)
        self._listeners: list[Callable[[], None]] = []

    def set(self, resource: str, healthy: bool) -> None:
        was = self.healthy
        self._healthy[resource] = healthy
        metrics.WATCH_HEALTHY.labels(resource).set(1 if healthy else 0)
        if self.healthy and not was:
            for listener in self._listeners:
                listener()

    @property
    def healthy(self) -> bool:
        return all(self._healthy.values())

    def on_healthy(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)


class AlwaysHealthy(WatchHealth):
    """For watch machinery that does not report its health (kopf)."""

    @property
    def healthy(self) -> bool:
        return True


@dataclass
class _Grace:
    token: int
    deadline: float  # monotonic


@dataclass
class _Stats:
    """Counters of the controller's own work, for tests and the benchmark."""

    steps: int = 0
    decisions: int = 0
    grants: int = 0
    confirm_reads: int = 0
    expiries_dropped: int = 0  # expiries a re-read of the Lease proved wrong
    conflicts: int = 0
    unknown: int = 0
    worker_status_writes: int = 0
    stalls: int = 0
    stalled_seconds: float = 0.0
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
        self.events = events or EventSink(kube, clock, component="agentq-operator")
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
        # The leader elector's check that our lease is still ours by our own clock.
        self.lease_valid: Callable[[], bool] = lambda: True
        self.synced = False  # every watch has delivered its first full list
        self.stats = _Stats()
        # -- caches
        self.tasks: dict[Key, TaskView] = {}
        self.workers: dict[Key, WorkerView] = {}
        self.leases: dict[Key, LeaseView] = {}
        self.tracker = LeaseTracker()
        self._tombstones = Tombstones()
        # -- indexes
        self.schedulers: dict[str, Scheduler] = {}
        self.queue = PendingQueue()
        self.timers = Timers()
        self._dirty: set[Key] = set()
        self._publish_due: dict[Key, float] = {}  # worker -> when its status may be written
        self._publish_now: set[Key] = set()  # workers whose status is due this step
        self._busy: set[Key] = set()  # tasks with a write in flight
        self._claims: dict[Key, set[str]] = {}  # worker -> the tasks it holds (from status)
        self._timer_due: dict[tuple[str, Key], float] = {}  # earliest live timer per subject
        self._offered: dict[str, dict[Key, frozenset[str]]] = {}  # ns -> worker -> capabilities
        self._missing: dict[tuple[str, frozenset[str]], str | None] = {}
        self._phase_counts: dict[str, int] = {}
        # -- per-object memory, each dropped with its object
        self._grace: dict[Key, _Grace] = {}
        self._suspect: dict[Key, float] = {}  # worker -> since (monotonic)
        self._refused: dict[Key, str] = {}  # lease key -> the report text refused
        self._progress_written: dict[Key, float] = {}
        self._pending_since: dict[Key, float] = {}
        self._backoff: dict[Key, tuple[str, float]] = {}  # task -> (notBefore, due monotonic)
        self._unwritable: dict[Key, float] = {}  # task -> until (monotonic)
        self._readiness: dict[Key, tuple[Readiness, str]] = {}
        self._unlabelled: dict[Key, tuple[bool, float]] = {}  # worker -> (found, when read)
        self._worker_written: dict[Key, float] = {}
        # -- loop
        self._changed = asyncio.Event()
        self._writes: set[asyncio.Task[Any]] = set()
        self._write_slots = asyncio.Semaphore(config.write_concurrency)
        self._grants: set[asyncio.Task[Any]] = set()  # grants in flight
        self._refilling = False
        self._status_budget = config.worker_status_qps
        self._status_budget_at = clock.monotonic()
        self._last_resync = clock.monotonic()
        self._last_tick = clock.monotonic()
        self._last_gauges = -math.inf
        self._worked = 0.0  # seconds spent in steps since the watchdog's last tick
        self._watchdog: asyncio.Task[None] | None = None
        self.watchdog_period = 0.25

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
        self._dirty.add(key)
        self.poke()

    def observe_worker(self, body: Body, *, deleted: bool = False) -> None:
        key = views.key_of(body)
        old = self.workers.get(key)
        if deleted:
            if old is not None:
                self._forget_worker(old)
            return
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if old is not None and not newer(rv, old.resource_version):
            return
        view = views.worker_view(body)
        self.workers[key] = view
        caps = view.spec.capabilities if view.spec is not None else frozenset()
        offered = self._offered.setdefault(key[0], {})
        if offered.get(key) != caps:
            offered[key] = caps
            self._coverage_changed(key[0])
        self._evaluate_worker(key, spec_changed=old is None or old.spec != view.spec)
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
            self._refused.pop(key, None)
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
            if worker in self.workers:
                self._evaluate_worker(worker)
                expires = self.tracker.expires_at(lease.key)
                if expires is not None and new is not None:
                    self._push_timer(expires, (_WORKER, worker))
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
                self._push_timer(self._progress_due(task_key), (_TASK, task_key))
            return
        self._dirty.add(task_key)
        self.poke()

    def _progress_due(self, key: Key, now: float | None = None) -> float:
        """When the claim's progress marker may next be copied into status."""
        written = self._progress_written.get(key)
        now = self.clock.monotonic() if now is None else now
        return now if written is None else max(now, written + self.config.progress_status_interval)

    # -- indexes ------------------------------------------------------------------------

    def _scheduler(self, namespace: str) -> Scheduler:
        scheduler = self.schedulers.get(namespace)
        if scheduler is None:
            scheduler = self.schedulers[namespace] = Scheduler()
            for key, worker in self.workers.items():
                if key[0] == namespace:
                    self._upsert_worker(scheduler, worker)
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
                self._claims.get((key[0], was), set()).discard(key[1])
            if now_worker is not None:
                self._claims.setdefault((key[0], now_worker), set()).add(key[1])
        if self.leading:
            scheduler = self._scheduler(key[0])
            holder = scheduler.holder(key[1])
            if holder is not None and holder != now_worker:
                scheduler.release(key[1], completed=new.phase is TaskPhase.SUCCEEDED)
                self._mark_worker((key[0], holder))
            if now_worker is not None and holder != now_worker:
                if scheduler.has_worker(now_worker):
                    scheduler.restore(
                        Assignment(task=key[1], worker=now_worker, cost=new.spec.cost)
                    )
                self._mark_worker((key[0], now_worker))
        # the pending queue and retry backoff
        if new.pending and new.problem is None:
            due = self._backoff_due(new)
            if key not in self._pending_since:
                self._pending_since[key] = self.clock.monotonic()
            ready = due is None
            self.queue.add(key, new.spec.required_capabilities, new.created, ready=ready)
            if due is not None:
                self._push_timer(due, (_BACKOFF, key))
        else:
            self.queue.remove(key)
            self._backoff.pop(key, None)
            self._pending_since.pop(key, None)
        if not new.active:
            self._grace.pop(key, None)
            self._progress_written.pop(key, None)

    def _sync_load(self, key: Key) -> None:
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

    def _backoff_due(self, task: TaskView) -> float | None:
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
        self._phase_counts[name] = self._phase_counts.get(name, 0) + delta

    def _forget_task(self, view: TaskView) -> None:
        key = view.key
        self.tasks.pop(key, None)
        if view.active and view.status.worker is not None:
            self._claims.get((key[0], view.status.worker), set()).discard(key[1])
        self._count_phase(view.phase, -1)
        self.queue.remove(key)
        for table in (
            self._grace,
            self._progress_written,
            self._pending_since,
            self._backoff,
            self._unwritable,
        ):
            table.pop(key, None)
        self._dirty.discard(key)
        scheduler = self.schedulers.get(key[0])
        if scheduler is not None:
            holder = scheduler.holder(key[1])
            if holder is not None:
                scheduler.release(key[1], completed=False)
                self._mark_worker((key[0], holder))
        self.poke()

    def _forget_worker(self, view: WorkerView) -> None:
        key = view.key
        self.workers.pop(key, None)
        self._offered.get(key[0], {}).pop(key, None)
        self._coverage_changed(key[0])
        for table in (
            self._suspect,
            self._readiness,
            self._unlabelled,
            self._worker_written,
        ):
            table.pop(key, None)
        self._publish_due.pop(key, None)
        self._publish_now.discard(key)
        scheduler = self.schedulers.get(key[0])
        if scheduler is not None and scheduler.has_worker(key[1]):
            for task in scheduler.remove_worker(key[1]):
                self._dirty.add((key[0], task))
        metrics.forget_worker(*key)
        self.poke()

    # -- workers ------------------------------------------------------------------------

    def _evaluate_worker(self, key: Key, *, spec_changed: bool = False) -> None:
        """Recompute a worker's readiness; tell the core and the publisher if it changed."""
        worker = self.workers.get(key)
        if worker is None:
            return
        now = self.clock.monotonic()
        lease_key = (key[0], protocol.worker_lease_name(key[1]))
        lease = self.leases.get(lease_key)
        fresh = lease is not None and self.tracker.fresh(lease_key, now, lease.duration or 0)
        suspect_since = self._suspect.get(key)
        if suspect_since is not None and fresh:
            changed = self.tracker.last_change(lease_key)
            if changed is not None and changed > suspect_since:
                del self._suspect[key]
                suspect_since = None
        unlabelled = self._unlabelled.get(key, (False, 0.0))[0]
        ready = claims.readiness(
            worker, lease, fresh=fresh, unlabelled=unlabelled, suspect=suspect_since is not None
        )
        if ready[0] is Readiness.LEASE_MISSING:
            self._maybe_diagnose(key)
        if self._readiness.get(key) != ready or spec_changed:
            self._readiness[key] = ready
            self._mark_worker(key, urgent=True)
            if self.leading:
                self._upsert_worker(self._scheduler(key[0]), worker)

    def _upsert_worker(self, scheduler: Scheduler, worker: WorkerView) -> None:
        if worker.spec is None:
            if scheduler.has_worker(worker.name):
                for task in scheduler.remove_worker(worker.name):
                    self._dirty.add((worker.namespace, task))
            return
        ready = self._readiness.get(worker.key, (Readiness.LEASE_MISSING, ""))[0]
        joined = not scheduler.has_worker(worker.name)
        weight = worker.spec.weight
        scheduler.upsert_worker(
            WorkerSpec(
                name=worker.name,
                capabilities=worker.spec.capabilities,
                weight=max(MIN_WEIGHT, weight) if math.isfinite(weight) else 1.0,
                max_in_flight=worker.spec.max_in_flight,
                paused=worker.spec.paused,
                # Paused workers keep their readiness (Draining); the core reads paused.
                ready=ready in (Readiness.READY, Readiness.PAUSED),
            )
        )
        if joined:
            served = worker.status.served_cost
            if served is not None and math.isfinite(served) and served >= 0:
                scheduler.carry_over_served(worker.name, served)
            # Claims the worker already holds (read back from the task statuses).
            for name in self._claims.get(worker.key, ()):
                held = self.tasks.get((worker.namespace, name))
                if held is not None and held.active:
                    scheduler.restore(
                        Assignment(task=name, worker=worker.name, cost=held.spec.cost)
                    )

    def _maybe_diagnose(self, key: Key) -> None:
        """The watch selects worker Leases by label, so a Lease without it is invisible:
        read it directly (at most every 30 s per worker) to say so in the condition."""
        found, when = self._unlabelled.get(key, (False, -math.inf))
        now = self.clock.monotonic()
        if now - when < _DIAGNOSE_SECONDS or not self.leading:
            return
        self._unlabelled[key] = (found, now)
        # Looked at again after the interval even if no event comes (the read may fail).
        self._push_timer(now + _DIAGNOSE_SECONDS, (_WORKER, key))
        self._spawn(self._diagnose(key))

    async def _diagnose(self, key: Key) -> None:
        try:
            reply = await self._call(
                self.kube.get_lease, key[0], protocol.worker_lease_name(key[1])
            )
        except KubeError as err:
            log.info("could not read the Lease of worker %s/%s: %s", *key, err)
            return
        found = reply.ok and reply.body is not None
        if found and reply.body is not None:
            labels = (reply.body.get("metadata") or {}).get("labels") or {}
            found = labels.get(protocol.LABEL_LEASE_KIND) != protocol.LEASE_KIND_WORKER
        self._unlabelled[key] = (found, self.clock.monotonic())
        log.info(
            "worker %s/%s: Lease %s %s",
            *key,
            protocol.worker_lease_name(key[1]),
            "exists without our label" if found else "is missing",
        )
        self._evaluate_worker(key)
        self.poke()

    def _coverage_changed(self, namespace: str) -> None:
        """The capability sets offered in ``namespace`` changed: re-judge Unschedulable."""
        for required in list(self.queue.sets(namespace)):
            self._recheck_coverage(namespace, required)

    def _recheck_coverage(self, namespace: str, required: frozenset[str]) -> None:
        offered = list(self._offered.get(namespace, {}).values())
        missing = claims.missing_capabilities(required, offered, namespace)
        if self._missing.get((namespace, required), "unknown") != missing:
            self._missing[(namespace, required)] = missing
            for name in self.queue.members(namespace, required):
                self._dirty.add((namespace, name))

    def missing(self, namespace: str, required: frozenset[str]) -> str | None:
        key = (namespace, required)
        if key not in self._missing:
            self._recheck_coverage(namespace, required)
        return self._missing.get(key)

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
                if not self.leading or not self.lease_valid():
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
        self.tracker.credit(seconds)
        for grace in self._grace.values():
            grace.deadline += seconds

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
            self._dispatch()
            self._publish_workers()
        self._gauges()
        took = time.perf_counter() - started
        self._worked += took
        metrics.RECONCILE.observe(took)

    def _resync(self) -> None:
        """The safety net: decide every task again and rebuild the cores' load from the views."""
        self._last_resync = self.clock.monotonic()
        self._dirty.update(self.tasks)
        for key, task in self.tasks.items():
            scheduler = self._scheduler(key[0])
            holder = scheduler.holder(key[1])
            worker = task.status.worker if task.active else None
            if holder != worker:
                if holder is not None:
                    scheduler.release(key[1], completed=False)
                if worker is not None and scheduler.has_worker(worker):
                    scheduler.restore(Assignment(task=key[1], worker=worker, cost=task.spec.cost))
        for key in self.workers:
            self._evaluate_worker(key)
            self._mark_worker(key)

    def _push_timer(self, due: float, what: tuple[str, Key]) -> None:
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
            if kind == _TASK:
                task = self.tasks.get(key)
                if task is None or not task.active:
                    continue
                due = self._next_deadline(task, now)
                if due is not None and due > now:
                    self._push_timer(due, what)  # renewed since: look again then
                else:
                    self._dirty.add(key)
            elif kind == _BACKOFF:
                task = self.tasks.get(key)
                if task is not None and task.pending and task.problem is None:
                    due = self._backoff_due(task)
                    if due is not None:
                        self._push_timer(due, what)
                    else:
                        self.queue.add(
                            key, task.spec.required_capabilities, task.created, ready=True
                        )
            elif kind == _PUBLISH:
                due = self._publish_due.get(key)
                if due is not None and due <= now:
                    self._publish_now.add(key)
            elif kind == _WORKER:
                self._evaluate_worker(key)
                lease_key = (key[0], protocol.worker_lease_name(key[1]))
                lease = self.leases.get(lease_key)
                expires = self.tracker.expires_at(lease_key)
                if lease is not None and expires is not None and expires > now:
                    self._push_timer(expires, what)

    def _next_deadline(self, task: TaskView, now: float) -> float | None:
        """The earliest time the claim needs a decision: its Lease's expiry, the end of its
        grace period, its progress deadline, the next copy of its progress marker."""
        lease = self.leases.get(self._task_lease_key(task))
        if lease is None:
            return now
        dues = []
        expires = self._claim_expires_at(task)
        if expires is not None:
            dues.append(expires)
        grace = self._grace.get(task.key)
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

    def _claim_expires_at(self, task: TaskView) -> float | None:
        return self.tracker.expires_at(
            self._task_lease_key(task), float(task.spec.lease_duration_seconds)
        )

    @staticmethod
    def _task_lease_key(task: TaskView) -> Key:
        return (task.namespace, protocol.task_lease_name(task.name))

    def _watches_recovered(self) -> None:
        """The watches are current again: look at every claim (expiry was not judged)."""
        for key, task in self.tasks.items():
            if task.active:
                self._dirty.add(key)
        self.poke()

    # -- decide -------------------------------------------------------------------------

    def _seen(self, task: TaskView, lease: LeaseView | None) -> claims.Seen:
        now = self.clock.monotonic()
        changed = progress = None
        if lease is not None:
            changed = self.tracker.last_change(lease.key)
            progress = self.tracker.progress_changed_at(lease.key)
        grace = self._grace.get(task.key)
        token = task.status.fencing_token or 0
        if grace is not None and grace.token != token:
            grace = None
        if grace is None and task.status.grace_until is not None and task.active:
            # A grace period started by an earlier leader: continue it, from its end in
            # status (wall clock), at most its length ahead of us.
            left = (task.status.grace_until - self.clock.now()).total_seconds()
            left = max(0.0, min(left, float(task.spec.grace_period_seconds or 0)))
            grace = self._grace[task.key] = _Grace(token, now + left)
        refused = (
            lease is not None
            and lease.report is not None
            and (self._refused.get(lease.key) == lease.report)
        )
        return claims.Seen(
            now=now,
            wall=self.clock.now(),
            rand=self.rng.random(),
            changed_at=changed,
            progress_changed_at=progress,
            judgeable=self.health.healthy,
            grace_deadline=grace.deadline if grace is not None else None,
            progress_written_at=self._progress_written.get(task.key),
            report_refused=refused,
        )

    def _decide_dirty(self) -> None:
        budget = max(1, self.config.write_concurrency * 4 - len(self._writes))
        deferred: list[Key] = []
        while self._dirty and budget > 0:
            key = self._dirty.pop()
            if key in self._busy:
                deferred.append(key)  # decided again when its write is done
                continue
            task = self.tasks.get(key)
            if task is None:
                continue
            until = self._unwritable.get(key)
            if until is not None and self.clock.monotonic() < until:
                continue
            self.stats.decisions += 1
            lease = self.leases.get(self._task_lease_key(task))
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
                self._push_timer(decision.wake_at, (_TASK, key))
            elif task.active:
                # An expiry already past was not judged (the watches are not current):
                # the recovery of the watches asks again, not a timer spinning now.
                expires = self._claim_expires_at(task)
                if expires is not None and expires > self.clock.monotonic():
                    self._push_timer(expires, (_TASK, key))
            if (
                decision.transition is None
                and decision.lease is LeaseOp.KEEP
                and not decision.refusal
            ):
                continue
            budget -= 1
            self._busy.add(key)
            self._spawn(self._apply(task, lease, decision))
        self._dirty.update(deferred)

    # -- commit -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._writes.add(task)
        task.add_done_callback(self._write_done)
        return task

    def _write_done(self, task: asyncio.Task[Any]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a write failed: %r", task.exception(), exc_info=task.exception())
        self.poke()

    async def _call(self, method: Callable[..., Awaitable[Reply]], *args: Any) -> Reply:
        """One API call, within WRITE_CONCURRENCY (the call is made once a slot is free)."""
        async with self._write_slots:
            return await method(*args)

    async def _apply(self, task: TaskView, lease: LeaseView | None, decision: Decision) -> None:
        key = task.key
        try:
            await self._apply_decision(task, lease, decision)
        except KubeError as err:
            self.stats.unknown += 1
            log.warning("write for %s/%s had an unknown outcome: %s", *key, err)
            self._push_timer(self.clock.monotonic() + _RETRY_SECONDS, (_TASK, key))
        finally:
            self._busy.discard(key)
            self._redecide_if_changed(task, lease)

    def _redecide_if_changed(self, task: TaskView, lease: LeaseView | None) -> None:
        """After a write: decide again if what the decision was made on has changed (else a
        lost race would be retried on the same stale state; the watch event that tells us
        what changed marks the task again)."""
        key = task.key
        now_task = self.tasks.get(key)
        now_lease = self.leases.get(self._task_lease_key(task))
        if now_task is None:
            return
        if now_task.resource_version != task.resource_version or (
            (now_lease.resource_version if now_lease else None)
            != (lease.resource_version if lease else None)
        ):
            self._dirty.add(key)
            self.poke()

    async def _apply_decision(
        self, task: TaskView, lease: LeaseView | None, decision: Decision
    ) -> None:
        key = task.key
        transition = decision.transition
        refusal = decision.refusal
        if refusal is not None and (lease is None or lease.report is None):
            refusal = None
        if refusal is not None:
            counted = lifecycle.refused(task.status)
            transition = counted if transition is None else transition.then(counted)
        if decision.confirm_expiry and lease is not None:
            # A stalled watch looks exactly like a dead holder: read the Lease itself.
            self.stats.confirm_reads += 1
            current = await self._call(self.kube.get_lease, lease.namespace, lease.name)
            if current.ok and current.body is not None:
                if current.body["metadata"].get("resourceVersion") != lease.resource_version:
                    self.stats.expiries_dropped += 1
                    log.info("lease %s/%s changed after all; not expired", *lease.key)
                    self.observe_lease(current.body)
                    return
            elif current.status is Status.GONE:
                self.observe_lease(_gone(lease), deleted=True)
                return
        if transition is not None:
            committed = await self._commit(task, transition, decision)
            if not committed:
                return
            if refusal is not None and lease is not None:
                self._refuse(task, lease, refusal)
        if decision.lease is LeaseOp.DELETE and lease is not None:
            reply = await self._call(
                self.kube.delete_lease, lease.namespace, lease.name, lease.resource_version
            )
            if reply.ok or reply.status is Status.GONE:
                self.observe_lease(_gone(lease), deleted=True)
        elif decision.lease is LeaseOp.WRITE_GRANT:
            granted = self.tasks.get(key)
            if granted is not None and granted.active:
                await self._write_grant(granted, self.leases.get(self._task_lease_key(granted)))

    def _refuse(self, task: TaskView, lease: LeaseView, refusal: claims.Refusal) -> None:
        self._refused[lease.key] = lease.report or ""
        if refusal.stale:
            metrics.STALE_REPORTS.inc()
        else:
            metrics.UNPROCESSABLE.labels("Report", "Unreadable").inc()
        self.events.record(
            _involved(task), reason=refusal.reason, message=refusal.message, warning=True
        )
        log.warning("refused a report on %s/%s: %s", task.namespace, task.name, refusal.message)

    async def _commit(
        self, task: TaskView, transition: lifecycle.Transition, decision: Decision
    ) -> bool:
        """Write ``transition`` with a CAS on the task; record its events and metrics."""
        key = task.key
        reply = await self._call(
            self.kube.patch_status,
            TASK_PLURAL,
            task.namespace,
            task.name,
            task.resource_version,
            transition.patch,
        )
        if reply.status is Status.INVALID:
            await self._refused_for_good(task, transition, reply.message)
            return False
        if not reply.ok or reply.body is None:
            self.stats.conflicts += 1
            metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
            log.info("%s of %s/%s lost a race; will re-decide", transition.reason or "update", *key)
            return False
        self.observe_task(reply.body)
        updated = self.tasks.get(key, task)
        now = self.clock.monotonic()
        if "progress" in transition.patch:
            self._progress_written[key] = now
        if decision.grace_deadline is not None:
            self._grace[key] = _Grace(task.status.fencing_token or 0, decision.grace_deadline)
            self._push_timer(decision.grace_deadline, (_TASK, key))
        if decision.suspect is not None:
            self._suspect.setdefault((task.namespace, decision.suspect), now)
            self._evaluate_worker((task.namespace, decision.suspect))
        if decision.completion is not None:
            metrics.COMPLETIONS.labels(decision.completion).inc()
        if decision.unprocessable is not None:
            metrics.UNPROCESSABLE.labels(*decision.unprocessable).inc()
        self._record(updated, transition)
        return True

    async def _refused_for_good(
        self, task: TaskView, transition: lifecycle.Transition, message: str
    ) -> None:
        """The API server will never take this write (422 / too large). Fail the attempt
        (or the task) saying why, with a smaller write; if even that is refused, say so
        in an Event and stop trying for a while -- never a retry every pass."""
        key = task.key
        log.error("status write of %s/%s refused: %s", *key, message)
        metrics.UNPROCESSABLE.labels("AgentTask", "StatusRefused").inc()
        fallback: lifecycle.Transition | None = None
        now = self.clock.now()
        if transition.phase is not TaskPhase.FAILED or "error" not in transition.patch:
            fallback = lifecycle.unprocessable(
                task.status,
                reason="StatusRefused",
                message=f"the API server refused the task's status: {message}",
                now=now,
            )
        if fallback is not None:
            reply = await self._call(
                self.kube.patch_status,
                TASK_PLURAL,
                task.namespace,
                task.name,
                task.resource_version,
                fallback.patch,
            )
            if reply.ok and reply.body is not None:
                self.observe_task(reply.body)
                self._record(self.tasks.get(key, task), fallback)
                return
            if reply.status is not Status.INVALID:
                return  # a race: decide again
        self._unwritable[key] = self.clock.monotonic() + _UNWRITABLE_SECONDS
        self.events.record(
            _involved(task),
            reason="Unprocessable",
            message=f"the API server refuses every status write of this task: {message}",
            warning=True,
        )

    def _record(self, task: TaskView, transition: lifecycle.Transition) -> None:
        involved = _involved(task)
        for reason, message, warning in transition.extra_events:
            self.events.record(involved, reason=reason, message=message, warning=warning)
        if transition.reason:
            self.events.record(
                involved,
                reason=transition.reason,
                message=transition.message,
                warning=transition.warning,
            )
            log.info(
                "%s/%s %s: %s", task.namespace, task.name, transition.reason, transition.message
            )
        phase = transition.phase
        if transition.reason in ("Reclaimed", "DeadLettered"):
            reason = str((transition.patch.get("error") or {}).get("reason") or "Unknown")
            metrics.RECLAIMS.labels(reason).inc()
        if phase is TaskPhase.DEAD_LETTERED:
            metrics.DEAD_LETTERS.labels(task.namespace).inc()
        if phase is TaskPhase.HELD:
            metrics.HELD.inc()

    def _grant_lease_body(self, task: TaskView) -> Body:
        status = task.status
        now = micro_rfc3339(self.clock.now())
        worker = str(status.worker)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": protocol.task_lease_name(task.name),
                "namespace": task.namespace,
                "labels": {
                    protocol.LABEL_LEASE_KIND: protocol.LEASE_KIND_TASK,
                    protocol.LABEL_TASK: protocol.label_value(task.name),
                    protocol.LABEL_WORKER: protocol.label_value(worker),
                },
                "annotations": {
                    protocol.ANNOTATION_TOKEN: str(status.fencing_token),
                    protocol.ANNOTATION_ATTEMPT: str(status.attempt or 1),
                    protocol.ANNOTATION_TASK_UID: task.uid,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "agentq.dev/v1alpha1",
                        "kind": "AgentTask",
                        "name": task.name,
                        "uid": task.uid,
                        "controller": True,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": {
                "holderIdentity": worker,
                "leaseDurationSeconds": task.spec.lease_duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": max(0, (status.attempt or 1) - 1),
            },
        }

    async def _write_grant(self, task: TaskView, lease: LeaseView | None) -> None:
        """Create the grant's Lease, or raise an older one to it -- never lower a token.

        A Lease of another task of this name (deleted and re-created) is replaced; one
        that already carries this token or a higher one is left for ``decide`` to judge.
        """
        body = self._grant_lease_body(task)
        name = body["metadata"]["name"]
        token = task.status.fencing_token or 0
        for _ in range(4):
            if lease is None:
                body["metadata"].pop("resourceVersion", None)  # a create carries none
                reply = await self._call(self.kube.create_lease, task.namespace, body)
                if reply.status is Status.CONFLICT:
                    got = await self._call(self.kube.get_lease, task.namespace, name)
                    if got.ok and got.body is not None:
                        self.observe_lease(got.body)
                        lease = views.lease_view(got.body)
                    continue
            else:
                foreign = claims.lease_foreign(task, lease)
                if not foreign and lease.token is not None and lease.token >= token:
                    return
                body["metadata"]["resourceVersion"] = lease.resource_version
                reply = await self._call(self.kube.replace_lease, task.namespace, name, body)
                if reply.status in (Status.CONFLICT, Status.GONE):
                    lease = None
                    continue
            if reply.ok and reply.body is not None:
                self.observe_lease(reply.body)
            elif reply.status is Status.INVALID:
                log.error(
                    "grant Lease of %s/%s refused: %s", task.namespace, task.name, reply.message
                )
            return

    # -- dispatch -----------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Pop the oldest dispatchable heads into the DRR core while workers have room."""
        budget = self.config.dispatch_batch - len(self._grants)
        if budget <= 0:
            return
        for namespace in self.queue.namespaces():
            scheduler = self.schedulers.get(namespace)
            if scheduler is None:
                continue
            blocked: set[frozenset[str]] = set()
            while budget > 0:
                best: tuple[str, str, frozenset[str]] | None = None
                for required in self.queue.sets(namespace):
                    if required in blocked:
                        continue
                    head = self.queue.head(namespace, required)
                    if head is not None and (best is None or head < best[:2]):
                        best = (head[0], head[1], required)
                if best is None:
                    break
                _, name, required = best
                key = (namespace, name)
                task = self.tasks.get(key)
                if key in self._busy:
                    # A write about it is in flight (its reclaim, say): it stays at the head
                    # and the set waits for the next step.
                    blocked.add(required)
                    continue
                if (
                    task is None
                    or not task.pending
                    or task.problem is not None
                    or self._backoff_due(task) is not None  # its timer queues it again
                ):
                    self.queue.pop(namespace, required)
                    continue
                token = self.tokens.take(task.status.fencing_token or 0)
                if token is None:
                    self._refill_tokens()
                    return
                planned = scheduler.plan(
                    [TaskSpec(name=name, required=required, cost=task.spec.cost)]
                )
                if not planned:
                    blocked.add(required)  # no worker can take this set now: skip it whole
                    continue
                self.queue.pop(namespace, required)
                budget -= 1
                self._busy.add(key)
                self._mark_worker((namespace, planned[0].worker))
                grant = self._spawn(self._grant(scheduler, task, planned[0], token))
                # Counted until done, even if cancelled before it ran (leadership lost).
                self._grants.add(grant)
                grant.add_done_callback(self._grants.discard)

    def _refill_tokens(self) -> None:
        if self._refilling:
            return
        self._refilling = True

        async def refill() -> None:
            try:
                await self.tokens.refill()
            except KubeError as err:
                log.warning("could not reserve fencing tokens: %s", err)
                await asyncio.sleep(_RETRY_SECONDS)
            finally:
                self._refilling = False

        self._spawn(refill())

    async def _grant(
        self, scheduler: Scheduler, task: TaskView, assignment: Assignment, token: int
    ) -> None:
        key = task.key
        committed = False
        try:
            transition = lifecycle.grant(
                task.status,
                worker=assignment.worker,
                lease_name=protocol.task_lease_name(task.name),
                token=token,
                now=self.clock.now(),
            )
            reply = await self._call(
                self.kube.patch_status,
                TASK_PLURAL,
                task.namespace,
                task.name,
                task.resource_version,
                transition.patch,
            )
            if reply.status is Status.INVALID:
                scheduler.abort(assignment)
                await self._refused_for_good(task, transition, reply.message)
                return
            if not reply.ok or reply.body is None:
                scheduler.abort(assignment)
                self.stats.conflicts += 1
                metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
                return
            committed = True
            self.observe_task(reply.body)
            updated = self.tasks.get(key)
            if updated is None:
                return  # deleted meanwhile: no Lease for it
            await self._write_grant(updated, self.leases.get(self._task_lease_key(updated)))
            self.stats.grants += 1
            self._record(updated, transition)
            metrics.DISPATCHES.labels(task.namespace).inc()
            since = self._pending_since.pop(key, None)
            if since is not None:
                metrics.DISPATCH_LATENCY.observe(self.clock.monotonic() - since)
        except KubeError as err:
            if not committed:
                scheduler.abort(assignment)
                # Unknown outcome: if the grant was written, the watch may have shown it
                # already (and will, if not): the core's load follows the task's status.
                self._sync_load(key)
            self.stats.unknown += 1
            log.warning("grant of %s/%s had an unknown outcome: %s", *key, err)
            self._push_timer(self.clock.monotonic() + _RETRY_SECONDS, (_TASK, key))
        finally:
            self._busy.discard(key)
            self._redecide_if_changed(task, None)

    # -- publish ------------------------------------------------------------------------

    def _mark_worker(self, key: Key, *, urgent: bool = False) -> None:
        """The worker's status may have changed: publish it when its interval allows
        (``urgent``: a change of readiness or phase, at once)."""
        now = self.clock.monotonic()
        written = self._worker_written.get(key)
        due = now if urgent or written is None else written + self.config.worker_status_interval
        current = self._publish_due.get(key)
        if current is not None and current <= due:
            return
        self._publish_due[key] = due
        if due <= now:
            self._publish_now.add(key)
            self.poke()
        else:
            self._push_timer(due, (_PUBLISH, key))

    def _publish_workers(self) -> None:
        """Write the status of the workers whose status is due and changed.

        A change of phase or of the Ready condition is due at once; a change of the
        counts (in flight, served) at most every WORKER_STATUS_INTERVAL per worker; the
        deficit alone (it moves with every dispatch anywhere) never causes a write. All
        workers together stay within WORKER_STATUS_QPS. Only due workers are looked at.
        """
        now = self.clock.monotonic()
        qps = self.config.worker_status_qps
        self._status_budget = min(qps, self._status_budget + (now - self._status_budget_at) * qps)
        self._status_budget_at = now
        if not self._publish_now:
            return
        stamp = rfc3339(self.clock.now())
        while self._publish_now:
            if self._status_budget < 1:
                # Over the rate: the rest waits for the budget to refill.
                for key in self._publish_now:
                    self._push_timer(now + 1 / qps, (_PUBLISH, key))
                return
            key = self._publish_now.pop()
            self._publish_due.pop(key, None)
            worker = self.workers.get(key)
            scheduler = self.schedulers.get(key[0])
            if worker is None or scheduler is None or not scheduler.has_worker(key[1]):
                continue
            state = scheduler.worker_state(key[1])
            ready = self._readiness.get(key, (Readiness.LEASE_MISSING, "no Lease seen yet"))
            status = claims.worker_status(
                worker,
                ready,
                in_flight=state.in_flight,
                in_flight_cost=state.in_flight_cost,
                served_cost=state.served_cost,
                deficit=state.deficit,
                tasks=state.tasks,
                stamp=stamp,
            )
            metrics.WORKER_DEFICIT.labels(*key).set(float(status["deficit"]))  # type: ignore[arg-type]
            metrics.WORKER_IN_FLIGHT.labels(*key).set(state.in_flight)
            metrics.WORKER_READY.labels(*key).set(1 if ready[0] is Readiness.READY else 0)
            same_ready = _ready_condition(worker) == (ready[0].value, ready[1])
            counts = {k: v for k, v in status.items() if k not in ("deficit", "conditions")}
            if same_ready and claims.same_worker_status(worker.status, counts):
                continue
            self._status_budget -= 1
            self._worker_written[key] = now
            self.stats.worker_status_writes += 1
            self._spawn(self._write_worker_status(worker, status))

    async def _write_worker_status(self, worker: WorkerView, status: dict[str, Any]) -> None:
        # Worker status is a report, not a decision: no precondition, last write wins.
        reply = await self._call(
            self.kube.patch_status, WORKER_PLURAL, worker.namespace, worker.name, None, status
        )
        if reply.ok and reply.body is not None:
            self.observe_worker(reply.body)
        elif reply.status is Status.INVALID:
            metrics.UNPROCESSABLE.labels("AgentWorker", "StatusRefused").inc()
            log.error(
                "status of worker %s/%s refused: %s", worker.namespace, worker.name, reply.message
            )

    def _gauges(self) -> None:
        """The gauges kept by the indexes, refreshed at most once a second."""
        now = self.clock.monotonic()
        if now - self._last_gauges < 1.0:
            return
        self._last_gauges = now
        for phase, count in self._phase_counts.items():
            metrics.TASKS_BY_PHASE.labels(phase).set(count)
        metrics.PENDING.clear()
        metrics.UNSCHEDULABLE.clear()
        metrics.OLDEST_PENDING.clear()
        pending: dict[str, int] = {}
        for namespace in self.queue.namespaces():
            unschedulable = 0
            for required, entry in self.queue.sets(namespace).items():
                label = ",".join(sorted(required)) or "-"
                pending[label] = pending.get(label, 0) + len(entry.members)
                if self._missing.get((namespace, required)):
                    unschedulable += len(entry.members)
                head = self.queue.head(namespace, required)
                if head is not None:
                    since = self._pending_since.get((namespace, head[1]))
                    if since is not None:
                        metrics.OLDEST_PENDING.labels(namespace, label).set(now - since)
            metrics.UNSCHEDULABLE.labels(namespace).set(unschedulable)
        for label, count in pending.items():
            metrics.PENDING.labels(label).set(count)

    # == leadership and lifecycle ======================================================

    def set_synced(self) -> None:
        """Every watch delivered its first list: the caches are complete."""
        if not self.synced:
            self.synced = True
            self._dirty.update(self.tasks)
            self.poke()

    def set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        metrics.LEADER_TRANSITIONS.inc()
        self.leading = leading
        metrics.LEADER.set(1 if leading else 0)
        if leading:
            # A new leader starts from what the API server says (its caches), not from
            # what it decided when it last led.
            self.schedulers.clear()
            self._grace.clear()
            self._busy.clear()
            self.timers.clear()
            self._timer_due.clear()
            self.tokens.reset()
            for namespace in {key[0] for key in self.workers}:
                self._scheduler(namespace)  # every worker, with the claims it holds
            for key in self.workers:
                self._mark_worker(key, urgent=True)
            self._dirty.update(self.tasks)
            for task in self.tasks.values():
                if task.pending and task.status.not_before is not None:
                    self._index_task(task, task)  # re-arm its backoff timer
            for key in self.workers:
                self._evaluate_worker(key)
                lease_key = (key[0], protocol.worker_lease_name(key[1]))
                expires = self.tracker.expires_at(lease_key)
                if expires is not None:
                    self._push_timer(expires, (_WORKER, key))
            self._last_resync = self.clock.monotonic()
        else:
            self.stop_deciding()
        self.poke()

    def stop_deciding(self) -> None:
        """Leadership lost or shutting down: cancel every write in flight, decide nothing more."""
        self.leading = False
        metrics.LEADER.set(0)
        for task in list(self._writes):
            task.cancel()
        self._dirty.clear()

    async def settle(self, *, rounds: int = 50) -> None:
        """Run steps until nothing is left to do (tests): no dirty key, no write in flight."""
        for _ in range(rounds):
            self.step()
            if self._writes:
                await asyncio.gather(*list(self._writes), return_exceptions=True)
                continue
            await self.events.flush()
            if not self._dirty and not self._writes:
                due = self.timers.next_due()
                if due is None or due > self.clock.monotonic():
                    return
        raise AssertionError(f"the controller did not settle: dirty={self._dirty}")


def _gone(lease: LeaseView) -> Body:
    return {
        "metadata": {
            "namespace": lease.namespace,
            "name": lease.name,
            "resourceVersion": lease.resource_version,
        }
    }


def _involved(task: TaskView) -> Involved:
    return Involved(
        kind="AgentTask",
        namespace=task.namespace,
        name=task.name,
        uid=task.uid,
        resource_version=task.resource_version,
    )


def _ready_condition(worker: WorkerView) -> tuple[str, str] | None:
    for c in worker.status.conditions or []:
        if c.type == "Ready":
            return c.reason, c.message
    return None


__all__ = ["AlwaysHealthy", "Controller", "WatchHealth"]
